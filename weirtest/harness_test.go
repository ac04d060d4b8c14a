package weirtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/weirtest"
)

// sorter emits each user's events in event-time order once the watermark
// passes them (an event-time timer per timestamp), and every event it
// receives late (at or below the watermark) to a side output.
type sorter struct {
	buf  *runtime.MapState[int64, []string]
	late runtime.OutputTag[string]
}

func (s *sorter) Open(_ context.Context, st *runtime.StateRegistry[string]) error {
	var err error
	s.buf, err = runtime.NewMapState[int64, []string](st, "buffer", nil, nil)
	return err
}

func (s *sorter) ProcessElement(ctx *runtime.KeyedContext[string], e Event, out runtime.Collector[string]) error {
	if e.TS <= ctx.CurrentWatermark() {
		runtime.Output(ctx, s.late, fmt.Sprintf("late %s@%d", e.User, e.TS))
		return nil
	}
	vs, _ := s.buf.Get(e.TS)
	s.buf.Put(e.TS, append(slices.Clip(vs), fmt.Sprintf("%s@%d", e.User, e.TS)))
	ctx.TimerService().RegisterEventTimeTimer(e.TS)
	return nil
}

func (s *sorter) OnTimer(ctx *runtime.KeyedContext[string], ts int64, out runtime.Collector[string]) error {
	vs, _ := s.buf.Get(ts)
	for _, v := range vs {
		out.Collect(v)
	}
	s.buf.Delete(ts)
	return nil
}

var lateTag = runtime.NewOutputTag[string]("late")

func newSorterHarness(t *testing.T, opts ...weirtest.Opt) *weirtest.KeyedHarness[string, Event, string] {
	t.Helper()
	h, err := weirtest.NewKeyedHarness(func(e Event) string { return e.User }, nil,
		func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[string] {
			return runtime.ProcessKeyed(ks, "sorter", func() runtime.KeyedProcessor[string, Event, string] {
				return &sorter{late: lateTag}
			})
		}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestEventTimeTimersFireInTimestampOrderWhenTheWatermarkPassesThem(t *testing.T) {
	h := newSorterHarness(t)
	for _, e := range []Event{{"ann", 30}, {"bob", 10}, {"ann", 20}, {"ann", 40}} {
		must(t, h.ProcessElement(e, e.TS))
	}
	timers, err := h.Timers()
	must(t, err)
	var got []string
	for _, tm := range timers {
		got = append(got, fmt.Sprintf("%s %s %d %s", tm.Key, tm.Domain, tm.Timestamp, tm.Service))
	}
	want := []string{"bob event-time 10 timers", "ann event-time 20 timers", "ann event-time 30 timers", "ann event-time 40 timers"}
	if !slices.Equal(got, want) {
		t.Fatalf("timers = %q, want %q", got, want)
	}
	if out := h.Output(); len(out) != 0 {
		t.Fatalf("output before any watermark: %v", out)
	}
	must(t, h.ProcessWatermark(30))
	wantOut := []weirtest.Record[string]{{"bob@10", 10}, {"ann@20", 20}, {"ann@30", 30}}
	if got := h.TakeOutput(); !slices.Equal(got, wantOut) {
		t.Fatalf("output at watermark 30 = %v, want %v (records of an event-time timer carry its timestamp)", got, wantOut)
	}
	buf, err := weirtest.MapEntries[int64, []string](h, "buffer", "ann")
	must(t, err)
	if len(buf) != 1 || !slices.Equal(buf[40], []string{"ann@40"}) {
		t.Fatalf("ann's buffer after watermark 30 = %v, want only 40", buf)
	}
	must(t, h.ProcessElement(Event{"bob", 25}, 25))
	if got := weirtest.SideOutput(h, lateTag); !slices.Equal(got, []weirtest.Record[string]{{"late bob@25", 25}}) {
		t.Fatalf("late side output = %v", got)
	}
	must(t, h.ProcessWatermark(runtime.MaxWatermark))
	if got := h.Values(); !slices.Equal(got, []string{"ann@40"}) {
		t.Fatalf("output at the final watermark = %v", got)
	}
}

func TestTimeNeverGoesBackInAHarness(t *testing.T) {
	h := newSorterHarness(t, weirtest.StartProcessingTime(1000))
	must(t, h.ProcessWatermark(100))
	if err := h.ProcessWatermark(99); !errors.Is(err, runtime.ErrHarness) {
		t.Fatalf("a watermark going back: %v, want ErrHarness", err)
	}
	if err := h.SetProcessingTime(999); !errors.Is(err, runtime.ErrHarness) {
		t.Fatalf("processing time going back: %v, want ErrHarness", err)
	}
	if h.ProcessingTime() != 1000 || h.CurrentWatermark() != 100 {
		t.Fatalf("clock %d, watermark %d after refused moves", h.ProcessingTime(), h.CurrentWatermark())
	}
}

// The operator's timer service reads the harness's clock, not the wall
// clock: a processing-time window assigns records by it and fires when the
// test moves it.
func TestAProcessingTimeWindowFollowsTheHarnessClock(t *testing.T) {
	h, err := weirtest.NewKeyedHarness(func(e Event) string { return e.User }, nil,
		func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[int64] {
			return runtime.Aggregate(runtime.Window(ks, runtime.TumblingProcessingTimeWindows(time.Minute)), "count", countEvents{}, nil)
		}, weirtest.StartProcessingTime(10_000))
	must(t, err)
	defer h.Close()
	must(t, h.ProcessElement(Event{"ann", 0}, runtime.NoTimestamp))
	must(t, h.AdvanceProcessingTime(30*time.Second)) // 40 000
	must(t, h.ProcessElement(Event{"ann", 0}, runtime.NoTimestamp))
	timers, err := h.Timers()
	must(t, err)
	if len(timers) != 1 || timers[0].Domain != runtime.ProcessingTime || timers[0].Timestamp != 60_000 {
		t.Fatalf("timers = %+v, want one processing-time timer at 60000 (the window [0,60000) of the harness clock)", timers)
	}
	must(t, h.SetProcessingTime(59_999))
	if out := h.Output(); len(out) != 0 {
		t.Fatalf("window fired before its end: %v", out)
	}
	must(t, h.SetProcessingTime(60_000))
	// A window's result carries its last millisecond, End-1, in
	// processing time too (Flink's emitWindowContents).
	if got := h.Output(); !slices.Equal(got, []weirtest.Record[int64]{{2, 59_999}}) {
		t.Fatalf("output at 60000 = %v, want 2 at the window's last millisecond, 59999", got)
	}
}

func TestAKeyedHarnessRefusesARecordOfAKeyItsSubtaskDoesNotOwn(t *testing.T) {
	h := newSorterHarness(t, weirtest.Subtask(0, 4))
	for i := range 20 {
		e := Event{fmt.Sprintf("u%d", i), 1}
		err := h.ProcessElement(e, 1)
		sub := h.SubtaskOf(e)
		switch {
		case sub == 0 && err != nil:
			t.Fatalf("%s (subtask 0's): %v", e.User, err)
		case sub != 0 && (!errors.Is(err, runtime.ErrHarness) || !strings.Contains(err.Error(), fmt.Sprintf("subtask %d does", sub))):
			t.Fatalf("%s (subtask %d's) into subtask 0: %v, want an ErrHarness naming subtask %d", e.User, sub, err, sub)
		}
	}
}

// Keyed state and timers move by key group: a snapshot at parallelism 1
// restored into 3 subtasks, and theirs merged and restored into 2, give
// every key its state and timers exactly once, in the subtask Weir's key
// groups assign it to.
func TestASnapshotRestoresAtAnotherParallelismByKeyGroup(t *testing.T) {
	const users = 24
	h := newSorterHarness(t)
	for i := range users {
		must(t, h.ProcessElement(Event{fmt.Sprintf("u%02d", i), int64(100 + i)}, int64(100+i)))
	}
	snap, err := h.Snapshot()
	must(t, err)

	rescale := func(snap weirtest.Snapshot, par int) ([]*weirtest.KeyedHarness[string, Event, string], weirtest.Snapshot) {
		var hs []*weirtest.KeyedHarness[string, Event, string]
		var merged weirtest.Snapshot
		seen := map[string]int{}
		for i := range par {
			h := newSorterHarness(t, weirtest.Subtask(i, par), weirtest.RestoreFrom(snap))
			timers, err := h.Timers()
			must(t, err)
			for _, tm := range timers {
				if sub := h.SubtaskOf(Event{User: tm.Key}); sub != i {
					t.Fatalf("parallelism %d: subtask %d restored a timer of %s, which subtask %d owns", par, i, tm.Key, sub)
				}
				seen[tm.Key]++
				buf, err := weirtest.MapEntries[int64, []string](h, "buffer", tm.Key)
				must(t, err)
				if len(buf[tm.Timestamp]) != 1 {
					t.Fatalf("parallelism %d: %s's buffer %v lacks its timer's record", par, tm.Key, buf)
				}
			}
			s, err := h.Snapshot()
			must(t, err)
			merged = merged.Merge(s)
			hs = append(hs, h)
		}
		if len(seen) != users {
			t.Fatalf("parallelism %d: %d keys restored, want %d", par, len(seen), users)
		}
		for k, n := range seen {
			if n != 1 {
				t.Fatalf("parallelism %d: key %s restored %d times", par, k, n)
			}
		}
		return hs, merged
	}
	_, at3 := rescale(snap, 3)
	if n := len(at3.Operators()); n != 3 {
		t.Fatalf("merged snapshot holds %d subtasks, want 3", n)
	}
	at2, _ := rescale(at3, 2)
	var out []string
	for _, h := range at2 {
		must(t, h.ProcessWatermark(runtime.MaxWatermark))
		out = append(out, h.Values()...)
	}
	if len(out) != users {
		t.Fatalf("after two rescales the timers emitted %d records, want %d: %v", len(out), users, out)
	}
}

// A record emitted to the main output and to side outputs keeps its
// place: each output is in emission order, with the timestamp of the
// record (or timer) being processed.
type splitter struct{ odd, big runtime.OutputTag[int] }

func (s splitter) Open(context.Context, *runtime.StateRegistry[string]) error { return nil }
func (s splitter) ProcessElement(ctx *runtime.KeyedContext[string], v int, out runtime.Collector[int]) error {
	if v%2 == 1 {
		runtime.Output(ctx, s.odd, v)
	}
	if v > 10 {
		runtime.Output(ctx, s.big, v)
	}
	out.Collect(v)
	return nil
}
func (s splitter) OnTimer(*runtime.KeyedContext[string], int64, runtime.Collector[int]) error {
	return nil
}

func TestEverySideOutputIsCollectedWithTimestampsInOrder(t *testing.T) {
	odd, big := runtime.NewOutputTag[int]("odd"), runtime.NewOutputTag[int]("big")
	h, err := weirtest.NewKeyedHarness(func(int) string { return "k" }, nil,
		func(ks *runtime.KeyedStream[string, int]) *runtime.Stream[int] {
			return runtime.ProcessKeyed(ks, "split", func() runtime.KeyedProcessor[string, int, int] { return splitter{odd, big} })
		})
	must(t, err)
	defer h.Close()
	for i, v := range []int{3, 12, 4, 13} {
		must(t, h.ProcessElement(v, int64(i*10)))
	}
	if got, want := weirtest.SideOutput(h, odd), []weirtest.Record[int]{{3, 0}, {13, 30}}; !slices.Equal(got, want) {
		t.Fatalf("odd = %v, want %v", got, want)
	}
	if got, want := weirtest.SideOutput(h, big), []weirtest.Record[int]{{12, 10}, {13, 30}}; !slices.Equal(got, want) {
		t.Fatalf("big = %v, want %v", got, want)
	}
	if got, want := h.Output(), []weirtest.Record[int]{{3, 0}, {12, 10}, {4, 20}, {13, 30}}; !slices.Equal(got, want) {
		t.Fatalf("main = %v, want %v", got, want)
	}
}

func TestAPlainOperatorKeepsItsInputsTimestamp(t *testing.T) {
	h, err := weirtest.NewHarness(func(in *runtime.Stream[string]) *runtime.Stream[string] {
		return runtime.FlatMap(in, "split", func(s string, out runtime.Collector[string]) error {
			for _, w := range strings.Fields(s) {
				out.Collect(w)
			}
			return nil
		})
	})
	must(t, err)
	defer h.Close()
	must(t, h.ProcessElement("a b", 7))
	must(t, h.ProcessElement("c", runtime.NoTimestamp))
	if got, want := h.Output(), []weirtest.Record[string]{{"a", 7}, {"b", 7}, {"c", runtime.NoTimestamp}}; !slices.Equal(got, want) {
		t.Fatalf("output = %v, want %v", got, want)
	}
}

// Bid is the right input of the two-input tests.
type Bid struct {
	User  string
	Price int
}

// spend keeps each user's bids in shared keyed state and answers every
// event (left) with the user's spend so far.
type spend struct{ total *runtime.ValueState[int] }

func (s *spend) Open(_ context.Context, st *runtime.StateRegistry[string]) error {
	var err error
	s.total, err = runtime.NewValueState[int](st, "total", nil)
	return err
}
func (s *spend) ProcessElement1(ctx *runtime.KeyedContext[string], e Event, out runtime.Collector[string]) error {
	n, _ := s.total.Value()
	out.Collect(fmt.Sprintf("%s spent %d", ctx.Key(), n))
	return nil
}
func (s *spend) ProcessElement2(_ *runtime.KeyedContext[string], b Bid, _ runtime.Collector[string]) error {
	n, _ := s.total.Value()
	s.total.Update(n + b.Price)
	return nil
}
func (s *spend) OnTimer(*runtime.KeyedContext[string], int64, runtime.Collector[string]) error {
	return nil
}

func TestAConnectedOperatorSharesKeyedStateBetweenItsInputsAcrossARestore(t *testing.T) {
	build := func(l *runtime.KeyedStream[string, Event], r *runtime.KeyedStream[string, Bid]) *runtime.Stream[string] {
		return runtime.ProcessConnected(runtime.Connect(l, r), "spend", func() runtime.KeyedCoProcessor[string, Event, Bid, string] { return &spend{} })
	}
	keyE, keyB := func(e Event) string { return e.User }, func(b Bid) string { return b.User }
	h, err := weirtest.NewKeyedTwoInputHarness(keyE, keyB, nil, build)
	must(t, err)
	must(t, h.ProcessElement2(Bid{"ann", 5}, 1))
	must(t, h.ProcessElement2(Bid{"ann", 7}, 2))
	must(t, h.ProcessElement1(Event{"ann", 3}, 3))
	snap, err := h.Snapshot()
	must(t, err)
	must(t, h.Close())
	h2, err := weirtest.NewKeyedTwoInputHarness(keyE, keyB, nil, build, weirtest.RestoreFrom(snap))
	must(t, err)
	defer h2.Close()
	must(t, h2.ProcessElement2(Bid{"ann", 1}, 4))
	must(t, h2.ProcessElement1(Event{"ann", 5}, 5))
	if got, want := h.Values(), []string{"ann spent 12"}; !slices.Equal(got, want) {
		t.Fatalf("before the restore: %v, want %v", got, want)
	}
	if got, want := h2.Output(), []weirtest.Record[string]{{"ann spent 13", 5}}; !slices.Equal(got, want) {
		t.Fatalf("after the restore: %v, want %v", got, want)
	}
	if n, ok, err := weirtest.Value[int](h2, "total", "ann"); err != nil || !ok || n != 13 {
		t.Fatalf("ann's total = %d, %v, %v; want 13", n, ok, err)
	}
}

func TestAnIntervalJoinHarnessJoinsPairsAndSendsLateRecordsToTheirSideOutput(t *testing.T) {
	h, err := weirtest.NewKeyedTwoInputHarness(func(e Event) string { return e.User }, func(b Bid) string { return b.User }, nil,
		func(l *runtime.KeyedStream[string, Event], r *runtime.KeyedStream[string, Bid]) *runtime.Stream[string] {
			return runtime.IntervalJoin(l, r, "join", runtime.Between(0, 10*time.Millisecond),
				func(ctx *runtime.JoinContext[string], e Event, b Bid, out runtime.Collector[string]) error {
					out.Collect(fmt.Sprintf("%s@%d bid %d", e.User, e.TS, b.Price))
					return nil
				})
		})
	must(t, err)
	defer h.Close()
	must(t, h.ProcessElement1(Event{"ann", 100}, 100))
	must(t, h.ProcessElement2(Bid{"ann", 1}, 105))
	must(t, h.ProcessElement2(Bid{"ann", 2}, 111)) // outside [100, 110]
	must(t, h.ProcessWatermark(120))
	must(t, h.ProcessElement1(Event{"ann", 101}, 101)) // late
	if got, want := h.Output(), []weirtest.Record[string]{{"ann@100 bid 1", 105}}; !slices.Equal(got, want) {
		t.Fatalf("joined = %v, want %v", got, want)
	}
	if got, want := weirtest.SideOutput(h, runtime.IntervalJoinLateLeft[Event]()), []weirtest.Record[Event]{{Event{"ann", 101}, 101}}; !slices.Equal(got, want) {
		t.Fatalf("late left = %v, want %v", got, want)
	}
	if timers, err := h.Timers(); err != nil || len(timers) != 0 {
		t.Fatalf("timers after watermark 120: %v, %v; want none (the join's state is cleaned up)", timers, err)
	}
}

func TestACoGroupWindowHarnessFiresEachWindowWithBothSides(t *testing.T) {
	h, err := weirtest.NewKeyedTwoInputHarness(func(e Event) string { return e.User }, func(b Bid) string { return b.User }, nil,
		func(l *runtime.KeyedStream[string, Event], r *runtime.KeyedStream[string, Bid]) *runtime.Stream[string] {
			return runtime.CoGroupWindow(l, r, "cogroup", runtime.TumblingEventTimeWindows(time.Second),
				func(ctx *runtime.WindowContext[string], es []Event, bs []Bid, out runtime.Collector[string]) error {
					out.Collect(fmt.Sprintf("%s %v: %d events %d bids", ctx.Key, ctx.Window, len(es), len(bs)))
					return nil
				})
		})
	must(t, err)
	defer h.Close()
	must(t, h.ProcessElement1(Event{"ann", 100}, 100))
	must(t, h.ProcessElement2(Bid{"ann", 1}, 200))
	must(t, h.ProcessElement2(Bid{"ann", 2}, 1200))
	must(t, h.ProcessWatermark(999))
	if got, want := h.Output(), []weirtest.Record[string]{{"ann [0,1000): 1 events 1 bids", 999}}; !slices.Equal(got, want) {
		t.Fatalf("at watermark 999: %v, want %v", got, want)
	}
}

func TestARestoreOfAnotherOperatorsSnapshotIsRefused(t *testing.T) {
	h := newSorterHarness(t)
	snap, err := h.Snapshot()
	must(t, err)
	_, err = weirtest.NewKeyedHarness(func(e Event) string { return e.User }, nil,
		func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[string] {
			return runtime.ProcessKeyed(ks, "other", newIdleCounter)
		}, weirtest.RestoreFrom(snap))
	if !errors.Is(err, runtime.ErrIncompatibleState) {
		t.Fatalf("restoring sorter's snapshot into another operator: %v, want ErrIncompatibleState", err)
	}
}

func TestAHarnessRefusesWhatAJobWouldRefuse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[string]
		opts  []weirtest.Opt
	}{
		{"an operator uid taken by the harness's input", func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[string] {
			return runtime.ProcessKeyed(ks, "sorter", newIdleCounter, runtime.UID("weirtest.input"))
		}, nil},
		{"a parallelism above the max parallelism", func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[string] {
			return runtime.ProcessKeyed(ks, "sorter", newIdleCounter)
		}, []weirtest.Opt{weirtest.MaxParallelism(4), weirtest.Subtask(0, 8)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := weirtest.NewKeyedHarness(func(e Event) string { return e.User }, nil, tc.build, tc.opts...)
			if !errors.Is(err, runtime.ErrInvalidJob) {
				if h != nil {
					h.Close()
				}
				t.Fatalf("got %v, want ErrInvalidJob", err)
			}
		})
	}
}

// A harness restores what a real job checkpointed: the final checkpoint
// of a bounded job run on the mini cluster at parallelism 2, restored into
// one harness, holds every key's count.
func TestAHarnessRestoresTheStateAJobCheckpointed(t *testing.T) {
	store, err := checkpoint.OpenStore("checkpoints", checkpoint.InMemory())
	must(t, err)
	defer store.Close()
	var events []Event
	want := map[string]int64{}
	for i := range 60 {
		u := fmt.Sprintf("u%d", i%7)
		events = append(events, Event{User: u})
		want[u]++
	}
	key := func(e Event) string { return e.User }
	counts := func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[string] {
		return runtime.Process(ks, "count", func() runtime.KeyedProcessFunction[string, Event, string] { return &counter{} })
	}
	j := runtime.NewJob("counts", runtime.DefaultParallelism(2))
	in := runtime.FromSource(j, "events", runtime.SliceSource(events, 5))
	runtime.SinkTo(counts(runtime.KeyBy(in, key, nil)), "out", runtime.SinkFunc(func(context.Context, string) error { return nil }))
	if _, err := runtime.NewMiniCluster(runtime.CheckpointStore(store), runtime.CheckpointInterval(10*time.Millisecond)).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	c, _, err := store.LatestUsable(t.Context(), "counts")
	must(t, err)
	snap, err := weirtest.SnapshotOf(c, "count")
	must(t, err)
	if n := len(snap.Operators()); n != 2 {
		t.Fatalf("the checkpoint holds %d subtasks of count, want 2", n)
	}
	h, err := weirtest.NewKeyedHarness(key, nil, counts, weirtest.RestoreFrom(snap))
	must(t, err)
	defer h.Close()
	for u, n := range want {
		got, ok, err := weirtest.Value[int64](h, "count", u)
		if err != nil || !ok || got != n {
			t.Fatalf("%s's count restored: %d, %v, %v; want %d", u, got, ok, err, n)
		}
	}
	if _, err := weirtest.SnapshotOf(c, "nothing"); err == nil {
		t.Fatal("SnapshotOf an operator the checkpoint does not hold succeeded")
	}
}

// committer is a keyed function that is a checkpoint listener.
type committer struct {
	idleCounter
	completed *[]checkpoint.ID
}

func (c *committer) NotifyCheckpointComplete(_ context.Context, id checkpoint.ID) error {
	*c.completed = append(*c.completed, id)
	return nil
}
func (c *committer) NotifyCheckpointAborted(context.Context, checkpoint.ID) error { return nil }

func TestAFunctionThatListensToCheckpointsHearsTheHarnessSnapshotComplete(t *testing.T) {
	var completed []checkpoint.ID
	h, err := weirtest.NewKeyedHarness(func(e Event) string { return e.User }, nil,
		func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[string] {
			return runtime.ProcessKeyed(ks, "committer", func() runtime.KeyedProcessor[string, Event, string] {
				return &committer{completed: &completed}
			})
		})
	must(t, err)
	defer h.Close()
	for range 2 {
		_, err := h.Snapshot()
		must(t, err)
		must(t, h.NotifyCheckpointComplete())
	}
	if !slices.Equal(completed, []checkpoint.ID{1, 2}) {
		t.Fatalf("completed checkpoints heard: %v, want [1 2]", completed)
	}
}
