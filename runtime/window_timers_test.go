package runtime

import (
	"maps"
	"math"
	"slices"
	"testing"
	"time"
)

// countingTimers counts the window operator's timer registrations.
type countingTimers struct {
	*harnessTimers
	registered int
}

func (c *countingTimers) registerEventTimeTimer(ts int64) {
	c.registered++
	c.harnessTimers.registerEventTimeTimer(ts)
}

// slidingSumOperator is a sliding event-time sum (size 10 ms, slide 2 ms)
// on the heap backend, restored from blobs if any, with its timers and
// what it emits.
func slidingSumOperator(t *testing.T, asg WindowAssigner, blobs map[int][]byte) (*keyedBackend[string], *countingTimers, *windowOperator[string, int64, int64, int64], *[]string) {
	t.Helper()
	b := newKeyedBackend[string](StringCodec(), 8)
	for kg, blob := range blobs {
		if err := b.restoreKeyGroup(kg, blob); err != nil {
			t.Fatal(err)
		}
	}
	tm := &countingTimers{harnessTimers: &harnessTimers{scope: &b.scope, wm: math.MinInt64, event: map[harnessTimer]bool{}, proc: map[harnessTimer]bool{}}}
	var out []string
	fn := aggregateWindowFunc[string](sumInts{}, Int64Codec())
	op, err := newWindowOperator(&StateRegistry[string]{b: b}, asg, 0, fn, tm, func(w TimeWindow, v int64) error {
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
// window still fires, with every pane's records.
func TestSlidingPanesRegisterEachWindowsTimerOnce(t *testing.T) {
	asg := SlidingEventTimeWindows(10*time.Millisecond, 2*time.Millisecond)
	b, tm, op, out := slidingSumOperator(t, asg, nil)
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
	tb, ttm, top, _ := slidingSumOperator(t, TumblingEventTimeWindows(2*time.Millisecond), nil)
	tb.scope.setKey("a", 0)
	if err := top.processElement("a", 0, 1); err != nil {
		t.Fatal(err)
	}
	if ttm.registered != 1 {
		t.Fatalf("the tumbling window registered %d timers", ttm.registered)
	}
	blobs := snapshotBlobs(t, tb)

	asg := SlidingEventTimeWindows(10*time.Millisecond, 2*time.Millisecond)
	b, tm, op, out := slidingSumOperator(t, asg, blobs)
	tm.event[harnessTimer{"a", 1}] = true // the tumbling window's timer, restored
	for _, ts := range []int64{2, 12} {
		b.scope.setKey("a", 0)
		if err := op.processElement("a", ts, 10); err != nil {
			t.Fatal(err)
		}
	}
	// The pane at 2 registers its five windows (starting at -6 to 2)
	// although four hold the restored pane [0,2); the pane at 12 registers
	// its five (starting at 4 to 12), none holding the pane at 2.
	if tm.registered != 10 {
		t.Errorf("%d registrations, want 10", tm.registered)
	}
	fireAll(t, b, tm, op, math.MaxInt64)
	wantFired := []string{"[-8,2)=1ns", "[-6,4)=11ns", "[-4,6)=11ns", "[-2,8)=11ns", "[0,10)=11ns", "[2,12)=10ns",
		"[4,14)=10ns", "[6,16)=10ns", "[8,18)=10ns", "[10,20)=10ns", "[12,22)=10ns"}
	if !slices.Equal(*out, wantFired) {
		t.Errorf("fired %v, want %v", *out, wantFired)
	}
}
