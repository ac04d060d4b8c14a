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
//
// It measures a number of checkpoints (30 with Quick, 100 without), however
// long they take: a loaded machine makes the run longer, never makes it fail.
// cycleLimit only stops a run whose checkpoints do not complete at all.
func CheckpointCycle(ctx context.Context, cfg Config) ([]Line, error) {
	want := 100
	if cfg.Quick {
		want = 30
	}
	if cfg.checkpoints > 0 {
		want = cfg.checkpoints
	}
	corpus := Corpus(2, 100_000, 10, 20_000)
	j, _ := wordcountJob(func() runtime.Source[string] { return &loopSource{lines: corpus} })
	var mu sync.Mutex
	var cycles []time.Duration
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	mc := runtime.NewMiniCluster(append([]runtime.ClusterOpt{runtime.CheckpointInterval(100 * time.Millisecond), runtime.MinPause(0),
		runtime.OnCheckpointComplete(func(e runtime.CheckpointEvent) {
			mu.Lock()
			defer mu.Unlock()
			if len(cycles) < want {
				cycles = append(cycles, e.Cycle)
				cfg.progress("checkpoint-cycle: %d/%d checkpoints", len(cycles), want)
			}
			if len(cycles) == want {
				cancel()
			}
		})}, cfg.clusterOpts...)...)
	runCtx, stop := context.WithTimeoutCause(ctx, cycleLimit, errTooSlow)
	defer stop()
	_, err := mc.Run(runCtx, j)
	mu.Lock()
	defer mu.Unlock()
	switch {
	case len(cycles) == want:
		// Complete: Run returned because we cancelled it.
	case err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if cerr := context.Cause(runCtx); cerr != nil && !errors.Is(cerr, context.Canceled) {
			err = cerr
		}
		return nil, fmt.Errorf("only %d of %d checkpoints completed in %v: %w", len(cycles), want, time.Since(start).Round(time.Second), err)
	default:
		return nil, err
	}
	sort.Slice(cycles, func(i, k int) bool { return cycles[i] < cycles[k] })
	pct := func(p float64) float64 {
		return float64(cycles[int(p*float64(len(cycles)-1))].Microseconds()) / 1000
	}
	note := fmt.Sprintf("%d checkpoints in %v under wordcount load", len(cycles), time.Since(start).Round(100*time.Millisecond))
	lines := []Line{
		{Bench: "checkpoint-cycle", Metric: "p50_ms", Value: pct(0.5), Note: note},
		{Bench: "checkpoint-cycle", Metric: "p99_ms", Value: pct(0.99), Note: note},
	}
	more, err := checkpointCycleStorage(parent, cfg)
	if err != nil {
		return nil, fmt.Errorf("checkpoint storage: %w", err)
	}
	return append(lines, more...), nil
}

// cycleLimit bounds a checkpoint-cycle run whose checkpoints stop completing
// (a bug, not a slow machine: 30 checkpoints take a few seconds).
const cycleLimit = 10 * time.Minute

var errTooSlow = errors.New("checkpoints stopped completing")

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
