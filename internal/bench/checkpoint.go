package bench

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// CheckpointCycle measures checkpoint latency from trigger to
// completed-and-notified, with a checkpoint every 100 ms, while the
// runtime-wordcount job runs flat out on the mini cluster (checkpoints stored
// in an in-memory pebble with synced batches).
func CheckpointCycle(ctx context.Context, cfg Config) ([]Line, error) {
	run := 10 * time.Second
	if cfg.Quick {
		run = 4 * time.Second
	}
	corpus := Corpus(2, 100_000, 10, 20_000)
	j, _ := wordcountJob(func() runtime.Source[string] { return &loopSource{lines: corpus} })
	var mu sync.Mutex
	var cycles []time.Duration
	ctx, cancel := context.WithTimeout(ctx, run)
	defer cancel()
	mc := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond),
		runtime.OnCheckpointComplete(func(e runtime.CheckpointEvent) {
			mu.Lock()
			cycles = append(cycles, e.Cycle)
			mu.Unlock()
		}))
	if _, err := mc.Run(ctx, j); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	if len(cycles) < 5 {
		return nil, fmt.Errorf("only %d checkpoints completed in %v", len(cycles), run)
	}
	sort.Slice(cycles, func(i, k int) bool { return cycles[i] < cycles[k] })
	pct := func(p float64) float64 {
		return float64(cycles[int(p*float64(len(cycles)-1))].Microseconds()) / 1000
	}
	note := fmt.Sprintf("%d checkpoints in %v under wordcount load", len(cycles), run)
	return []Line{
		{Bench: "checkpoint-cycle", Metric: "p50_ms", Value: pct(0.5), Note: note},
		{Bench: "checkpoint-cycle", Metric: "p99_ms", Value: pct(0.99), Note: note},
	}, nil
}

// loopSource emits its lines over and over until cancelled; its state is its
// position.
type loopSource struct {
	lines []string
	next  int
}

func (s *loopSource) Open(context.Context, *runtime.OperatorContext) error { return nil }

func (s *loopSource) Poll(_ context.Context, out runtime.Collector[string]) error {
	for i := 0; i < 64; i++ {
		out.Collect(s.lines[s.next])
		s.next = (s.next + 1) % len(s.lines)
	}
	return nil
}

func (s *loopSource) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{Entries: [][]byte{fmt.Appendf(nil, "%d", s.next)}}, nil
}

func (s *loopSource) Close() error { return nil }
