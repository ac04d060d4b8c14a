package runtime

import (
	"maps"
	"math"
	"slices"
	"testing"
	"time"
)

// countingTimers counts the window operator's timer registrations, and
// keeps them in the subtask's default timer service too, as the runtime
// does, so that a snapshot holds them (the harness fires its own).
type countingTimers struct {
	*harnessTimers
	svc        *Timers[string, struct{}]
	registered int
}

func (c *countingTimers) registerEventTimeTimer(ts int64) {
	c.registered++
	c.harnessTimers.registerEventTimeTimer(ts)
	c.svc.RegisterEventTimeTimer(struct{}{}, ts)
}

// slidingSumOperator is a window sum of asg on the heap backend, or on
// pebble, restored from blobs if any, with its timers and what it emits.
func slidingSumOperator(t *testing.T, onPebble bool, asg WindowAssigner, blobs map[int][]byte) (*keyedBackend[string], *countingTimers, *windowOperator[string, int64, int64, int64], *[]string) {
	t.Helper()
	b := newKeyedBackend[string](StringCodec(), 8)
	if onPebble {
		b.usePebble(testPebbleState(t, 8))
	}
	for kg, blob := range blobs {
		if err := b.restoreKeyGroup(kg, blob); err != nil {
			t.Fatal(err)
		}
	}
	reg := &StateRegistry[string]{b: b}
	svc, err := NewTimers[struct{}](reg, "", Codec[struct{}](voidCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	tm := &countingTimers{harnessTimers: &harnessTimers{scope: &b.scope, wm: math.MinInt64, event: map[harnessTimer]bool{}, proc: map[harnessTimer]bool{}}, svc: svc}
	var out []string
	fn := aggregateWindowFunc[string](sumInts{}, Int64Codec())
	op, err := newWindowOperator(reg, asg, 0, fn, tm, func(w TimeWindow, v int64) error {
		out = append(out, w.String()+"="+time.Duration(v).String())
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b, tm, op, &out
}

// sumInts sums int64 records.
type sumInts struct{}

func (sumInts) CreateAccumulator() int64     { return 0 }
func (sumInts) Add(v int64, acc int64) int64 { return acc + v }
func (sumInts) GetResult(acc int64) int64    { return acc }
func (sumInts) Merge(a, b int64) int64       { return a + b }

// fireAll moves the watermark to wm, firing the due timers in order.
func fireAll(t *testing.T, b *keyedBackend[string], tm *countingTimers, op *windowOperator[string, int64, int64, int64], wm int64) {
	t.Helper()
	tm.wm = wm
	for {
		next, ok := nextTimer(tm.event, wm)
		if !ok {
			return
		}
		delete(tm.event, next)
		b.scope.setKey(next.key, 0)
		if err := op.onTimer(next.key, next.ts, true); err != nil {
			t.Fatal(err)
		}
	}
}

// A key's panes of sliding windows register each window's fire timer
// once: a pane whose windows hold an earlier pane of the key does not
// register their timers again (q5's sliding windows registered five a
// pane, and each registration probes the timer queue's set), and every
// window still fires, with every pane's records. On pebble too, where a
// registration beyond the timer queue's head is a write (q5 at 100M).
func TestSlidingPanesRegisterEachWindowsTimerOnce(t *testing.T) {
	for _, onPebble := range []bool{false, true} {
		t.Run(map[bool]string{false: "heap", true: "pebble"}[onPebble], func(t *testing.T) {
			testSlidingPanesRegisterEachWindowsTimerOnce(t, onPebble)
		})
	}
}

func testSlidingPanesRegisterEachWindowsTimerOnce(t *testing.T, onPebble bool) {
	asg := SlidingEventTimeWindows(10*time.Millisecond, 2*time.Millisecond)
	b, tm, op, out := slidingSumOperator(t, onPebble, asg, nil)
	b.scope.setKey("a", 0)
	for ts := int64(0); ts < 20; ts += 2 { // ten panes
		b.scope.setKey("a", 0)
		if err := op.processElement("a", ts, 1); err != nil {
			t.Fatal(err)
		}
	}
	// Windows starting at -8, -6, ..., 18: 14 of them.
	if tm.registered != 14 {
		t.Errorf("%d timer registrations for the 14 windows of ten panes, want 14", tm.registered)
	}
	want := map[harnessTimer]bool{}
	for s := int64(-8); s <= 18; s += 2 {
		want[harnessTimer{"a", s + 9}] = true
	}
	if !maps.Equal(tm.event, want) {
		t.Errorf("timers %v, want %v", sortedTimers(tm.event), sortedTimers(want))
	}
	fireAll(t, b, tm, op, math.MaxInt64)
	if len(*out) != 14 || (*out)[4] != "[0,10)=5ns" || (*out)[13] != "[18,28)=1ns" {
		t.Errorf("fired %v", *out)
	}
}

// After a restore, a pane whose windows hold a restored pane registers
// their timers: the restored pane's timers are those its job set, which
// need not be these windows' (here a tumbling window of 2 ms, restored
// into sliding windows of 10 ms with the same panes). Panes past every
// restored window skip the registrations again.
func TestSlidingPanesRegisterTimersOfWindowsHoldingRestoredPanes(t *testing.T) {
	for _, onPebble := range []bool{false, true} {
		t.Run(map[bool]string{false: "heap", true: "pebble"}[onPebble], func(t *testing.T) {
			testSlidingPanesRegisterTimersOfWindowsHoldingRestoredPanes(t, onPebble)
		})
	}
}

func testSlidingPanesRegisterTimersOfWindowsHoldingRestoredPanes(t *testing.T, onPebble bool) {
	tb, _, top, _ := slidingSumOperator(t, onPebble, TumblingEventTimeWindows(2*time.Millisecond), nil)
	tb.scope.setKey("a", 0)
	if err := top.processElement("a", 0, 1); err != nil {
		t.Fatal(err)
	}
	blobs := snapshotBlobs(t, tb)

	asg := SlidingEventTimeWindows(10*time.Millisecond, 2*time.Millisecond)
	b, tm, op, out := slidingSumOperator(t, onPebble, asg, blobs)
	if n := tm.svc.Len(EventTime); n != 1 {
		t.Fatalf("%d timers restored, want the tumbling window's", n)
	}
	tm.event[harnessTimer{"a", 1}] = true // the tumbling window's timer, for the harness to fire
	for _, ts := range []int64{2, 12, 14} {
		b.scope.setKey("a", 0)
		if err := op.processElement("a", ts, 10); err != nil {
			t.Fatal(err)
		}
	}
	// The pane at 2 registers its five windows (starting at -6 to 2)
	// although four hold the restored pane [0,2); the pane at 12 registers
	// its five (starting at 4 to 12), none holding the pane at 2; the pane
	// at 14 only the window starting at 14: the other four hold the pane
	// at 12, made after the restore.
	if tm.registered != 11 {
		t.Errorf("%d registrations, want 11", tm.registered)
	}
	fireAll(t, b, tm, op, math.MaxInt64)
	wantFired := []string{"[-8,2)=1ns", "[-6,4)=11ns", "[-4,6)=11ns", "[-2,8)=11ns", "[0,10)=11ns", "[2,12)=10ns",
		"[4,14)=10ns", "[6,16)=20ns", "[8,18)=20ns", "[10,20)=20ns", "[12,22)=20ns", "[14,24)=10ns"}
	if !slices.Equal(*out, wantFired) {
		t.Errorf("fired %v, want %v", *out, wantFired)
	}
}
