package taskmanager

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirstream/weir/runtime"
)

// The task manager's Prometheus metrics (docs/metrics.md): every task's
// records in and out and back-pressured time (runtime.TaskStats), and the
// metrics its operators registered (runtime.OperatorMetric), read from the
// current session's deployments at each scrape. A job restarted on this
// task manager shows its newest attempt only; the counters start again at
// 0 with each attempt (Prometheus' rate() handles the reset).

// Metrics registers the task manager's metrics with r while Run runs (the
// caller serves r, e.g. promhttp.HandlerFor on a registry of its own).
func Metrics(r prometheus.Registerer) Opt { return optFunc(func(c *cfg) { c.metrics = r }) }

// current is the deployments of the session that runs now (nil between
// sessions).
type current struct {
	mu sync.Mutex
	ds *deployments
}

func (c *current) set(ds *deployments) {
	c.mu.Lock()
	c.ds = ds
	c.mu.Unlock()
}

func (c *current) get() *deployments {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ds
}

// collector is the task manager's prometheus.Collector. It is unchecked
// (Describe sends nothing): operators register metrics of their own names.
type collector struct {
	c                                                  *cfg
	cur                                                *current
	recordsIn, recordsOut, backPressured, slots, tasks *prometheus.Desc
	inputWatermark, outputWatermark                    *prometheus.Desc
	stateBudget, stateOnDisk                           *prometheus.Desc
}

func newCollector(c *cfg, cur *current) *collector {
	taskLabels := []string{"job_id", "task_id", "task_name", "subtask"}
	return &collector{c: c, cur: cur,
		recordsIn:       prometheus.NewDesc("weir_task_numRecordsIn_total", "Records the task received from upstream tasks, or (a source task) that its source emitted, in this attempt.", taskLabels, nil),
		recordsOut:      prometheus.NewDesc("weir_task_numRecordsOut_total", "Records the task sent downstream (once per output edge), or (a sink task) that its sink wrote, in this attempt.", taskLabels, nil),
		backPressured:   prometheus.NewDesc("weir_task_backPressuredTimeMs_total", "Milliseconds the task was blocked sending downstream on a full channel, in this attempt; rate() is Flink's backPressuredTimeMsPerSecond.", taskLabels, nil),
		inputWatermark:  prometheus.NewDesc("weir_task_currentInputWatermark", "The task's input watermark (epoch ms): the minimum over its active inputs, its own for a source task; -9223372036854775808 before the first.", taskLabels, nil),
		outputWatermark: prometheus.NewDesc("weir_task_currentOutputWatermark", "The last watermark the task emitted (epoch ms); -9223372036854775808 before the first.", taskLabels, nil),
		slots:           prometheus.NewDesc("weir_taskmanager_slots", "Slots the task manager offers.", []string{"taskmanager_id"}, nil),
		tasks:           prometheus.NewDesc("weir_taskmanager_tasks", "Tasks deployed on the task manager.", []string{"taskmanager_id"}, nil),
		stateBudget:     prometheus.NewDesc("weir_taskmanager_stateMemoryBudgetBytes", "Memory budget of the pebble state backend shared by the task manager's tasks (--state-memory): block cache plus memtables.", []string{"taskmanager_id"}, nil),
		stateOnDisk:     prometheus.NewDesc("weir_taskmanager_stateSizeOnDiskBytes", "Size on disk of the task manager's pebble state instances (jobs on the pebble state backend).", []string{"taskmanager_id"}, nil)}
}

func (*collector) Describe(chan<- *prometheus.Desc) {}

func (m *collector) Collect(ch chan<- prometheus.Metric) {
	var deps []builtDeployment
	if ds := m.cur.get(); ds != nil {
		deps = newestAttempts(ds.built())
	}
	tasks := 0
	for _, b := range deps {
		sr, ok := b.dep.(statsReader)
		if !ok {
			continue
		}
		for _, t := range sr.TaskStats() {
			tasks++
			lv := []string{b.key.job, string(t.Task), t.Vertex, strconv.Itoa(t.Subtask)}
			ch <- prometheus.MustNewConstMetric(m.recordsIn, prometheus.CounterValue, float64(t.RecordsIn), lv...)
			ch <- prometheus.MustNewConstMetric(m.recordsOut, prometheus.CounterValue, float64(t.RecordsOut), lv...)
			ch <- prometheus.MustNewConstMetric(m.backPressured, prometheus.CounterValue, float64(t.BackPressured.Milliseconds()), lv...)
			ch <- prometheus.MustNewConstMetric(m.inputWatermark, prometheus.GaugeValue, float64(t.InputWatermark), lv...)
			ch <- prometheus.MustNewConstMetric(m.outputWatermark, prometheus.GaugeValue, float64(t.OutputWatermark), lv...)
		}
		for _, om := range sr.OperatorMetrics() {
			collectOperator(ch, b.key.job, om)
		}
	}
	ch <- prometheus.MustNewConstMetric(m.slots, prometheus.GaugeValue, float64(m.c.slots), m.c.id)
	ch <- prometheus.MustNewConstMetric(m.tasks, prometheus.GaugeValue, float64(tasks), m.c.id)
	if mem := m.c.stateMem; mem != nil {
		ch <- prometheus.MustNewConstMetric(m.stateBudget, prometheus.GaugeValue, float64(mem.Budget()), m.c.id)
		ch <- prometheus.MustNewConstMetric(m.stateOnDisk, prometheus.GaugeValue, float64(mem.DiskUsage()), m.c.id)
	}
}

// collectOperator emits one operator metric, prefixed weir_ and labelled
// with the job, operator and subtask (and its own label, if any).
func collectOperator(ch chan<- prometheus.Metric, job string, om runtime.OperatorMetric) {
	labels := []string{"job_id", "operator", "subtask"}
	if om.Label != "" {
		labels = append(labels, om.Label)
	}
	desc := prometheus.NewDesc("weir_"+om.Name, om.Help, labels, nil)
	vt := prometheus.GaugeValue
	if om.Kind == runtime.CounterMetric {
		vt = prometheus.CounterValue
	}
	for lv, v := range om.Read() {
		values := []string{job, om.Operator, strconv.Itoa(om.Subtask)}
		if om.Label != "" {
			values = append(values, lv)
		}
		m, err := prometheus.NewConstMetric(desc, vt, v, values...)
		if err != nil {
			m = prometheus.NewInvalidMetric(desc, err)
		}
		ch <- m
	}
}

// newestAttempts keeps each job's newest attempt of deps (sorted by job
// and attempt): while an attempt ends, the next may already be deployed.
func newestAttempts(deps []builtDeployment) []builtDeployment {
	var out []builtDeployment
	for i, b := range deps {
		if i+1 < len(deps) && deps[i+1].key.job == b.key.job {
			continue
		}
		out = append(out, b)
	}
	return out
}
