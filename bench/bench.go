// Package bench holds Weir's benchmarks behind `streamctl bench`: each
// comparison runs Weir and a hand-written baseline on the same data in the
// same process run, alternately, and reports the median ratio with its
// spread; the limits measure what the machine and the broker can do at
// most. Every result is one JSON line (docs/architecture.md, "Benchmark
// output").
//
// It measures; it must not assert. Speed is judged from its output, never by
// timed assertions in tests.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/weirstream/weir/runtime"
)

// Line is one benchmark result, printed as one JSON object per line.
type Line struct {
	Bench         string  `json:"bench"`
	Metric        string  `json:"metric"`
	Value         float64 `json:"value"`
	Baseline      string  `json:"baseline,omitempty"`
	BaselineValue float64 `json:"baseline_value,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`
	// Runs is how many times each side was measured. A comparison
	// alternates the sides (Weir, baseline, Weir, baseline, ...); Value and
	// BaselineValue are then the medians of each side, Ratio the median of
	// the per-pair ratios (not Value/BaselineValue), and RatioMin and
	// RatioMax their spread. ValueMin and ValueMax are the spread of Value.
	Runs     int     `json:"runs,omitempty"`
	RatioMin float64 `json:"ratio_min,omitempty"`
	RatioMax float64 `json:"ratio_max,omitempty"`
	ValueMin float64 `json:"value_min,omitempty"`
	ValueMax float64 `json:"value_max,omitempty"`
	// EventsPerS is a Nexmark line's events per wall-clock second (its
	// Value is per CPU-second).
	EventsPerS float64 `json:"events_per_s,omitempty"`
	// The standard-size Nexmark lines (Config.NexmarkBackends) add the
	// run's process's peak RSS, its completed checkpoints, the largest
	// one's size and durations (sync and async: the longest among its
	// tasks; total: trigger to completion), the longest checkpoint's
	// total and the longest sync part of any, and the longest total of
	// the checkpoints triggered while every source ran (the others
	// include the drain: the final watermark firing every window left).
	PeakRSSBytes             int64   `json:"peak_rss_bytes,omitempty"`
	Checkpoints              int     `json:"checkpoints,omitempty"`
	LargestCheckpointBytes   int64   `json:"largest_checkpoint_bytes,omitempty"`
	LargestCheckpointSyncMs  float64 `json:"largest_checkpoint_sync_ms,omitempty"`
	LargestCheckpointAsyncMs float64 `json:"largest_checkpoint_async_ms,omitempty"`
	LargestCheckpointTotalMs float64 `json:"largest_checkpoint_total_ms,omitempty"`
	LongestCheckpointMs      float64 `json:"longest_checkpoint_ms,omitempty"`
	LongestSyncMs            float64 `json:"longest_sync_ms,omitempty"`
	LongestRunningMs         float64 `json:"longest_running_checkpoint_ms,omitempty"`
	Note                     string  `json:"note,omitempty"`
}

// Config tunes a run of the benchmarks.
type Config struct {
	// Quick keeps the whole run under a minute.
	Quick bool
	// Progress, when set, is called a few times a second while a benchmark
	// runs with a one-line status ("bench eos-sink (3/4): 12s ..."), and
	// with "" before results are written, so a live line can be cleared.
	// It must not block.
	Progress func(status string)
	// TaskManagers starts the task managers of runtime-wordcount-2tm
	// (streamctl bench: processes of its own binary); nil runs them in
	// this process.
	TaskManagers StartTaskManagers
	// NexmarkEvents, when above 0, is how many events each nexmark run
	// generates (default 2M, --quick 200k).
	NexmarkEvents int64
	// NexmarkBackends, when set ("heap", "pebble"), makes nexmark run every
	// query to completion on each of these state backends instead, one
	// process per run (NexmarkProcess), with a checkpoint every 10 s, and
	// report per query and backend the events per CPU-second, the peak
	// RSS and the largest checkpoint's size and durations.
	NexmarkBackends []string
	// NexmarkQueries, when set, limits those runs to these queries.
	NexmarkQueries []string
	// NexmarkStateMemory, when above 0, is the pebble backend's memory
	// budget in bytes in those runs (default FlinkNexmarkStateMemory).
	NexmarkStateMemory int64
	// NexmarkProcess runs one of those runs in a process of its own
	// (streamctl bench: its own binary); nil runs it in this process.
	NexmarkProcess RunNexmarkProcess
	// TaskManager starts the task managers of recovery, one at a time
	// (streamctl bench: processes of its own binary, killed with SIGKILL);
	// nil runs them in this process.
	TaskManager StartTaskManager
	// JobManager starts the job managers of failover (streamctl bench:
	// processes of its own binary, killed with SIGKILL); nil runs them in
	// this process (and then the task managers too).
	JobManager StartJobManager

	// clusterOpts are added to every mini cluster a benchmark starts
	// (tests of this package use them to slow checkpoints down).
	clusterOpts []runtime.ClusterOpt
	// checkpoints overrides how many checkpoints checkpoint-cycle measures.
	checkpoints int
	// runs, when > 0, overrides how many times each side of a comparison
	// (and each limit) is measured.
	runs int
	// tiny shrinks every benchmark's data to a few seconds under -race
	// (tests of this package check the lines, never the speed).
	tiny bool
	// detail holds what the running benchmark last said about itself.
	detail *detail
}

// detail is a benchmark's latest word about its progress.
type detail struct {
	mu  sync.Mutex
	msg string
}

// progress records a benchmark's own progress detail, shown with the next
// status line.
func (c Config) progress(format string, args ...any) {
	if c.detail == nil {
		return
	}
	msg := fmt.Sprintf(format, args...)
	c.detail.mu.Lock()
	c.detail.msg = msg
	c.detail.mu.Unlock()
}

func (d *detail) get() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.msg
}

// Benchmark is one named benchmark.
type Benchmark struct {
	Name string
	Run  func(ctx context.Context, cfg Config) ([]Line, error)
}

// All lists the benchmarks in the order they run.
func All() []Benchmark {
	return []Benchmark{
		{Name: "runtime-wordcount", Run: RuntimeWordcount},
		{Name: "runtime-wordcount-2tm", Run: RuntimeWordcount2TM},
		{Name: "checkpoint-cycle", Run: CheckpointCycle},
		{Name: "window-wordcount", Run: WindowWordcount},
		{Name: "eos-sink", Run: EOSSink},
		{Name: "eos-wordcount", Run: EOSWordcount},
		{Name: "eos-wordcount-kafka", Run: EOSWordcountKafka},
		{Name: "recovery", Run: Recovery},
		{Name: "failover", Run: Failover},
		{Name: "limits", Run: Limits},
		{Name: "nexmark", Run: Nexmark},
		{Name: "nexmark-topic", Run: NexmarkTopic},
		{Name: "sharegroup-watermark", Run: ShareGroupWatermark},
		{Name: "state-memory", Run: StateMemory},
	}
}

// Names lists the names --only accepts, in run order.
func Names() []string {
	var names []string
	for _, b := range All() {
		names = append(names, b.Name)
	}
	return names
}

// ErrUnknownBenchmark is wrapped by Run's error for a name in only that is
// not a benchmark.
var ErrUnknownBenchmark = errors.New("unknown benchmark")

// Select returns the benchmarks whose names are in only (all when only is
// empty), in run order, or an error naming every unknown name and listing
// the known ones.
func Select(only ...string) ([]Benchmark, error) {
	want := map[string]bool{}
	var unknown []string
	known := Names()
	for _, o := range only {
		if !slices.Contains(known, o) {
			unknown = append(unknown, strconv.Quote(o))
		}
		want[o] = true
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%w %s: the benchmarks are %s", ErrUnknownBenchmark, strings.Join(unknown, ", "), strings.Join(known, ", "))
	}
	var out []Benchmark
	for _, b := range All() {
		if len(want) == 0 || want[b.Name] {
			out = append(out, b)
		}
	}
	return out, nil
}

// Run runs the benchmarks whose names are in only (all when empty) and
// writes their lines to w as they finish. An unknown name in only is an
// error before anything runs.
func Run(ctx context.Context, w io.Writer, cfg Config, only ...string) error {
	benches, err := Select(only...)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	for i, b := range benches {
		lines, err := runOne(ctx, cfg, b, fmt.Sprintf("bench %s (%d/%d)", b.Name, i+1, len(benches)))
		if err != nil {
			return fmt.Errorf("bench %s: %w", b.Name, err)
		}
		for _, l := range lines {
			l.Value, l.BaselineValue, l.Ratio = round(l.Value), round(l.BaselineValue), round3(l.Ratio)
			l.RatioMin, l.RatioMax = round3(l.RatioMin), round3(l.RatioMax)
			l.ValueMin, l.ValueMax = round(l.ValueMin), round(l.ValueMax)
			l.EventsPerS = round(l.EventsPerS)
			if err := enc.Encode(l); err != nil {
				return err
			}
		}
	}
	return nil
}

// statusEvery is how often a running benchmark's status is passed to
// Config.Progress.
const statusEvery = 250 * time.Millisecond

// runOne runs b, passing its status to cfg.Progress while it runs and ""
// when it is done.
func runOne(ctx context.Context, cfg Config, b Benchmark, title string) ([]Line, error) {
	if cfg.Progress == nil {
		return b.Run(ctx, cfg)
	}
	cfg.detail = &detail{}
	start := time.Now()
	status := func() string {
		s := fmt.Sprintf("%s: %s", title, time.Since(start).Round(time.Second))
		if d := cfg.detail.get(); d != "" {
			s += ", " + d
		}
		return s
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(statusEvery)
		defer t.Stop()
		for {
			cfg.Progress(status())
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	lines, err := b.Run(ctx, cfg)
	close(stop)
	wg.Wait()
	cfg.Progress("")
	return lines, err
}

// runsOf is how many times each side of a comparison is measured: full
// without Quick, quick with it, cfg.runs when set.
func (c Config) runsOf(full, quick int) int {
	switch {
	case c.runs > 0:
		return c.runs
	case c.Quick:
		return quick
	}
	return full
}

// sizeOf picks a benchmark's data size: full without Quick, quick with it,
// tiny in tests.
func (c Config) sizeOf(full, quick, tiny int) int {
	switch {
	case c.tiny:
		return tiny
	case c.Quick:
		return quick
	}
	return full
}

// measure is one measurement of one side: a rate (higher is better).
type measure func(run int) (float64, error)

// alternate measures weir and base alternately, runs times each (weir,
// base, weir, base, ...: a machine whose speed drifts during the run
// drifts both sides alike), and returns both sides' rates in run order.
// step reports which run is next. Before each run the garbage of the
// previous one is collected, so no side pays for the other's.
func alternate(runs int, step func(side string, run int), weir, base measure) (w, b []float64, err error) {
	vs, err := alternateSides(runs, step, side{"weir", weir}, side{"baseline", base})
	if err != nil {
		return nil, nil, err
	}
	return vs[0], vs[1], nil
}

// side is one side of an alternated measurement.
type side struct {
	name string
	m    measure
}

// alternateSides is alternate for any number of sides, measured in the
// order given within each run; it returns each side's rates in run order.
// An error of a side other than the first is wrapped with its name.
func alternateSides(runs int, step func(side string, run int), sides ...side) ([][]float64, error) {
	vs := make([][]float64, len(sides))
	for i := range runs {
		for k, s := range sides {
			step(s.name, i)
			goruntime.GC()
			v, err := s.m(i)
			if err != nil {
				if k > 0 {
					err = fmt.Errorf("%s: %w", s.name, err)
				}
				return nil, err
			}
			vs[k] = append(vs[k], v)
		}
	}
	return vs, nil
}

// compared is the line of a comparison from the rates of alternated runs
// (weir[i] and base[i] measured one after the other): the median of each
// side, the median of the per-run ratios and their spread.
func compared(bench, metric, baseline string, weir, base []float64) Line {
	ratios := make([]float64, len(weir))
	for i := range weir {
		ratios[i] = weir[i] / base[i]
	}
	l := spread(Line{Bench: bench, Metric: metric, Baseline: baseline, BaselineValue: median(base)}, weir)
	l.Ratio, l.RatioMin, l.RatioMax = median(ratios), slices.Min(ratios), slices.Max(ratios)
	l.Note = fmt.Sprintf("median of %d alternated runs; weir %s; baseline %s", len(weir), rates(weir), rates(base))
	return l
}

// rates formats rates in run order, rounded to whole numbers.
func rates(vs []float64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// spread fills l's value, its spread and the number of runs from vs.
func spread(l Line, vs []float64) Line {
	l.Value, l.ValueMin, l.ValueMax, l.Runs = median(vs), slices.Min(vs), slices.Max(vs), len(vs)
	return l
}

// median of vs (the mean of the middle two for an even count).
func median(vs []float64) float64 {
	s := slices.Sorted(slices.Values(vs))
	m := len(s) / 2
	if len(s)%2 == 0 {
		return (s[m-1] + s[m]) / 2
	}
	return s[m]
}

func round(v float64) float64  { return math.Round(v*10) / 10 }
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// Corpus generates n lines of text with a Zipf-distributed vocabulary of
// vocab words (deterministic for a seed).
func Corpus(seed int64, lines, wordsPerLine, vocab int) []string {
	r := rand.New(rand.NewSource(seed))
	z := rand.NewZipf(r, 1.1, 1, uint64(vocab-1))
	words := make([]string, vocab)
	for i := range words {
		words[i] = fmt.Sprintf("w%x", i*2654435761%1000003)
	}
	out := make([]string, lines)
	var b strings.Builder
	for i := range out {
		b.Reset()
		for k := 0; k < wordsPerLine; k++ {
			if k > 0 {
				b.WriteByte(' ')
			}
			w := words[z.Uint64()]
			if k%5 == 0 {
				w = strings.ToUpper(w)
			}
			b.WriteString(w)
		}
		out[i] = b.String()
	}
	return out
}
