package runtime

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// benchWindowOperator drives a window operator on the heap state backend
// with 16 keys: each round adds 100 records per key at rising event
// timestamps (10 per ms), then moves the watermark over them, firing what
// is due. ns/op is one round (1600 records).
func benchWindowOperator[ACC, OUT any](b *testing.B, asg WindowAssigner, fn windowFunc[string, int64, ACC, OUT]) {
	st := &harnessSubtask{b: newKeyedBackend[string](StringCodec(), 8)}
	st.timers = &harnessTimers{scope: &st.b.scope, wm: math.MinInt64, event: map[harnessTimer]bool{}, proc: map[harnessTimer]bool{}}
	op, err := newWindowOperator(&StateRegistry[string]{b: st.b}, asg, 0, fn, st.timers, func(TimeWindow, OUT) error { return nil }, nil)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 16)
	kgs := make([]int, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
		kgs[i] = int(hashString(keys[i]) % 8)
	}
	var ts int64
	for b.Loop() {
		for i := range 100 * len(keys) {
			k := i % len(keys)
			st.b.scope.setKey(keys[k], kgs[k])
			if err := op.processElement(keys[k], ts+int64(i/len(keys))/10, int64(i)); err != nil {
				b.Fatal(err)
			}
		}
		ts += 10
		wm := ts - 1
		st.timers.wm = wm
		for {
			tm, ok := nextTimer(st.timers.event, wm)
			if !ok {
				break
			}
			delete(st.timers.event, tm)
			st.b.scope.setKey(tm.key, int(hashString(tm.key)%8))
			if err := op.onTimer(tm.key, tm.ts, true); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(100*len(keys)*b.N)/b.Elapsed().Seconds(), "records/s")
}

// ProcessWindow's firing with the copy of the window's records its
// function gets, against handing it the state's slice (as before).
func BenchmarkProcessWindowFiring(b *testing.B) {
	var sum int64
	pf := ProcessWindowFunc[string, int64, int64](func(_ *WindowContext[string], els []int64, _ Collector[int64]) error {
		for _, v := range els {
			sum += v
		}
		return nil
	})
	for _, tc := range []struct {
		name string
		copy bool
	}{{"copy", true}, {"state-slice", false}} {
		b.Run(tc.name, func(b *testing.B) {
			benchWindowOperator(b, TumblingEventTimeWindows(10*time.Millisecond), processWindowFunc[string](pf, Int64Codec(), tc.copy))
		})
	}
}

// A sliding ReduceWindow (size/slide = 6) reducing every window in arrival
// order (one accumulator per window, as Flink) against reducing per pane
// and merging the panes (as before; not Flink's result for a function that
// is not commutative).
func BenchmarkSlidingReduceWindow(b *testing.B) {
	for _, tc := range []struct {
		name    string
		ordered bool
	}{{"per-window", true}, {"panes", false}} {
		b.Run(tc.name, func(b *testing.B) {
			wf := reduceWindowFunc[string](func(a, b int64) (int64, error) { return a + b, nil }, Int64Codec())
			wf.ordered = tc.ordered
			benchWindowOperator(b, SlidingEventTimeWindows(6*time.Millisecond, time.Millisecond), wf)
		})
	}
}
