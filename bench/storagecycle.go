package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/s3server"
	"github.com/weirstream/weir/runtime"
)

// Checkpoint storage sides of checkpoint-cycle.
const (
	sidePebble      = "pebble-inline"  // state inline in the acks and the in-memory pebble store
	sideS3Full      = "s3-full"        // every key group written to the embedded S3 at each checkpoint
	sideS3Increment = "s3-incremental" // only the key groups changed since the last confirmed checkpoint
)

// storageCycleResult is one side's run: checkpoint cycles and the bytes
// each checkpoint wrote, after the state was loaded.
type storageCycleResult struct {
	p50      float64 // ms
	uploaded float64 // median bytes a checkpoint added
	size     float64 // median full state bytes
}

// checkpointCycleStorage measures the cycle of checkpoints of a job with
// much keyed state of which little changes between checkpoints (keys
// loaded once, then a few hot keys updated): state inline with the pebble
// store, then on the embedded S3 server with full and incremental
// checkpoints, in the same run.
func checkpointCycleStorage(ctx context.Context, cfg Config) ([]Line, error) {
	keys, want := 200_000, 30
	if cfg.Quick {
		keys, want = 50_000, 10
	}
	if cfg.tiny {
		keys, want = 3_000, 3
	}
	if cfg.checkpoints > 0 {
		want = min(want, cfg.checkpoints)
	}
	srv, err := s3server.Start(ctx, s3server.Buckets("weir"))
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	results := map[string]storageCycleResult{}
	for i, side := range []string{sidePebble, sideS3Full, sideS3Increment} {
		var opts []runtime.ClusterOpt
		if side != sidePebble {
			u := srv.URL("weir", fmt.Sprintf("run-%d", i))
			st, err := storage.Open(ctx, u, storage.Credentials("weir", "weir"))
			if err != nil {
				return nil, err
			}
			defer st.Close()
			opts = append(opts, runtime.StateStorage(st, u))
			if side == sideS3Full {
				opts = append(opts, runtime.FullCheckpoints())
			}
		}
		r, err := storageCycleRun(ctx, cfg, keys, want, side, opts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", side, err)
		}
		results[side] = r
	}
	base, full, inc := results[sidePebble], results[sideS3Full], results[sideS3Increment]
	note := fmt.Sprintf("%d checkpoints per side, 100 ms apart, of %d keys (%.1f MB of state) of which 16 change; embedded S3 in process",
		want, keys, full.size/1e6)
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return round3(a / b)
	}
	return []Line{
		{Bench: "checkpoint-cycle", Metric: "s3_full_p50_ms", Value: round3(full.p50), Baseline: sidePebble, BaselineValue: round3(base.p50), Ratio: ratio(full.p50, base.p50), Note: note},
		{Bench: "checkpoint-cycle", Metric: "s3_incremental_p50_ms", Value: round3(inc.p50), Baseline: sidePebble, BaselineValue: round3(base.p50), Ratio: ratio(inc.p50, base.p50), Note: note},
		{Bench: "checkpoint-cycle", Metric: "s3_incremental_bytes", Value: inc.uploaded, Baseline: sideS3Full, BaselineValue: full.uploaded, Ratio: ratio(inc.uploaded, full.uploaded), Note: note},
	}, nil
}

// storageCycleRun runs the hot-keys job until want checkpoints triggered
// after the state was loaded completed.
func storageCycleRun(ctx context.Context, cfg Config, keys, want int, side string, opts []runtime.ClusterOpt) (storageCycleResult, error) {
	var loaded atomic.Int64 // unix nanos when the source loaded every key
	j := hotKeysJob(keys, &loaded)
	var mu sync.Mutex
	var cycles []time.Duration
	var uploaded, sizes []float64
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mc := runtime.NewMiniCluster(append(append([]runtime.ClusterOpt{runtime.CheckpointInterval(100 * time.Millisecond), runtime.MinPause(0),
		runtime.OnCheckpointComplete(func(e runtime.CheckpointEvent) {
			l := loaded.Load()
			if l == 0 || e.Triggered.UnixNano() < l {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if len(cycles) < want {
				cycles = append(cycles, e.Cycle)
				uploaded, sizes = append(uploaded, float64(e.Uploaded)), append(sizes, float64(e.Size))
				cfg.progress("checkpoint-cycle %s: %d/%d checkpoints", side, len(cycles), want)
			}
			if len(cycles) == want {
				cancel()
			}
		})}, opts...), cfg.clusterOpts...)...)
	runCtx, stop := context.WithTimeoutCause(ctx, cycleLimit, errTooSlow)
	defer stop()
	_, err := mc.Run(runCtx, j)
	mu.Lock()
	defer mu.Unlock()
	if len(cycles) < want {
		if err == nil || errors.Is(err, context.Canceled) {
			err = context.Cause(runCtx)
		}
		return storageCycleResult{}, fmt.Errorf("only %d of %d checkpoints completed: %w", len(cycles), want, err)
	}
	ms := make([]float64, len(cycles))
	for i, c := range cycles {
		ms[i] = float64(c.Microseconds()) / 1000
	}
	return storageCycleResult{p50: median(ms), uploaded: median(uploaded), size: median(sizes)}, nil
}

// hotKeysJob loads keys keys of 64-byte values, then updates 16 hot keys
// about 16000 times a second; a keyed operator keeps each key's latest
// value.
func hotKeysJob(keys int, loaded *atomic.Int64) *runtime.Job {
	j := runtime.NewJob("bench-hot-keys", runtime.DefaultParallelism(2))
	updates := runtime.FromSource(j, "updates", func() runtime.Source[kv] { return &hotKeysSource{keys: keys, loaded: loaded} }, runtime.Parallelism(1))
	kept := runtime.Process(runtime.KeyBy(updates, func(u kv) string { return u.K }, nil), "keep", func() runtime.KeyedProcessFunction[string, kv, int] {
		return &keepLatest{}
	})
	runtime.SinkTo(kept, "discard", func() runtime.Sink[int] { return discardSink{} })
	return j
}

// kv is an update of a key's value.
type kv struct {
	K string
	V []byte
}

// hotKeysSource emits every key once, then updates of 16 hot keys.
type hotKeysSource struct {
	keys   int
	next   int
	round  byte
	loaded *atomic.Int64
}

func (s *hotKeysSource) Open(context.Context, *runtime.OperatorContext) error { return nil }

func (s *hotKeysSource) Poll(_ context.Context, out runtime.Collector[kv]) error {
	if s.next < s.keys {
		for end := min(s.next+1000, s.keys); s.next < end; s.next++ {
			out.Collect(kv{K: fmt.Sprintf("key-%07d", s.next), V: value(s.next, 0)})
		}
		if s.next == s.keys {
			s.loaded.Store(time.Now().UnixNano())
		}
		return nil
	}
	time.Sleep(time.Millisecond)
	s.round++
	for k := range 16 {
		out.Collect(kv{K: fmt.Sprintf("key-%07d", k*7919%s.keys), V: value(k, s.round)})
	}
	return nil
}

func value(k int, round byte) []byte {
	v := make([]byte, 64)
	for i := range v {
		v[i] = byte(k>>(i%24)) ^ round
	}
	return v
}

func (s *hotKeysSource) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{Entries: [][]byte{fmt.Appendf(nil, "%d/%d", s.next, s.round)}}, nil
}

func (s *hotKeysSource) Close() error { return nil }

// keepLatest keeps each key's latest value.
type keepLatest struct{ v *runtime.ValueState[[]byte] }

func (k *keepLatest) Open(_ context.Context, st *runtime.StateRegistry[string]) error {
	var err error
	k.v, err = runtime.NewValueState[[]byte](st, "latest", nil)
	return err
}

func (k *keepLatest) Process(_ string, u kv, _ runtime.Collector[int]) error {
	k.v.Update(u.V)
	return nil
}

type discardSink struct{}

func (discardSink) Open(context.Context, *runtime.OperatorContext) error { return nil }
func (discardSink) Write(context.Context, int) error                     { return nil }
func (discardSink) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{}, nil
}
func (discardSink) Close() error { return nil }
