package jobmanager

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// The job manager's Prometheus metrics (docs/metrics.md), in a registry of
// its own, served on GET /metrics: per running job the checkpoint metrics
// of Flink's job manager, named as Flink names them (weir_job_ + Flink's
// camelCase) and labelled job_id, read from the job's checkpoint
// statistics at each scrape; the cluster's task managers and slots; and
// the Go runtime's and the process's metrics.

// jmCollector reads the job manager's state at each scrape.
type jmCollector struct {
	s *Server

	lastDuration, lastSize, lastFullSize, completed, failed, inProgress, restarts *prometheus.Desc
	deleted                                                                       *prometheus.Desc
	taskManagers, slotsTotal, slotsAvailable, runningJobs                         *prometheus.Desc
}

func newJMCollector(s *Server) *jmCollector {
	job := []string{"job_id"}
	return &jmCollector{s: s,
		lastDuration:   prometheus.NewDesc("weir_job_lastCheckpointDuration", "Milliseconds from trigger to completion of the job's last completed checkpoint (Flink's lastCheckpointDuration).", job, nil),
		lastSize:       prometheus.NewDesc("weir_job_lastCheckpointSize", "State bytes the job's last completed checkpoint added: inline, or written to checkpoint storage for it; less than lastCheckpointFullSize for incremental checkpoints (Flink's lastCheckpointSize).", job, nil),
		lastFullSize:   prometheus.NewDesc("weir_job_lastCheckpointFullSize", "State bytes of the job's last completed checkpoint, inline and referenced in checkpoint storage (Flink's lastCheckpointFullSize).", job, nil),
		deleted:        prometheus.NewDesc("weir_job_checkpointStorageObjectsDeleted", "Objects the job manager deleted from checkpoint storage for the job (subsumed, failed or orphaned) since it started the job.", job, nil),
		completed:      prometheus.NewDesc("weir_job_numberOfCompletedCheckpoints", "Checkpoints of the job completed since this job manager started it.", job, nil),
		failed:         prometheus.NewDesc("weir_job_numberOfFailedCheckpoints", "Checkpoints of the job that failed (aborted, or in progress when an attempt ended) since this job manager started it.", job, nil),
		inProgress:     prometheus.NewDesc("weir_job_numberOfInProgressCheckpoints", "Checkpoints of the job triggered and not yet completed or failed.", job, nil),
		restarts:       prometheus.NewDesc("weir_job_numRestarts", "Restarts of the job since it was submitted.", job, nil),
		taskManagers:   prometheus.NewDesc("weir_jobmanager_numRegisteredTaskManagers", "Task managers registered with the job manager.", nil, nil),
		slotsTotal:     prometheus.NewDesc("weir_jobmanager_taskSlotsTotal", "Slots the registered task managers offer.", nil, nil),
		slotsAvailable: prometheus.NewDesc("weir_jobmanager_taskSlotsAvailable", "Slots no job occupies.", nil, nil),
		runningJobs:    prometheus.NewDesc("weir_jobmanager_numRunningJobs", "Jobs whose job master runs on this job manager (running or restarting).", nil, nil),
	}
}

func (c *jmCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lastDuration, c.lastSize, c.lastFullSize, c.deleted, c.completed, c.failed, c.inProgress, c.restarts,
		c.taskManagers, c.slotsTotal, c.slotsAvailable, c.runningJobs} {
		ch <- d
	}
}

func (c *jmCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	c.s.jobs.mu.Lock()
	running := make([]*runningJob, 0, len(c.s.jobs.running))
	for _, rj := range c.s.jobs.running {
		running = append(running, rj)
	}
	c.s.jobs.mu.Unlock()
	for _, rj := range running {
		rec, _ := rj.record()
		snap := rj.stats.snapshot()
		var dur, size, full float64
		if l := snap.LastCompleted; l != nil {
			dur, size, full = float64(l.Ended.Sub(l.Triggered).Milliseconds()), float64(l.Uploaded), float64(l.Size)
		}
		gauge(c.lastDuration, dur, rec.ID)
		gauge(c.lastSize, size, rec.ID)
		gauge(c.lastFullSize, full, rec.ID)
		ch <- prometheus.MustNewConstMetric(c.deleted, prometheus.CounterValue, float64(snap.Deleted), rec.ID)
		gauge(c.completed, float64(snap.Completed), rec.ID)
		gauge(c.failed, float64(snap.Failed), rec.ID)
		gauge(c.inProgress, float64(snap.InProgress), rec.ID)
		gauge(c.restarts, float64(rec.Restarts), rec.ID)
	}
	var total, free int
	tms := c.s.TaskManagers()
	for _, t := range tms {
		total, free = total+t.Slots, free+t.Slots-t.UsedSlots
	}
	gauge(c.taskManagers, float64(len(tms)))
	gauge(c.slotsTotal, float64(total))
	gauge(c.slotsAvailable, float64(free))
	gauge(c.runningJobs, float64(len(running)))
}

// newRegistry is the job manager's metrics registry.
func newRegistry(s *Server) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newJMCollector(s), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
