package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/runtime"
)

// Nexmark at a chosen size on chosen state backends (Config.NexmarkBackends,
// streamctl bench --nexmark-backends): each query runs to completion in a
// process of its own, so that its peak RSS is the process's and nothing
// of another run stays in its heap.

// nexmarkStandardInterval is the checkpoint interval of the standard-size
// runs: Flink's published Nexmark runs checkpoint every 10 s.
const nexmarkStandardInterval = 10 * time.Second

// ErrBadNexmarkRun is wrapped by errors about a NexmarkRunSpec.
var ErrBadNexmarkRun = errors.New("bad nexmark run")

// NexmarkRunSpec is one query run on one state backend.
type NexmarkRunSpec struct {
	Query   string `json:"query"`
	Backend string `json:"backend"`
	Events  int64  `json:"events"`
	// Interval is the checkpoint interval.
	Interval time.Duration `json:"interval"`
	// StateMemory is the pebble backend's memory budget in bytes (0:
	// runtime.DefaultStateMemory()). nexmarkStandard sets it to
	// FlinkNexmarkStateMemory unless told otherwise.
	StateMemory int64 `json:"state_memory,omitempty"`
}

// NexmarkRunResult is what one run measured.
type NexmarkRunResult struct {
	Spec NexmarkRunSpec `json:"spec"`
	// Wall and CPU are the run's wall-clock time and the process's user
	// plus system CPU time over it (getrusage).
	Wall time.Duration `json:"wall"`
	CPU  time.Duration `json:"cpu"`
	// PeakRSS is the process's peak resident set size in bytes (Linux's
	// VmHWM; the parent's rusage maxrss of the child when it ran in a
	// process of its own, whichever is larger).
	PeakRSS int64 `json:"peak_rss"`
	// Checkpoints counts the completed checkpoints.
	Checkpoints int `json:"checkpoints"`
	// Largest is the completed checkpoint with the largest state.
	Largest CheckpointTimes `json:"largest"`
	// LongestSync is the longest synchronous part of any completed
	// checkpoint.
	LongestSync time.Duration `json:"longest_sync"`
	// Longest is the completed checkpoint with the longest end-to-end
	// duration.
	Longest CheckpointTimes `json:"longest"`
	// LongestRunning is the longest of the completed checkpoints
	// triggered while every source ran: the others' barriers follow a
	// source's final watermark, so their durations include the firing of
	// every window and timer left (runtime.CheckpointEvent.AfterSourceEnd).
	LongestRunning CheckpointTimes `json:"longest_running"`
}

// CheckpointTimes are one checkpoint's size and durations: Sync is the
// longest synchronous part among its tasks, Async the longest
// asynchronous part, Total from the trigger to the notifications sent.
type CheckpointTimes struct {
	ID    checkpoint.ID `json:"id"`
	Size  int64         `json:"size"`
	Sync  time.Duration `json:"sync"`
	Async time.Duration `json:"async"`
	Total time.Duration `json:"total"`
	// At is when it was triggered, from the start of the run.
	At time.Duration `json:"at"`
}

// RunNexmarkProcess runs one NexmarkRunSpec in a process of its own
// (streamctl bench: a hidden command of its own binary that calls
// RunNexmarkQuery) and returns its result with the process's peak RSS.
type RunNexmarkProcess func(ctx context.Context, spec NexmarkRunSpec) (NexmarkRunResult, error)

// flinkPerCore and felderaPerCore are the published per-core Nexmark
// figures issue 37 compares with (events per second per core): Flink
// 1.13 on RocksDB, and Feldera.
var (
	flinkPerCore   = map[string]float64{"q0": 155e3, "q1": 158e3, "q2": 175e3, "q3": 152e3, "q4": 34e3, "q5": 22e3, "q7": 12e3, "q8": 146e3}
	felderaPerCore = map[string]float64{"q0": 436e3, "q1": 412e3, "q2": 422e3, "q3": 413e3, "q4": 265e3, "q5": 412e3, "q7": 196e3, "q8": 415e3}
)

// FlinkNexmarkStateMemory is the pebble budget of the standard-size runs
// unless Config.NexmarkStateMemory sets one: the RocksDB memory of the
// Flink runs whose figures they compare with, per slot, times the runs'
// parallelism (a slot each). nexmark-flink's flink-conf.yaml gives each
// task manager (one slot) a 4096 MiB process with a managed memory
// fraction of 0.23; Flink takes the JVM overhead (a tenth of the process,
// 409.6 MiB) and the metaspace (256 MiB) off the process before the
// fraction: 0.23 x 3430.4 MiB = 789 MiB a slot.
const FlinkNexmarkStateMemory = nexmarkPar * 789 << 20

// nexmarkStandard runs every query (or cfg.NexmarkQueries) to completion
// on each of cfg.NexmarkBackends, one process per run, and reports per
// query and backend the events per CPU-second (value; baseline: Flink's
// published per-core figure on pebble, Feldera's on heap, where
// published), the peak RSS and the largest checkpoint.
func nexmarkStandard(ctx context.Context, cfg Config, events int64) ([]Line, error) {
	backends := make([]runtime.StateBackendKind, 0, len(cfg.NexmarkBackends))
	for _, b := range cfg.NexmarkBackends {
		k, err := runtime.ParseStateBackend(b)
		if err != nil {
			return nil, fmt.Errorf("--nexmark-backends: %w", err)
		}
		backends = append(backends, k)
	}
	queries := nexmark.Queries()
	if len(cfg.NexmarkQueries) > 0 {
		for _, q := range cfg.NexmarkQueries {
			if !slices.Contains(queries, q) {
				return nil, fmt.Errorf("%w: no query %q: the queries are %s", ErrBadNexmarkRun, q, strings.Join(queries, ", "))
			}
		}
		queries = cfg.NexmarkQueries
	}
	run := cfg.NexmarkProcess
	if run == nil {
		run = RunNexmarkQuery
	}
	var out []Line
	for _, q := range queries {
		for _, b := range backends {
			spec := NexmarkRunSpec{Query: q, Backend: string(b), Events: events, Interval: nexmarkStandardInterval, StateMemory: cfg.NexmarkStateMemory}
			if spec.StateMemory == 0 && b == runtime.PebbleState {
				spec.StateMemory = FlinkNexmarkStateMemory
			}
			cfg.progress("%s on %s, %d events", q, b, events)
			r, err := run(ctx, spec)
			if err != nil {
				return nil, fmt.Errorf("%s on %s: %w", q, b, err)
			}
			out = append(out, nexmarkStandardLine(r))
		}
	}
	return out, nil
}

// nexmarkStandardLine is the output line of one run.
func nexmarkStandardLine(r NexmarkRunResult) Line {
	s := r.Spec
	l := Line{Bench: fmt.Sprintf("nexmark-%s-%s", s.Query, s.Backend), Metric: "events_per_cpu_s", Runs: 1,
		Value: float64(s.Events) / r.CPU.Seconds(), EventsPerS: float64(s.Events) / r.Wall.Seconds(),
		PeakRSSBytes: r.PeakRSS, Checkpoints: r.Checkpoints, LargestCheckpointBytes: r.Largest.Size,
		LargestCheckpointSyncMs: float64(r.Largest.Sync.Microseconds()) / 1e3, LargestCheckpointAsyncMs: float64(r.Largest.Async.Microseconds()) / 1e3,
		LargestCheckpointTotalMs: float64(r.Largest.Total.Microseconds()) / 1e3, LongestCheckpointMs: float64(r.Longest.Total.Microseconds()) / 1e3,
		LongestSyncMs: float64(r.LongestSync.Microseconds()) / 1e3, LongestRunningMs: float64(r.LongestRunning.Total.Microseconds()) / 1e3}
	l.ValueMin, l.ValueMax = l.Value, l.Value
	ref, name := felderaPerCore, "feldera-per-core"
	if s.Backend == string(runtime.PebbleState) {
		ref, name = flinkPerCore, "flink-1.13-rocksdb-per-core"
	}
	if v, ok := ref[s.Query]; ok {
		l.Baseline, l.BaselineValue, l.Ratio = name, v, l.Value/v
	}
	l.Note = fmt.Sprintf("%d events (rate %d/s of event time), parallelism %d, %s state backend, checkpoint every %s, discarding sink, "+
		"one process per run: %.1f s wall, %.1f CPU-s, peak RSS %d MiB; %d checkpoints, the largest %d bytes (sync %v, async %v, total %v), "+
		"the longest %v (checkpoint %d, %d bytes, triggered %.1f s into the run, sync %v, async %v), the longest while every source ran %v (checkpoint %d)",
		s.Events, nexmarkRate, nexmarkPar, s.Backend, s.Interval, r.Wall.Seconds(), r.CPU.Seconds(), r.PeakRSS>>20,
		r.Checkpoints, r.Largest.Size, r.Largest.Sync.Round(time.Millisecond), r.Largest.Async.Round(time.Millisecond),
		r.Largest.Total.Round(time.Millisecond), r.Longest.Total.Round(time.Millisecond),
		r.Longest.ID, r.Longest.Size, r.Longest.At.Seconds(), r.Longest.Sync.Round(time.Millisecond), r.Longest.Async.Round(time.Millisecond),
		r.LongestRunning.Total.Round(time.Millisecond), r.LongestRunning.ID)
	if s.StateMemory > 0 {
		l.Note += fmt.Sprintf("; state memory %d MiB", s.StateMemory>>20)
	}
	return l
}

// RunNexmarkQuery runs spec in this process: the generator (nexmarkRate
// events per second of event time) into the query at parallelism
// nexmarkPar and a discarding sink, on spec.Backend, with checkpoints
// every spec.Interval to a checkpoint store and checkpoint storage in a
// temporary directory (as `streamctl run --checkpoint-dir`), and returns
// what it measured. PeakRSS is this process's VmHWM: meaningful when the
// process ran nothing else (streamctl bench runs each spec in a child).
func RunNexmarkQuery(ctx context.Context, spec NexmarkRunSpec) (NexmarkRunResult, error) {
	res := NexmarkRunResult{Spec: spec}
	backend, err := runtime.ParseStateBackend(spec.Backend)
	if err != nil {
		return res, err
	}
	if spec.Events <= 0 || spec.Interval <= 0 {
		return res, fmt.Errorf("%w: events %d and checkpoint interval %v must be positive", ErrBadNexmarkRun, spec.Events, spec.Interval)
	}
	g, err := nexmark.NewGenerator(nexmark.GeneratorConfig{Events: spec.Events, Rate: nexmarkRate, BaseTime: nexmark.DefaultBaseTime})
	if err != nil {
		return res, err
	}
	j, ev := nexmark.GeneratorJob("bench-nexmark-"+spec.Query, g, runtime.DefaultParallelism(nexmarkPar), runtime.StateBackend(backend))
	if err := nexmark.AddQuery(spec.Query, ev, nexmark.Sinks{}); err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", "weir-bench-nexmark-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	st, err := storage.Open(ctx, "file://"+filepath.Join(dir, "storage"))
	if err != nil {
		return res, err
	}
	defer st.Close()

	var mu sync.Mutex
	start := time.Now() // reset when the run starts; read by the callbacks after
	type acks struct{ sync, async time.Duration }
	perCP := map[checkpoint.ID]acks{}
	opts := []runtime.ClusterOpt{runtime.CheckpointInterval(spec.Interval), runtime.CheckpointDir(filepath.Join(dir, "checkpoints")),
		runtime.StateMemoryDir(filepath.Join(dir, "state")), runtime.StateMemoryLimit(spec.StateMemory), runtime.StateStorage(st, "file://"+filepath.Join(dir, "storage")),
		runtime.OnCheckpointAck(func(a runtime.CheckpointAck) {
			mu.Lock()
			defer mu.Unlock()
			c := perCP[a.ID]
			c.sync, c.async = max(c.sync, a.Sync), max(c.async, a.Async)
			perCP[a.ID] = c
		}),
		runtime.OnCheckpointComplete(func(ev runtime.CheckpointEvent) {
			mu.Lock()
			defer mu.Unlock()
			c := perCP[ev.ID]
			delete(perCP, ev.ID)
			res.Checkpoints++
			res.LongestSync = max(res.LongestSync, c.sync)
			t := CheckpointTimes{ID: ev.ID, Size: ev.Size, Sync: c.sync, Async: c.async, Total: ev.Cycle, At: ev.Triggered.Sub(start)}
			if ev.Cycle >= res.Longest.Total {
				res.Longest = t
			}
			if !ev.AfterSourceEnd && ev.Cycle >= res.LongestRunning.Total {
				res.LongestRunning = t
			}
			if ev.Size >= res.Largest.Size {
				res.Largest = t
			}
		}),
		runtime.OnCheckpointAborted(func(ev runtime.CheckpointEvent) {
			mu.Lock()
			defer mu.Unlock()
			delete(perCP, ev.ID)
		})}
	stop, err := startNexmarkProfile(fmt.Sprintf("nexmark-%s-%s", spec.Query, spec.Backend))
	if err != nil {
		return res, err
	}
	defer stop()
	c0, ok := cpuTime()
	if !ok {
		return res, fmt.Errorf("nexmark: no process CPU time on this platform")
	}
	mu.Lock()
	start = time.Now()
	mu.Unlock()
	_, err = runtime.NewMiniCluster(opts...).Run(ctx, j)
	res.Wall = time.Since(start)
	c1, _ := cpuTime()
	res.CPU = c1 - c0
	if err != nil {
		return res, err
	}
	res.PeakRSS = peakRSS()
	mu.Lock()
	defer mu.Unlock()
	return res, nil
}

// peakRSS is this process's peak resident set size in bytes (VmHWM in
// /proc/self/status; 0 where there is none).
func peakRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
