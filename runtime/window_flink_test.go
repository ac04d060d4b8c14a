package runtime

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests of this file pin rules of the window operator that come from
// Flink, whose window semantics Weir's docs say it follows, as a job runs
// them (source, keyed window, sink).

// eventTimeWindowJob runs cs (one source subtask with punctuated
// watermarks of bound 20 ms, so which records meet which watermark is
// deterministic) through keyed windows of asg with ProcessWindow, and
// returns each result line ("key window elements=[ids]", "(late)" for a
// late firing) with the event timestamp the sink saw it with.
func eventTimeWindowJob(t *testing.T, cs []click, asg WindowAssigner, opts ...WindowOpt) map[string]int64 {
	t.Helper()
	var mu sync.Mutex
	got := map[string]int64{}
	var dup atomic.Int64
	j := NewJob("windows", MaxParallelism(8))
	events := FromSource(j, "clicks", SliceSource(cs, 1), Parallelism(1),
		Watermarks(ForGenerator(func() WatermarkGenerator[click] { return &punctuatedWatermarks{bound: 20} },
			WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }))))
	ws := Window(KeyBy(events, func(c click) string { return c.Key }, nil), asg, opts...)
	out := ProcessWindow(ws, "windows", ProcessWindowFunc[string, click, string](func(ctx *WindowContext[string], cs []click, out Collector[string]) error {
		ids := make([]int, len(cs))
		for i, c := range cs {
			ids[i] = c.ID
		}
		l := fmt.Sprintf("%s %v elements=%v", ctx.Key, ctx.Window, ids)
		if ctx.Late {
			l += " (late)"
		}
		out.Collect(l)
		return nil
	}), nil)
	SinkTo(out, "sink", func() Sink[string] { return &stampSink{mu: &mu, got: got, dup: &dup} })
	if _, err := NewMiniCluster().Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	if dup.Load() != 0 {
		t.Fatalf("%d duplicate results: %v", dup.Load(), got)
	}
	return got
}

// A late firing (a record within the allowed lateness) carries the
// window's last millisecond as its timestamp, as the on-time firing does,
// not the late record's: Flink's WindowOperator.emitWindowContents stamps
// every result with window.maxTimestamp(). A downstream event-time window
// then sees a window's on-time and late results at the same time.
func TestALateFiringCarriesTheWindowsMaxTimestamp(t *testing.T) {
	cs := []click{
		{Key: "ann", TS: 5, ID: 0},
		{Key: "ann", TS: 40, ID: 1}, // the watermark after it, 19, fires [0,10) on time
		{Key: "ann", TS: 7, ID: 2},  // within the lateness: [0,10) fires again, late
	}
	got := eventTimeWindowJob(t, cs, TumblingEventTimeWindows(10*time.Millisecond), AllowedLateness(100*time.Millisecond))
	want := map[string]int64{
		"ann [0,10) elements=[0]":          9,
		"ann [0,10) elements=[0 2] (late)": 9,
		"ann [40,50) elements=[1]":         49,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("results with their timestamps %v, want %v", got, want)
	}
}

// Session windows that touch merge, as in Flink (TimeWindow.intersects is
// inclusive): with gap 10, clicks at 0 and 10 are one session [0,20); a
// click more than the gap after the previous one starts a new session.
func TestSessionWindowsThatTouchMerge(t *testing.T) {
	cs := []click{
		{Key: "ann", TS: 0, ID: 0},
		{Key: "ann", TS: 10, ID: 1}, // exactly the gap after 0: the same session
		{Key: "bob", TS: 3, ID: 2},
		{Key: "ann", TS: 31, ID: 3}, // 11 after 20: a new session
		{Key: "bob", TS: 14, ID: 4}, // 11 after 3: a new session
	}
	got := slices.Sorted(maps.Keys(eventTimeWindowJob(t, cs, EventTimeSessionWindows(10*time.Millisecond))))
	want := []string{
		"ann [0,20) elements=[0 1]",
		"ann [31,41) elements=[3]",
		"bob [14,24) elements=[4]",
		"bob [3,13) elements=[2]",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("sessions %q, want %q", got, want)
	}
}

// procWindow is a processing-time window's result: its key, bounds and
// count.
type procWindow struct {
	Key           string
	Start, End, N int64
}

// countClicksAgg counts clicks.
type countClicksAgg struct{}

func (countClicksAgg) CreateAccumulator() int64   { return 0 }
func (countClicksAgg) Add(_ click, n int64) int64 { return n + 1 }
func (countClicksAgg) GetResult(n int64) int64    { return n }
func (countClicksAgg) Merge(a, b int64) int64     { return a + b }

// Processing-time window results carry the window's last millisecond as
// their event timestamp (Flink stamps every window result with
// window.maxTimestamp(), whatever the time domain), so an event-time
// operator after a processing-time window takes them: before, the
// event-time window failed the job with "a record without event
// timestamp".
func TestProcessingTimeWindowResultsCarryTheirMaxTimestamp(t *testing.T) {
	const n = 400
	cs := windowClicks(3, n, 20, false)
	var counted atomic.Int64
	var mu sync.Mutex
	stamps := map[string]int64{}
	var dup atomic.Int64
	var total atomic.Int64
	j := NewJob("windows", MaxParallelism(8))
	events := FromSource(j, "clicks", func() Source[click] {
		return &lingeringSource[click]{Source: SliceSource(cs, 1)(), done: func() bool { return counted.Load() >= n }}
	}, Parallelism(1)) // no WatermarkStrategy: the records carry no timestamp
	proc := Window(KeyBy(events, func(c click) string { return c.Key }, nil), TumblingProcessingTimeWindows(20*time.Millisecond))
	counts := AggregateProcess(proc, "per-20ms", AggregateFunction[click, int64, int64](countClicksAgg{}),
		ProcessWindowFunc[string, int64, procWindow](func(ctx *WindowContext[string], ns []int64, out Collector[procWindow]) error {
			counted.Add(ns[0])
			out.Collect(procWindow{Key: ctx.Key, Start: ctx.Window.Start, End: ctx.Window.End, N: ns[0]})
			return nil
		}), nil)
	lines := Map(counts, "lines", func(w procWindow) (string, error) {
		return fmt.Sprintf("%s %d %d", w.Key, w.Start, w.End), nil
	})
	SinkTo(lines, "stamps", func() Sink[string] { return &stampSink{mu: &mu, got: stamps, dup: &dup} })
	// An event-time window over the processing-time results: it needs their
	// timestamps, and the end of input's watermark fires it.
	all := Window(KeyBy(counts, func(procWindow) string { return "all" }, nil), TumblingEventTimeWindows(time.Hour))
	sums := ReduceWindow(all, "sum", func(a, b procWindow) (procWindow, error) { return procWindow{N: a.N + b.N}, nil }, nil)
	SinkTo(sums, "total", SinkFunc(func(_ context.Context, w procWindow) error { total.Add(w.N); return nil }))
	if _, err := NewMiniCluster().Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	if len(stamps) == 0 {
		t.Fatal("no processing-time window fired")
	}
	for l, ts := range stamps {
		var key string
		var start, end int64
		if _, err := fmt.Sscanf(l, "%s %d %d", &key, &start, &end); err != nil {
			t.Fatal(err)
		}
		if ts != end-1 {
			t.Errorf("result of window [%d,%d) carries timestamp %d, want %d", start, end, ts, end-1)
		}
	}
	if total.Load() != n {
		t.Fatalf("the event-time window after the processing-time one counted %d clicks, want %d", total.Load(), n)
	}
}

// A ProcessWindowFunction gets a copy of the window's records: sorting it
// in place does not rewrite the window state, so a later (late) firing
// still sees the records in arrival order, and a snapshot encoding the
// state on another goroutine never reads a slice the function changes.
func TestAProcessWindowFunctionSortingItsElementsDoesNotChangeTheWindow(t *testing.T) {
	cs := []click{
		{Key: "ann", TS: 5, ID: 3},
		{Key: "ann", TS: 6, ID: 1},
		{Key: "ann", TS: 7, ID: 2},
		{Key: "ann", TS: 40, ID: 0}, // the watermark after it, 19, fires [0,10)
		{Key: "ann", TS: 8, ID: 4},  // a late firing of [0,10)
	}
	var mu sync.Mutex
	var seen []string
	j := NewJob("windows", MaxParallelism(8))
	events := FromSource(j, "clicks", SliceSource(cs, 1), Parallelism(1),
		Watermarks(ForGenerator(func() WatermarkGenerator[click] { return &punctuatedWatermarks{bound: 20} },
			WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }))))
	ws := Window(KeyBy(events, func(c click) string { return c.Key }, nil), TumblingEventTimeWindows(10*time.Millisecond),
		AllowedLateness(100*time.Millisecond))
	out := ProcessWindow(ws, "sorted", ProcessWindowFunc[string, click, string](func(ctx *WindowContext[string], cs []click, out Collector[string]) error {
		ids := make([]int, len(cs))
		for i, c := range cs {
			ids[i] = c.ID
		}
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%v %v", ctx.Window, ids))
		mu.Unlock()
		slices.SortFunc(cs, func(a, b click) int { return a.ID - b.ID }) // in place
		out.Collect(fmt.Sprint(cs))
		return nil
	}), nil)
	SinkTo(out, "sink", func() Sink[string] { return discardSink[string]{} })
	if _, err := NewMiniCluster().Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	want := []string{"[0,10) [3 1 2]", "[40,50) [0]", "[0,10) [3 1 2 4]"}
	slices.Sort(want)
	slices.Sort(seen)
	if !slices.Equal(seen, want) {
		t.Fatalf("the function saw %q, want %q (arrival order at every firing)", seen, want)
	}
}
