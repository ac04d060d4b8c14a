package runtime

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// capturingDeployer deploys every task in process and keeps the
// deployments, to read their metrics.
type capturingDeployer struct {
	job  *Job
	mu   sync.Mutex
	deps []*localDeployment
}

func (c *capturingDeployer) Deploy(ctx context.Context, spec DeploySpec, rep TaskReports) (Deployed, error) {
	d, err := Deploy(ctx, c.job, spec, nil, rep)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.deps = append(c.deps, d.(*localDeployment))
	c.mu.Unlock()
	return d, nil
}

// gaugeSink registers a gauge of what it wrote and sleeps per record.
type gaugeSink struct {
	mu      sync.Mutex
	written int
}

func (s *gaugeSink) Open(_ context.Context, oc *OperatorContext) error {
	oc.Metrics().Gauge("written", "records written", func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(s.written)
	})
	return nil
}

func (s *gaugeSink) Write(context.Context, int) error {
	time.Sleep(50 * time.Microsecond)
	s.mu.Lock()
	s.written++
	s.mu.Unlock()
	return nil
}

func (s *gaugeSink) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s *gaugeSink) Close() error { return nil }

func TestTaskStatsCountRecordsInOutAndBackPressure(t *testing.T) {
	const n = 3000
	items := upTo(n)
	j := NewJob("stats")
	src := FromSource(j, "numbers", SliceSource(items, 100))
	doubled := Map(src, "double", func(v int) (int, error) { return 2 * v, nil })
	SinkTo(Rebalance(doubled), "slow", func() Sink[int] { return &gaugeSink{} }, Parallelism(2))
	dep := &capturingDeployer{job: j}
	began := time.Now()
	if _, err := NewMiniCluster(Deployment(dep), BatchSize(16), ChannelCapacity(1), CheckpointInterval(50*time.Millisecond)).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	if len(dep.deps) != 1 {
		t.Fatalf("%d attempts, want 1", len(dep.deps))
	}
	d := dep.deps[0]
	stats := map[checkpoint.TaskID]TaskStats{}
	for _, s := range d.TaskStats() {
		stats[s.Task] = s
	}
	source := stats["numbers#0"]
	if source.Vertex != "numbers -> double" || source.RecordsIn != n || source.RecordsOut != n {
		t.Errorf("source task %+v: want vertex \"numbers -> double\", %d in and out", source, n)
	}
	// A source task knows when its source first emitted (a recovery's
	// source re-open ends there); other tasks do not say.
	if f := source.FirstRecord; f.Before(began) || f.After(ended) {
		t.Errorf("source task's first record at %v, want within the run [%v, %v]", f, began, ended)
	}
	if f := stats["slow#0"].FirstRecord; !f.IsZero() {
		t.Errorf("sink task's first record %v, want none (not a source task)", f)
	}
	if source.BackPressured <= 0 {
		t.Errorf("source task back-pressured %v behind a slow sink with one-batch channels, want > 0", source.BackPressured)
	}
	var in, out int64
	for _, id := range []checkpoint.TaskID{"slow#0", "slow#1"} {
		in, out = in+stats[id].RecordsIn, out+stats[id].RecordsOut
		if stats[id].BackPressured != 0 {
			t.Errorf("sink task %s back-pressured %v, want 0 (it sends nothing)", id, stats[id].BackPressured)
		}
	}
	if in != n || out != n {
		t.Errorf("sink tasks: %d in, %d out, want %d each", in, out, n)
	}
	if !source.Source || source.Sink || !stats["slow#0"].Sink || stats["slow#0"].Source {
		t.Errorf("task kinds: source task %+v, sink task %+v", source, stats["slow#0"])
	}
	// The job's records in are its source's emitted records, out its
	// sinks' written ones; the Map's n records in between count in neither.
	if c := d.Counts(); c != (RecordCounts{In: n, Out: n}) {
		t.Errorf("Counts() = %+v, want %d in and %d out", c, n, n)
	}
	ms := d.OperatorMetrics()
	if len(ms) != 2 {
		t.Fatalf("operator metrics %+v, want the sink's gauge per subtask", ms)
	}
	var total float64
	for i, m := range ms {
		if m.Operator != "slow" || m.Subtask != i || m.Name != "written" || m.Kind != GaugeMetric {
			t.Errorf("metric %d: %+v", i, m)
		}
		total += m.Read()[""]
	}
	if total != n {
		t.Errorf("gauges sum to %v, want %d", total, n)
	}
}

// A sink chained into its source's task writes during the source's polls;
// its records out are what it wrote (here the filter's survivors), not what
// the source emitted.
func TestTaskStatsCountAChainedSinksWrittenRecords(t *testing.T) {
	const n = 1000
	items := upTo(n)
	j := NewJob("chained")
	src := FromSource(j, "numbers", SliceSource(items, 64))
	even := Filter(src, "even", func(v int) bool { return v%2 == 0 })
	SinkTo(even, "sink", func() Sink[int] { return discardSink[int]{} })
	dep := &capturingDeployer{job: j}
	if _, err := NewMiniCluster(Deployment(dep)).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	d := dep.deps[0]
	stats := d.TaskStats()
	if len(stats) != 1 || stats[0].RecordsIn != n || stats[0].RecordsOut != n/2 {
		t.Errorf("task stats %+v, want one task with %d in and %d out", stats, n, n/2)
	}
	if c := d.Counts(); c != (RecordCounts{In: n, Out: n / 2}) {
		t.Errorf("Counts() = %+v, want %d in and %d out", c, n, n/2)
	}
}

func TestGraphDescribesVerticesAndEdges(t *testing.T) {
	j := NewJob("graph", DefaultParallelism(2))
	src := FromSource(j, "numbers", SliceSource([]int{1}, 1))
	m := Map(src, "double", func(v int) (int, error) { return v, nil })
	SinkTo(Rebalance(m), "sink", func() Sink[int] { return discardSink[int]{} }, Parallelism(3))
	g, err := j.Graph()
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Vertices) != 2 || g.Vertices[0].Name != "numbers -> double" || g.Vertices[0].Parallelism != 2 ||
		g.Vertices[1].ID != "sink" || len(g.Vertices[1].Tasks) != 3 || g.Vertices[1].Tasks[2] != "sink#2" {
		t.Errorf("vertices %+v", g.Vertices)
	}
	if len(g.Edges) != 1 || g.Edges[0] != (GraphEdge{From: "numbers", To: "sink", Ship: "REBALANCE"}) {
		t.Errorf("edges %+v", g.Edges)
	}
}

// upTo returns 0, 1, ..., n-1.
func upTo(n int) []int {
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	return items
}

// Every task reports its input and output watermark (the final one once a
// bounded input ended), and a keyed operator counts the late records it
// received: here, deterministically, the events behind the watermark of a
// single source that emits one after every event.
func TestTaskStatsReportWatermarksAndKeyedOperatorsCountLateRecords(t *testing.T) {
	const bound = 500
	cs := clicks(600, 7)
	for i := range cs {
		if i%29 == 28 {
			cs[i].TS -= 3000
		}
	}
	var late int
	maxTS := MinWatermark + bound + 1
	for _, c := range cs {
		if c.TS <= maxTS-bound-1 {
			late++
		}
		maxTS = max(maxTS, c.TS)
	}
	j := NewJob("wm-stats", DefaultParallelism(2), MaxParallelism(16))
	ws := ForGenerator(func() WatermarkGenerator[click] { return &punctuated{bound: bound, maxTS: MinWatermark + bound + 1} },
		WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }))
	events := FromSource(j, "clicks", SliceSource(cs, 5), Parallelism(1), Watermarks(ws))
	sorted := ProcessKeyed(KeyBy(events, func(c click) string { return c.Key }, nil), "sort",
		func() KeyedProcessor[string, click, seqRec] { return &lateSorter{} })
	SinkTo(sorted, "sink", func() Sink[seqRec] { return discardSink[seqRec]{} })
	dep := &capturingDeployer{job: j}
	if _, err := NewMiniCluster(Deployment(dep), Restarts(0, 0)).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	d := dep.deps[0]
	for _, s := range d.TaskStats() {
		if s.InputWatermark != MaxWatermark || s.OutputWatermark != MaxWatermark {
			t.Errorf("task %s: watermarks in %d out %d, want the final watermark", s.Task, s.InputWatermark, s.OutputWatermark)
		}
	}
	var counted float64
	var subtasks int
	for _, m := range d.OperatorMetrics() {
		if m.Name == "numLateRecords_total" && m.Operator == "sort" && m.Kind == CounterMetric {
			counted += m.Read()[""]
			subtasks++
		}
	}
	if subtasks != 2 || counted != float64(late) {
		t.Errorf("numLateRecords_total: %v over %d subtasks, want %d over 2", counted, subtasks, late)
	}
}

// A sink chained to an event-time window writes when a watermark fires the
// windows, not only when a batch arrives: the final watermark of a bounded
// input fires every window after the last batch. Its task's records out
// are every record it wrote (the Nexmark q5 count of 3 against 7 results).
func TestTaskStatsCountWhatASinkWroteOnAWatermark(t *testing.T) {
	cs := clicks(600, 7)
	j := NewJob("window-stats", DefaultParallelism(2), MaxParallelism(16))
	events := FromSource(j, "clicks", SliceSource(cs, 50), Watermarks(ForBoundedOutOfOrderness[click](500*time.Millisecond,
		WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }))))
	windows := Window(KeyBy(events, func(c click) string { return c.Key }, nil), TumblingEventTimeWindows(time.Second))
	counts := ReduceWindow(windows, "count", func(a, b click) (click, error) { return a, nil }, nil)
	var written atomic.Int64
	SinkTo(counts, "sink", func() Sink[click] { return countingSink[click]{n: &written} })
	dep := &capturingDeployer{job: j}
	if _, err := NewMiniCluster(Deployment(dep), Restarts(0, 0)).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	if written.Load() == 0 {
		t.Fatal("the sink wrote nothing")
	}
	var out int64
	for _, s := range dep.deps[0].TaskStats() {
		if s.Sink {
			out += s.RecordsOut
		}
	}
	if out != written.Load() {
		t.Errorf("sink tasks' records out %d, want the %d records the sink wrote", out, written.Load())
	}
	if c := dep.deps[0].Counts(); c.Out != written.Load() {
		t.Errorf("Counts().Out = %d, want %d", c.Out, written.Load())
	}
}

// lagSource is a bounded source whose subtasks report the pendingRecords
// they are given (none for a subtask without an entry).
type lagSource struct {
	pending map[int]map[string]float64
}

func (s *lagSource) Open(_ context.Context, oc *OperatorContext) error {
	p, ok := s.pending[oc.Subtask]
	PendingRecordsMetric(oc.Metrics(), "test backlog", "partition", func() map[string]float64 {
		if !ok {
			return nil
		}
		return p
	})
	return nil
}

func (s *lagSource) Poll(context.Context, Collector[int]) error { return ErrEndOfInput }
func (s *lagSource) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s *lagSource) Close() error { return nil }

// A source subtask's stats carry the sum of its partitions' pendingRecords
// and the largest of them (Flink's records-lag-max); a subtask that
// reports none has -1 for both.
func TestTaskStatsCarryTheSumAndTheLargestPartitionLag(t *testing.T) {
	pending := map[int]map[string]float64{0: {"in-0": 5, "in-1": 12, "in-2": 0}, 1: {"in-3": 0}}
	j := NewJob("lag")
	src := FromSource(j, "in", func() Source[int] { return &lagSource{pending: pending} }, Parallelism(3))
	SinkTo(src, "sink", func() Sink[int] { return discardSink[int]{} }, Parallelism(3))
	dep := &capturingDeployer{job: j}
	if _, err := NewMiniCluster(Deployment(dep)).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	want := map[int][2]int64{0: {17, 12}, 1: {0, 0}, 2: {-1, -1}}
	for _, s := range dep.deps[0].TaskStats() {
		if got := [2]int64{s.PendingRecords, s.RecordsLagMax}; got != want[s.Subtask] {
			t.Errorf("task %s: pendingRecords %d, records-lag-max %d; want %v", s.Task, got[0], got[1], want[s.Subtask])
		}
	}
}
