package runtime

import (
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// Metrics of a deployment's tasks and operators (docs/metrics.md).
//
// The runtime counts, per task, the records that enter it (received from
// upstream tasks, or emitted by its source), the records that leave it
// (sent downstream, or written by its sink) and the time it was blocked
// sending downstream on a full channel (back-pressure). Operators register
// their own metrics through OperatorContext.Metrics. Nothing here depends
// on a metrics library: a task manager reads TaskStats and OperatorMetrics
// when it is scraped and exposes them as Prometheus metrics.

// Metrics is how an operator subtask registers its own metrics
// (OperatorContext.Metrics). Every read function is called at each scrape,
// from another goroutine than the task's: it must be safe for that, and
// quick. Names are snake or camel case without a prefix (the task manager
// adds "weir_" and the labels job_id, operator and subtask).
type Metrics interface {
	// Counter registers a value that only grows (it restarts at 0 with the
	// attempt); by Prometheus convention its name ends in _total.
	Counter(name, help string, read func() float64)
	// Gauge registers a value that goes up and down.
	Gauge(name, help string, read func() float64)
	// Gauges registers a gauge with one label of its own (e.g. partition):
	// read returns the value of each label value present now.
	Gauges(name, help, label string, read func() map[string]float64)
}

// TransactionMetrics registers a transactional operator's transactions
// with m: pendingTransactions (pre-committed, waiting for their checkpoint
// to complete) and lostTransactions_total (found lost: aborted by the
// broker before they could commit).
func TransactionMetrics(m Metrics, pending func() int, lost func() int64) {
	m.Gauge("pendingTransactions", "Pre-committed transactions of the operator subtask not yet committed (waiting for their checkpoint to complete).",
		func() float64 { return float64(pending()) })
	m.Counter("lostTransactions_total", "Transactions of the operator subtask found lost (aborted by the broker, e.g. at its transaction timeout, before they could commit).",
		func() float64 { return float64(lost()) })
}

// PendingRecords is the name of Flink's standard source metric
// pendingRecords (records of the source's input not yet done), which a
// task's stats carry to the job manager (TaskStats.PendingRecords).
const PendingRecords = "pendingRecords"

// PendingRecordsMetric registers a source's pendingRecords with m, by
// label (e.g. partition); read returns nil while the source has not
// measured them (the task then reports none). The task's stats carry their
// sum (TaskStats.PendingRecords) and their largest value
// (TaskStats.RecordsLagMax, Flink's records-lag-max).
func PendingRecordsMetric(m Metrics, help, label string, read func() map[string]float64) {
	m.Gauges("pendingRecords", help, label, read) // PendingRecords, spelled out for the metrics reference's lint
}

// MetricKind says how an operator metric behaves.
type MetricKind int

// Kinds of OperatorMetric.
const (
	CounterMetric MetricKind = iota + 1
	GaugeMetric
)

// OperatorMetric is one metric an operator subtask registered.
type OperatorMetric struct {
	// Operator and Subtask name the operator subtask (Operator is the
	// operator's name).
	Operator string
	Subtask  int
	Name     string
	Help     string
	Kind     MetricKind
	// Label is the name of the metric's own label ("" without one).
	Label string
	// Read returns the metric's current values, by label value (the key
	// is "" without a label).
	Read func() map[string]float64
}

// TaskStats are a task's counters in the current attempt.
type TaskStats struct {
	Task checkpoint.TaskID
	// Vertex is the name of the task's chain of operators ("a -> b").
	Vertex  string
	Subtask int
	// RecordsIn are the records the task received from upstream tasks, or
	// (a source task) the records its source emitted.
	RecordsIn int64
	// RecordsOut are the records the task sent downstream (counted once per
	// output edge), or (a sink task) the records its sink wrote.
	RecordsOut int64
	// BackPressured is the time the task spent blocked sending downstream
	// because a channel was full.
	BackPressured time.Duration
	// InputWatermark is the task's current input watermark: the minimum
	// over its active inputs (its source's own, for a source task);
	// MinWatermark until the first one (Flink's currentInputWatermark).
	InputWatermark int64
	// OutputWatermark is the last watermark the task emitted
	// (currentOutputWatermark).
	OutputWatermark int64
	// Source and Sink say whether the task's chain starts with a source or
	// ends with a sink (CountRecords).
	Source, Sink bool
	// PendingRecords is the sum of the pendingRecords its operators
	// reported (PendingRecordsMetric), -1 when none did.
	PendingRecords int64
	// RecordsLagMax is the largest pendingRecords of one label value
	// (partition) its operators reported: the lag of the subtask's most
	// lagging partition, Flink's records-lag-max; -1 when none reported.
	RecordsLagMax int64
	// FirstRecord is when a source task's source first emitted in this
	// attempt (zero: not yet, or not a source task): the end of a
	// recovery's source re-open.
	FirstRecord time.Time
}

// CountRecords sums the records that entered the job (the source tasks'
// records in) and left it (the sink tasks' records out) in stats: the one
// rule behind Deployed.Counts, wherever the stats are.
func CountRecords(stats []TaskStats) RecordCounts {
	var c RecordCounts
	for _, s := range stats {
		if s.Source {
			c.In += s.RecordsIn
		}
		if s.Sink {
			c.Out += s.RecordsOut
		}
	}
	return c
}

// taskStats are the live counters of one task.
type taskStats struct {
	in, out         atomic.Int64
	backPressuredNs atomic.Int64
	// inputWatermark and outputWatermark are the task's current watermarks
	// (MinWatermark until the first one); set by the task goroutine.
	inputWatermark, outputWatermark atomic.Int64
	// firstIn is when a source task's source first emitted (Unix
	// nanoseconds; 0: not yet).
	firstIn atomic.Int64
}

func newTaskStats() *taskStats {
	s := &taskStats{}
	s.inputWatermark.Store(MinWatermark)
	s.outputWatermark.Store(MinWatermark)
	return s
}

// operatorMetrics is the Metrics of one operator subtask: it records the
// registrations in its deployment.
type operatorMetrics struct {
	reg      *metricRegistry
	operator string
	subtask  int
}

// metricRegistry holds a deployment's operator metrics.
type metricRegistry struct {
	mu      sync.Mutex
	metrics []OperatorMetric
}

func (m *operatorMetrics) add(om OperatorMetric) {
	if m == nil || m.reg == nil {
		return
	}
	om.Operator, om.Subtask = m.operator, m.subtask
	m.reg.mu.Lock()
	m.reg.metrics = append(m.reg.metrics, om)
	m.reg.mu.Unlock()
}

func single(read func() float64) func() map[string]float64 {
	return func() map[string]float64 { return map[string]float64{"": read()} }
}

func (m *operatorMetrics) Counter(name, help string, read func() float64) {
	m.add(OperatorMetric{Name: name, Help: help, Kind: CounterMetric, Read: single(read)})
}

func (m *operatorMetrics) Gauge(name, help string, read func() float64) {
	m.add(OperatorMetric{Name: name, Help: help, Kind: GaugeMetric, Read: single(read)})
}

func (m *operatorMetrics) Gauges(name, help, label string, read func() map[string]float64) {
	m.add(OperatorMetric{Name: name, Help: help, Kind: GaugeMetric, Label: label, Read: read})
}

// TaskStats returns the counters of the deployment's tasks, in task order.
func (d *localDeployment) TaskStats() []TaskStats {
	pending := map[string]int64{} // by operator name and subtask
	lagMax := map[string]int64{}  // the largest value of one label, by the same key
	d.metrics.mu.Lock()
	for _, m := range d.metrics.metrics {
		if m.Name != PendingRecords {
			continue
		}
		if vals := m.Read(); vals != nil {
			k := m.Operator + "\x00" + strconv.Itoa(m.Subtask)
			for _, v := range vals {
				pending[k] += int64(v)
				if l, ok := lagMax[k]; !ok || int64(v) > l {
					lagMax[k] = int64(v)
				}
			}
		}
	}
	d.metrics.mu.Unlock()
	out := make([]TaskStats, len(d.tasks))
	for i, t := range d.tasks {
		out[i] = TaskStats{Task: t.id, Vertex: t.v.name(), Subtask: t.subtask, RecordsIn: t.stats.in.Load(),
			RecordsOut: t.stats.out.Load(), BackPressured: time.Duration(t.stats.backPressuredNs.Load()),
			InputWatermark: t.stats.inputWatermark.Load(), OutputWatermark: t.stats.outputWatermark.Load(),
			Source: t.v.isSource(), Sink: t.v.isSink(), PendingRecords: -1, RecordsLagMax: -1}
		if ns := t.stats.firstIn.Load(); ns != 0 {
			out[i].FirstRecord = time.Unix(0, ns)
		}
		for _, n := range t.v.nodes {
			k := n.name + "\x00" + strconv.Itoa(t.subtask)
			if p, ok := pending[k]; ok {
				out[i].PendingRecords = max(out[i].PendingRecords, 0) + p
			}
			if l, ok := lagMax[k]; ok {
				out[i].RecordsLagMax = max(out[i].RecordsLagMax, l)
			}
		}
	}
	return out
}

// OperatorMetrics returns the metrics the deployment's operators
// registered, by operator and subtask.
func (d *localDeployment) OperatorMetrics() []OperatorMetric {
	d.metrics.mu.Lock()
	out := append([]OperatorMetric(nil), d.metrics.metrics...)
	d.metrics.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Operator != out[j].Operator {
			return out[i].Operator < out[j].Operator
		}
		return out[i].Subtask < out[j].Subtask
	})
	return out
}

// discardMetrics is the Metrics of an operator made outside a deployment.
type discardMetrics struct{}

func (discardMetrics) Counter(string, string, func() float64)                   {}
func (discardMetrics) Gauge(string, string, func() float64)                     {}
func (discardMetrics) Gauges(string, string, string, func() map[string]float64) {}
