package runtime

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// endlessSource emits increasing integers forever.
type endlessSource struct {
	emitted *atomic.Int64
	next    int64
}

func (s *endlessSource) Open(context.Context, *OperatorContext) error { return nil }
func (s *endlessSource) Poll(_ context.Context, out Collector[int64]) error {
	for i := 0; i < 64; i++ {
		s.next++
		out.Collect(s.next)
		s.emitted.Add(1)
	}
	return nil
}
func (s *endlessSource) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s *endlessSource) Close() error { return nil }

func TestSlowSinkBoundsRecordsInFlight(t *testing.T) {
	const batch, capacity, perPoll = 32, 2, 64
	var emitted, received atomic.Int64
	j := NewJob("backpressure")
	nums := FromSource(j, "numbers", func() Source[int64] { return &endlessSource{emitted: &emitted} })
	keyed := KeyBy(nums, func(v int64) int64 { return v % 7 }, nil)
	sums := Reduce(keyed, "sum", func(a, b int64) (int64, error) { return a + b, nil }, nil)
	SinkTo(sums, "slow", SinkFunc(func(context.Context, int64) error {
		time.Sleep(20 * time.Microsecond)
		received.Add(1)
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := NewMiniCluster(BatchSize(batch), ChannelCapacity(capacity), CheckpointInterval(20*time.Millisecond)).Run(ctx, j)
		done <- err
	}()
	// Every record between source and sink sits in: the source's poll, the
	// writer's buffer, the channel, and the batch being processed.
	bound := int64(perPoll + batch + capacity*batch + batch)
	var maxInFlight int64
	deadline := time.Now().Add(600 * time.Millisecond)
	for time.Now().Before(deadline) {
		if d := emitted.Load() - received.Load(); d > maxInFlight {
			maxInFlight = d
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
	if received.Load() == 0 {
		t.Fatal("sink received nothing")
	}
	t.Logf("emitted %d, received %d, max in flight %d (bound %d)", emitted.Load(), received.Load(), maxInFlight, bound)
	if maxInFlight > bound {
		t.Fatalf("%d records in flight behind a slow sink, want at most %d: backpressure does not hold", maxInFlight, bound)
	}
}
