package runtime

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// countingSink counts what it writes.
type countingSink[T any] struct{ n *atomic.Int64 }

func (s countingSink[T]) Open(context.Context, *OperatorContext) error { return nil }
func (s countingSink[T]) Write(context.Context, T) error               { s.n.Add(1); return nil }
func (s countingSink[T]) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s countingSink[T]) Close() error { return nil }

// handJoin is the interval join [lo, hi] of cs and bs written as one
// loop: both sides buffered by key, each record joined against the other
// side's buffer on arrival (the inputs interleaved record by record), no
// cleanup (the inputs are bounded). It returns the number of pairs.
func handJoin(cs []click, bs []bid, lo, hi int64) int {
	left, right := map[string][]click{}, map[string][]bid{}
	n := 0
	for i := range max(len(cs), len(bs)) {
		if i < len(cs) {
			c := cs[i]
			left[c.Key] = append(left[c.Key], c)
			for _, b := range right[c.Key] {
				if d := b.At - c.TS; d >= lo && d <= hi {
					n++
				}
			}
		}
		if i < len(bs) {
			b := bs[i]
			right[b.User] = append(right[b.User], b)
			for _, c := range left[b.User] {
				if d := b.At - c.TS; d >= lo && d <= hi {
					n++
				}
			}
		}
	}
	return n
}

// The interval join as a job (two sources, the keyed two-input operator,
// a sink; parallelism 1, checkpoints every 100 ms) against handJoin, on
// the same input: ns/op is one run over the whole input; pairs/s compares.
func BenchmarkIntervalJoin(b *testing.B) {
	cs, bs := joinInputs(1, 20000, 20)
	want := handJoin(cs, bs, -10, 15)
	b.Run("job", func(b *testing.B) {
		for b.Loop() {
			var n atomic.Int64
			j := NewJob("bench", MaxParallelism(8))
			left, right := joinSources(j, cs, bs, 20, 1, 256, 256, nil)
			joined := IntervalJoin(left, right, "join", Between(-10*time.Millisecond, 15*time.Millisecond),
				func(_ *JoinContext[string], _ click, _ bid, out Collector[int]) error { out.Collect(1); return nil })
			SinkTo(joined, "sink", func() Sink[int] { return countingSink[int]{n: &n} })
			if _, err := NewMiniCluster(CheckpointInterval(100*time.Millisecond)).Run(b.Context(), j); err != nil {
				b.Fatal(err)
			}
			if int(n.Load()) != want {
				b.Fatalf("%d pairs, the loop %d", n.Load(), want)
			}
		}
		b.ReportMetric(float64(want)*float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	})
	b.Run("hand-written-loop", func(b *testing.B) {
		for b.Loop() {
			if got := handJoin(cs, bs, -10, 15); got != want {
				b.Fatal(got)
			}
		}
		b.ReportMetric(float64(want)*float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	})
}
