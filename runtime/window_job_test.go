package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// punctuatedWatermarks emits the bounded out-of-orderness watermark after
// every record (max timestamp - bound - 1), so the watermark each record
// meets depends only on the records before it: with one source subtask,
// which records are late and which windows fire late is deterministic.
type punctuatedWatermarks struct {
	bound int64
	max   int64
	seen  bool
}

func (g *punctuatedWatermarks) OnEvent(_ click, ts int64, out WatermarkOutput) {
	out.EmitWatermark(g.next(ts))
}

// next is the watermark after a record at ts.
func (g *punctuatedWatermarks) next(ts int64) int64 {
	if !g.seen || ts > g.max {
		g.max, g.seen = ts, true
	}
	return g.max - g.bound - 1
}

func (g *punctuatedWatermarks) OnPeriodicEmit(WatermarkOutput) {}

// windowClicks are n clicks over keys, their timestamps rising by 0-4 ms a
// click, out of order by up to bound ms, and, with late, one in eight
// later by up to 12x the bound (some beyond the allowed lateness).
func windowClicks(seed uint64, n int, bound int64, late bool) []click {
	keys := []string{"ann", "bob", "cyd", "dee", "eve"}
	in := outOfOrderInput(seed, n, keys, bound)
	cs := make([]click, n)
	for i, r := range in {
		if late && i%8 == 3 {
			r.ts -= int64(i*7919) % (12 * bound)
		}
		cs[i] = click{Key: r.key, TS: r.ts, ID: i}
	}
	return cs
}

// clickSum sums click ids + 1 (so every click counts).
type clickSum struct{}

func (clickSum) CreateAccumulator() sumAcc { return sumAcc{} }
func (clickSum) Add(c click, a sumAcc) sumAcc {
	return sumAcc{Sum: a.Sum + int64(c.ID) + 1, N: a.N + 1}
}
func (clickSum) GetResult(a sumAcc) sumAcc { return a }
func (clickSum) Merge(a, b sumAcc) sumAcc  { return sumAcc{Sum: a.Sum + b.Sum, N: a.N + b.N} }

// windowLine formats a window result as the harness prints it.
func windowLine(key string, w TimeWindow, a sumAcc) seqRec {
	return seqRec{Key: fmt.Sprintf("fire %s %v sum=%d n=%d", key, w, a.Sum, a.N)}
}

// windowJob runs the windows of c over cs (one source subtask unless
// srcPar) into txns, one record per window firing: with fn "aggregate"
// (AggregateProcess), "process" (ProcessWindow) or "reduce" (ReduceWindow,
// the window's bounds from the reduced click).
func windowJob(t *testing.T, cs []click, c windowHarnessConfig, fn string, srcPar, par int, txns *memTxns,
	wrap func(func() Source[click]) func() Source[click]) *Job {
	return windowJobWithSides(t, cs, c, fn, srcPar, par, txns, nil, nil, wrap)
}

// windowJobWithSides is windowJob whose late records go to lates (as the
// harness prints them), and whose "process" function also emits each
// result to a side output committed to copies.
func windowJobWithSides(t *testing.T, cs []click, c windowHarnessConfig, fn string, srcPar, par int, txns, lates, copies *memTxns,
	wrap func(func() Source[click]) func() Source[click]) *Job {
	j := NewJob("windows", DefaultParallelism(par), MaxParallelism(32))
	src := SliceSource(cs, 1)
	if wrap != nil {
		src = wrap(src)
	}
	var opts []OpOpt
	opts = append(opts, Parallelism(srcPar))
	if c.time == "event" {
		opts = append(opts, Watermarks(ForGenerator(func() WatermarkGenerator[click] { return &punctuatedWatermarks{bound: 20} },
			WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }))))
	}
	events := FromSource(j, "clicks", src, opts...)
	lateTag, copyTag := NewOutputTag[click]("late"), NewOutputTag[seqRec]("copies")
	wopts := []WindowOpt{AllowedLateness(time.Duration(c.lateness) * time.Millisecond)}
	if lates != nil {
		wopts = append(wopts, LateOutput(lateTag))
	}
	ws := Window(KeyBy(events, func(c click) string { return c.Key }, nil), c.assigner(t), wopts...)
	var out *Stream[seqRec]
	var lateStream *Stream[click]
	switch fn {
	case "reduce":
		red := ReduceWindow(ws, "windows", func(a, b click) (click, error) {
			return click{Key: a.Key, TS: max(a.TS, b.TS), ID: a.ID + b.ID + 1}, nil // sums ID+1
		}, nil)
		lateStream = SideOutput(red, lateTag)
		out = Map(red, "lines", func(c click) (seqRec, error) {
			return seqRec{Key: fmt.Sprintf("reduce %s sum=%d", c.Key, c.ID+1)}, nil
		})
	case "aggregate":
		out = AggregateProcess(ws, "windows", AggregateFunction[click, sumAcc, sumAcc](clickSum{}),
			ProcessWindowFunc[string, sumAcc, seqRec](func(ctx *WindowContext[string], rs []sumAcc, out Collector[seqRec]) error {
				out.Collect(windowLine(ctx.Key, ctx.Window, rs[0]))
				return nil
			}), nil)
	case "process":
		out = ProcessWindow(ws, "windows", ProcessWindowFunc[string, click, seqRec](func(ctx *WindowContext[string], cs []click, out Collector[seqRec]) error {
			var a sumAcc
			for _, c := range cs {
				a = clickSum{}.Add(c, a)
			}
			out.Collect(windowLine(ctx.Key, ctx.Window, a))
			WindowOutput(ctx, copyTag, windowLine(ctx.Key, ctx.Window, a))
			return nil
		}), nil)
	default:
		t.Fatalf("fn %q", fn)
	}
	SinkTo(out, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	if lates != nil {
		if lateStream == nil {
			lateStream = SideOutput(out, lateTag)
		}
		late := Map(lateStream, "late-lines", func(c click) (seqRec, error) {
			return seqRec{Key: fmt.Sprintf("late %s %d", c.Key, c.ID+1)}, nil
		})
		SinkTo(late, "late-sink", func() Sink[seqRec] { return &txnSink{txns: lates} })
	}
	if copies != nil {
		SinkTo(SideOutput(out, copyTag), "copies-sink", func() Sink[seqRec] { return &txnSink{txns: copies} })
	}
	return j
}

// harnessWindows is what the window state machine (checked against the
// definitions and Flink's operator in window_model_test.go) emits for cs
// with the punctuated watermark after every record.
func harnessWindows(t *testing.T, c windowHarnessConfig, cs []click) (fires, lates []string) {
	c.fn, c.late, c.parallelism, c.maxPar = "sum", "side", 1, 8
	h, err := newWindowHarness(t, c)
	if err != nil {
		t.Fatal(err)
	}
	g := &punctuatedWatermarks{bound: 20}
	for _, r := range cs {
		if err := h.add(r.Key, r.TS, int64(r.ID)+1); err != nil {
			t.Fatal(err)
		}
		if err := h.advance(true, g.next(r.TS)); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.advance(true, math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(h.out.String()), "\n") {
		switch {
		case strings.HasPrefix(l, "fire "):
			fires = append(fires, l)
		case strings.HasPrefix(l, "late "):
			lates = append(lates, l)
		}
	}
	slices.Sort(fires)
	slices.Sort(lates)
	return fires, lates
}

func sortedLines(out []seqRec) []string {
	var got []string
	for _, r := range out {
		got = append(got, r.Key)
	}
	slices.Sort(got)
	return got
}

// Event-time windows of every type over deterministic out-of-order input
// with late records, as a job in a mini cluster, in one process and across
// an exchange of the data plane: every window result committed exactly
// once, record by record equal to the window state machine's (itself
// equal to the definitions and to Flink's operator): the firings, the late
// firings with the updated results, no late record in any window, and
// every late record on the late side output, once. A ProcessWindowFunction's
// side output gets what it emits.
func TestEventTimeWindowJobsEmitEveryWindowOnceRecordByRecord(t *testing.T) {
	cases := []windowHarnessConfig{
		{kind: "tumbling", size: 50, lateness: 30},
		{kind: "sliding", size: 60, slide: 20, lateness: 40},
		{kind: "session", gap: 15, lateness: 25},
		{kind: "session", gap: 15},
	}
	for _, c := range cases {
		c.time = "event"
		for _, fn := range []string{"aggregate", "reduce", "process"} {
			for _, split := range []bool{false, true} {
				name := fmt.Sprintf("%s-size=%d,slide=%d,gap=%d,lateness=%d/%s/across-an-exchange=%v", c.kind, c.size, c.slide, c.gap, c.lateness, fn, split)
				t.Run(name, func(t *testing.T) {
					cs := windowClicks(11, 1500, 20, true)
					want, lates := harnessWindows(t, c, cs)
					if fn == "reduce" { // no window bounds, no count
						for i, l := range want {
							var key, w string
							var sum, n int64
							if _, err := fmt.Sscanf(l, "fire %s %s sum=%d n=%d", &key, &w, &sum, &n); err != nil {
								t.Fatal(err)
							}
							want[i] = fmt.Sprintf("reduce %s sum=%d", key, sum)
						}
						slices.Sort(want)
					}
					if len(lates) == 0 {
						t.Fatal("the input has no late record")
					}
					txns, lateTxns, copyTxns := newMemTxns(), newMemTxns(), newMemTxns()
					j := windowJobWithSides(t, cs, c, fn, 1, 3, txns, lateTxns, copyTxns, nil)
					opts := []ClusterOpt{CheckpointInterval(10 * time.Millisecond)}
					var sent atomic.Int64
					if split {
						opts = append(opts, Deployment(splitDeployer{job: j, parts: 2, sent: &sent}))
					}
					if _, err := NewMiniCluster(opts...).Run(t.Context(), j); err != nil {
						t.Fatal(err)
					}
					if split && sent.Load() == 0 {
						t.Fatal("nothing crossed the exchange")
					}
					if got := sortedLines(txns.output()); !slices.Equal(got, want) {
						t.Fatalf("%d window results, want %d; first difference:\n%s", len(got), len(want), firstDiff(got, want))
					}
					if got := sortedLines(lateTxns.output()); !slices.Equal(got, lates) {
						t.Fatalf("%d late records, want %d; first difference:\n%s", len(got), len(lates), firstDiff(got, lates))
					}
					if fn == "process" {
						if got := sortedLines(copyTxns.output()); !slices.Equal(got, want) {
							t.Fatalf("side output of the window function: %d records, want %d", len(got), len(want))
						}
					}
				})
			}
		}
	}
}

// A record late before a failure is late after the restore too: the
// restored source resumes at the watermark it had sent at the checkpoint's
// barrier, not at the minimum. A job stopped right before a late record
// and resumed at another parallelism commits exactly what the window state
// machine emits without a failure: the late record on the late output,
// not in a window of its own.
func TestAWindowJobRestoredRightBeforeALateRecordSendsItToTheLateOutput(t *testing.T) {
	c := windowHarnessConfig{kind: "tumbling", size: 50, lateness: 0, time: "event"}
	cs := windowClicks(11, 1500, 20, true)
	fires, lates := harnessWindows(t, c, cs)
	late := map[string]bool{}
	for _, l := range lates {
		late[l] = true
	}
	stallAt := -1
	for i := len(cs) / 3; i < len(cs); i++ {
		if late[fmt.Sprintf("late %s %d", cs[i].Key, cs[i].ID+1)] {
			stallAt = i
			break
		}
	}
	if stallAt < 0 {
		t.Fatal("the input has no late record after its first third")
	}
	store, err := checkpoint.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	txns, lateTxns := newMemTxns(), newMemTxns()
	stopMidStreamOf(t, store, 1, stallAt, func(stall stallFn) *Job {
		return windowJobWithSides(t, cs, c, "process", 1, 2, txns, lateTxns, nil, stall)
	})
	if _, err := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond)).Run(t.Context(),
		windowJobWithSides(t, cs, c, "process", 1, 3, txns, lateTxns, nil, nil)); err != nil {
		t.Fatal(err)
	}
	if got := sortedLines(lateTxns.output()); !slices.Equal(got, lates) {
		t.Fatalf("%d late records, a run without failure %d; first difference:\n%s", len(got), len(lates), firstDiff(got, lates))
	}
	if got := sortedLines(txns.output()); !slices.Equal(got, fires) {
		t.Fatalf("%d window results, a run without failure %d; first difference:\n%s", len(got), len(fires), firstDiff(got, fires))
	}
}

// A windows job stopped mid-window (state and timers in its last
// checkpoint) and resumed with the window operator at another parallelism
// commits exactly the window results of a run without failure, record by
// record.
func TestWindowJobsRestoredAtAnotherParallelismEqualARunWithoutFailure(t *testing.T) {
	cs := windowClicks(5, 2000, 20, false)
	for _, c := range []windowHarnessConfig{
		{kind: "tumbling", size: 40, lateness: 10},
		{kind: "sliding", size: 45, slide: 15},
		{kind: "session", gap: 12},
	} {
		c.time = "event"
		for _, tc := range []struct{ from, to int }{{2, 3}, {3, 1}} {
			t.Run(fmt.Sprintf("%s/%d->%d", c.kind, tc.from, tc.to), func(t *testing.T) {
				ref := newMemTxns()
				if _, err := NewMiniCluster(CheckpointInterval(10*time.Millisecond)).Run(t.Context(), windowJob(t, cs, c, "process", 2, tc.from, ref, nil)); err != nil {
					t.Fatal(err)
				}
				want := sortedLines(ref.output())
				if len(want) == 0 {
					t.Fatal("no window fired")
				}
				store, err := checkpoint.OpenStore(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				defer store.Close()
				txns := newMemTxns()
				stopMidStream(t, store, len(cs)/4, func(stall stallFn) *Job {
					return windowJob(t, cs, c, "process", 2, tc.from, txns, stall)
				})
				before := len(txns.output())
				if before == 0 || before >= len(want) {
					t.Fatalf("first run committed %d of %d window results: want a run stopped mid-way", before, len(want))
				}
				mc := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond))
				if _, err := mc.Run(t.Context(), windowJob(t, cs, c, "process", 2, tc.to, txns, nil)); err != nil {
					t.Fatal(err)
				}
				if got := sortedLines(txns.output()); !slices.Equal(got, want) {
					t.Fatalf("%d window results, the run without failure %d; first difference:\n%s", len(got), len(want), firstDiff(got, want))
				}
			})
		}
	}
}

// lingeringSource ends only once done says so after its input ended: a
// bounded input whose processing-time windows must fire before the job
// ends (pending processing-time timers do not fire at the end of input).
type lingeringSource[T any] struct {
	Source[T]
	done  func() bool
	ended bool
}

func (s *lingeringSource[T]) Poll(ctx context.Context, out Collector[T]) error {
	if !s.ended {
		err := s.Source.Poll(ctx, out)
		if !errors.Is(err, ErrEndOfInput) {
			return err
		}
		s.ended = true
	}
	if s.done() {
		return ErrEndOfInput
	}
	time.Sleep(time.Millisecond)
	return nil
}

// Processing-time windows of every type as a job, with assertions that
// hold whatever the timing: every record in exactly one tumbling window
// and one session, in exactly size/slide sliding windows; windows aligned
// to their slide; a key's sessions disjoint and at least gap long.
func TestProcessingTimeWindowJobsPutEveryRecordInItsWindows(t *testing.T) {
	const n = 600
	for _, c := range []windowHarnessConfig{
		{kind: "tumbling", size: 20},
		{kind: "sliding", size: 30, slide: 10},
		{kind: "session", gap: 15},
	} {
		c.time = "processing"
		t.Run(c.kind, func(t *testing.T) {
			copies := int64(1)
			if c.kind == "sliding" {
				copies = c.size / c.slide
			}
			cs := windowClicks(9, n, 20, false)
			var emitted atomic.Int64
			txns := newMemTxns()
			j := NewJob("windows", DefaultParallelism(2), MaxParallelism(32))
			events := FromSource(j, "clicks", func() Source[click] {
				return &lingeringSource[click]{Source: SliceSource(cs, 1)(), done: func() bool { return emitted.Load() >= n*copies }}
			}, Parallelism(1))
			ws := Window(KeyBy(events, func(c click) string { return c.Key }, nil), c.assigner(t))
			out := ProcessWindow(ws, "windows", ProcessWindowFunc[string, click, seqRec](func(ctx *WindowContext[string], cs []click, out Collector[seqRec]) error {
				for _, c := range cs {
					out.Collect(seqRec{Key: fmt.Sprintf("%s %d %d", ctx.Key, ctx.Window.Start, ctx.Window.End), Seq: int64(c.ID)})
				}
				emitted.Add(int64(len(cs)))
				return nil
			}), nil)
			SinkTo(out, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
			if _, err := NewMiniCluster(CheckpointInterval(10*time.Millisecond)).Run(t.Context(), j); err != nil {
				t.Fatal(err)
			}
			times := map[int64]int64{}
			sessions := map[string][]TimeWindow{}
			for _, r := range txns.output() {
				var key string
				var w TimeWindow
				if _, err := fmt.Sscanf(r.Key, "%s %d %d", &key, &w.Start, &w.End); err != nil {
					t.Fatal(err)
				}
				if cs[r.Seq].Key != key {
					t.Fatalf("record %d of key %s in a window of %s", r.Seq, cs[r.Seq].Key, key)
				}
				times[r.Seq]++
				switch c.kind {
				case "session":
					if !slices.Contains(sessions[key], w) {
						sessions[key] = append(sessions[key], w)
					}
				default:
					slide := c.slide
					if c.kind == "tumbling" {
						slide = c.size
					}
					if w.End-w.Start != c.size || windowStart(w.Start, 0, slide) != w.Start {
						t.Fatalf("window %v is no %s window of %d ms every %d ms", w, c.kind, c.size, slide)
					}
				}
			}
			for i := range cs {
				if times[int64(i)] != copies {
					t.Fatalf("record %d in %d windows, want %d", i, times[int64(i)], copies)
				}
			}
			for key, ss := range sessions {
				for i, a := range ss {
					if a.End-a.Start < c.gap {
						t.Fatalf("session %v of %s shorter than the gap", a, key)
					}
					for _, b := range ss[i+1:] {
						if a.intersects(b) {
							t.Fatalf("sessions %v and %v of %s overlap or touch (they should have merged)", a, b, key)
						}
					}
				}
			}
		})
	}
}
