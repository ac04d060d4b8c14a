package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
)

// windowSize is the size of window-wordcount's tumbling event-time windows,
// and windowLineMs the event time between two lines of its corpus (line i
// has timestamp i*windowLineMs): 1000 lines, 10000 words a window.
const (
	windowSize   = time.Second
	windowLineMs = 1
)

// windowCheckpointInterval is how often window-wordcount's Weir side
// checkpoints: every second, the interval of Flink's documentation's
// example (enableCheckpointing(1000)); users run 10 s to minutes (Flink's
// Nexmark runs every 3 minutes). The loop takes no snapshot. It was 100
// ms, which made a full snapshot of every window and timer 45% of the
// job's CPU.
const windowCheckpointInterval = time.Second

// tsLine is a line of window-wordcount's corpus with its event timestamp.
type tsLine struct {
	TS   int64
	Line string
}

// wordWindow is one result of window-wordcount: a word's count in the
// window starting at Start.
type wordWindow struct {
	Word  string
	Start int64
}

// windowCount is one emitted count of a word in a window.
type windowCount struct {
	wordWindow
	N int64
}

// WindowWordcount measures event-time tumbling 1 s window word counts on the
// mini cluster (the wordcount corpus with a timestamp per line, monotonous
// watermarks, parallelism 2, a checkpoint every second, an incremental
// count per word and window) against a hand-written single-goroutine loop
// that keeps a map per window and emits a window's counts when the
// watermark passes its end, in words per second, alternating the two sides.
// Every run's output is checked against the loop's, count by count.
//
// It also reports window-state-per-key (bytes of state per live key and
// window): the size of a checkpoint taken when the whole corpus is in window
// state and no window has fired, divided by the number of distinct word and
// window pairs.
func WindowWordcount(ctx context.Context, cfg Config) ([]Line, error) {
	lines, runs := cfg.sizeOf(400_000, 150_000, 20_000), cfg.runsOf(3, 2)
	corpus := windowCorpus(lines)
	var words int
	for _, l := range corpus {
		words += len(strings.Fields(l.Line))
	}
	var want map[wordWindow]int64
	weir, base, err := alternate(runs, func(side string, i int) { cfg.progress("run %d/%d: %s", i+1, runs, side) },
		func(int) (float64, error) {
			el, got, err := weirWindowWordcount(ctx, corpus, cfg.clusterOpts...)
			if err != nil {
				return 0, err
			}
			if want == nil {
				_, want = baselineWindowWordcount(corpus)
			}
			if err := sameWindowCounts(got, want); err != nil {
				return 0, err
			}
			return float64(words) / el.Seconds(), nil
		},
		func(int) (float64, error) {
			el, _ := baselineWindowWordcount(corpus)
			return float64(words) / el.Seconds(), nil
		})
	if err != nil {
		return nil, err
	}
	l := compared("window-wordcount", "words_per_s", "single-goroutine-map-per-window", weir, base)
	l.Note = fmt.Sprintf("%d lines, %d words, %d windows of %s, %d word-windows; Weir checkpoints every %s, the loop never; %s", lines, words,
		(lines*windowLineMs+int(windowSize.Milliseconds())-1)/int(windowSize.Milliseconds()), windowSize, len(want), windowCheckpointInterval, l.Note)
	cfg.progress("state size")
	size, err := windowStateSize(ctx, corpus, cfg.clusterOpts...)
	if err != nil {
		return nil, fmt.Errorf("state size: %w", err)
	}
	st := Line{Bench: "window-state-per-key", Metric: "bytes_per_key_window", Value: float64(size) / float64(len(want)),
		Note: fmt.Sprintf("bytes of a checkpoint holding the whole corpus in window state (%d bytes: accumulators, window timers, "+
			"the sources' and sink's state) divided by its %d live word-windows", size, len(want))}
	return []Line{l, st}, nil
}

// windowCorpus is the wordcount corpus, line i at event time i*windowLineMs.
func windowCorpus(lines int) []tsLine {
	text := Corpus(1, lines, 10, 20_000)
	out := make([]tsLine, len(text))
	for i, l := range text {
		out[i] = tsLine{TS: int64(i) * windowLineMs, Line: l}
	}
	return out
}

// baselineWindowWordcount is the hand-written loop: one goroutine, a map of
// counts per open window; its watermark is the last timestamp seen minus 1
// ms (monotonous timestamps), and a window whose last millisecond the
// watermark reached is emitted and dropped; the end of the input emits the
// rest. It returns its time and what it emitted.
func baselineWindowWordcount(corpus []tsLine) (time.Duration, map[wordWindow]int64) {
	size := windowSize.Milliseconds()
	start := time.Now()
	open := map[int64]map[string]int64{}
	var out []windowCount
	emit := func(ws int64) {
		for w, n := range open[ws] {
			out = append(out, windowCount{wordWindow{w, ws}, n})
		}
		delete(open, ws)
	}
	var fired int64 // the start of the next window to fire
	for _, l := range corpus {
		wm := l.TS - 1
		for ; fired+size-1 <= wm; fired += size {
			emit(fired)
		}
		ws := l.TS - l.TS%size
		m := open[ws]
		if m == nil {
			m = map[string]int64{}
			open[ws] = m
		}
		for _, w := range strings.Fields(strings.ToLower(l.Line)) {
			m[w]++
		}
	}
	for ws := range open {
		emit(ws)
	}
	el := time.Since(start)
	counts := make(map[wordWindow]int64, len(out))
	for _, c := range out {
		counts[c.wordWindow] = c.N
	}
	return el, counts
}

// sameWindowCounts checks that got holds exactly want's counts.
func sameWindowCounts(got []windowCount, want map[wordWindow]int64) error {
	seen := make(map[wordWindow]bool, len(got))
	for _, c := range got {
		if seen[c.wordWindow] {
			return fmt.Errorf("window-wordcount: %q in window %d emitted twice", c.Word, c.Start)
		}
		seen[c.wordWindow] = true
		if n, ok := want[c.wordWindow]; !ok || n != c.N {
			return fmt.Errorf("window-wordcount: %q in window %d counted %d, the loop %d", c.Word, c.Start, c.N, n)
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("window-wordcount: %d counts emitted, the loop %d", len(got), len(want))
	}
	return nil
}

// countWords is window-wordcount's AggregateFunction: a count.
type countWords struct{}

func (countWords) CreateAccumulator() int64    { return 0 }
func (countWords) Add(_ string, n int64) int64 { return n + 1 }
func (countWords) GetResult(n int64) int64     { return n }
func (countWords) Merge(a, b int64) int64      { return a + b }

// windowWordcountJob is the window wordcount over src: split into words,
// keyBy word, tumbling event-time windows of windowSize, an incremental
// count, each result with its word and window to a sink that collects.
func windowWordcountJob(src func() runtime.Source[tsLine], opts ...runtime.OpOpt) (*runtime.Job, *collected) {
	j := runtime.NewJob("bench-window-wordcount", runtime.DefaultParallelism(runtimeWordcountPar))
	text := runtime.FromSource(j, "lines", src, opts...)
	words := runtime.FlatMap(text, "split", func(l tsLine, out runtime.Collector[string]) error {
		for _, w := range wordcount.Words(l.Line) {
			out.Collect(w)
		}
		return nil
	})
	windows := runtime.Window(runtime.KeyBy(words, func(w string) string { return w }, nil), runtime.TumblingEventTimeWindows(windowSize))
	counts := runtime.AggregateProcess(windows, "count", countWords{},
		runtime.ProcessWindowFunc[string, int64, windowCount](func(ctx *runtime.WindowContext[string], n []int64, out runtime.Collector[windowCount]) error {
			out.Collect(windowCount{wordWindow{ctx.Key, ctx.Window.Start}, n[0]})
			return nil
		}), runtime.Int64Codec())
	c := &collected{}
	runtime.SinkTo(counts, sinkUID, func() runtime.Sink[windowCount] { return &collectingSink{all: c} })
	return j, c
}

func weirWindowWordcount(ctx context.Context, corpus []tsLine, opts ...runtime.ClusterOpt) (time.Duration, []windowCount, error) {
	ws := runtime.ForMonotonousTimestamps[tsLine](runtime.WithTimestampAssigner(func(l tsLine, _ int64) int64 { return l.TS }))
	j, c := windowWordcountJob(runtime.SliceSource(corpus, 64), runtime.Watermarks(ws))
	start := time.Now()
	_, err := runtime.NewMiniCluster(append([]runtime.ClusterOpt{runtime.CheckpointInterval(windowCheckpointInterval), runtime.MinPause(0)}, opts...)...).Run(ctx, j)
	el := time.Since(start)
	return el, c.all(), err
}

// collected gathers the counts of every sink subtask: each subtask's slice
// as it is, joined after the run (all), outside the time measured, as the
// loop's slice of counts is turned into a map after its time.
type collected struct {
	mu    sync.Mutex
	parts [][]windowCount
}

// all is every subtask's counts in one slice.
func (c *collected) all() []windowCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []windowCount
	for _, p := range c.parts {
		out = append(out, p...)
	}
	return out
}

// collectingSink keeps its subtask's counts (one append per count, as the
// loop's) and hands its slice to all when it closes, without a copy.
type collectingSink struct {
	counts []windowCount
	all    *collected
}

func (s *collectingSink) Open(context.Context, *runtime.OperatorContext) error { return nil }

func (s *collectingSink) Write(_ context.Context, c windowCount) error {
	s.counts = append(s.counts, c)
	return nil
}

func (s *collectingSink) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{}, nil
}

func (s *collectingSink) Close() error {
	s.all.mu.Lock()
	s.all.parts = append(s.all.parts, s.counts)
	s.all.mu.Unlock()
	s.counts = nil
	return nil
}

// windowStateSize runs the window wordcount over a source that emits the
// corpus with timestamps but no watermark, so that no window fires, and
// then holds; it returns the size of the first checkpoint that every
// source subtask took after its last record.
func windowStateSize(ctx context.Context, corpus []tsLine, opts ...runtime.ClusterOpt) (int64, error) {
	store, err := checkpoint.OpenStore("", checkpoint.InMemory())
	if err != nil {
		return 0, err
	}
	defer store.Close()
	var held heldMark
	j, _ := windowWordcountJob(func() runtime.Source[tsLine] { return &heldSource{items: corpus, held: &held} })
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runtime.NewMiniCluster(append([]runtime.ClusterOpt{runtime.CheckpointInterval(100 * time.Millisecond),
			runtime.MinPause(0), runtime.CheckpointStore(store)}, opts...)...).Run(ctx, j)
		done <- err
	}()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return 0, fmt.Errorf("the job ended before its state was measured: %w", err)
		case <-t.C:
		}
		after, ok := held.after(runtimeWordcountPar)
		if !ok {
			continue
		}
		sums, err := store.List(ctx, "bench-window-wordcount")
		if err != nil {
			return 0, err
		}
		for _, s := range sums {
			if s.Err == nil && s.ID >= after {
				cancel()
				if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
					return 0, err
				}
				return s.Size, nil
			}
		}
	}
}

// heldMark records, per source subtask, the first checkpoint it took after
// its last record.
type heldMark struct {
	mu  sync.Mutex
	ids map[int]checkpoint.ID
}

func (h *heldMark) mark(subtask int, id checkpoint.ID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ids == nil {
		h.ids = map[int]checkpoint.ID{}
	}
	if _, ok := h.ids[subtask]; !ok {
		h.ids[subtask] = id
	}
}

// after is the newest of the subtasks' marks, once all par marked.
func (h *heldMark) after(par int) (checkpoint.ID, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ids) < par {
		return 0, false
	}
	var m checkpoint.ID
	for _, id := range h.ids {
		m = max(m, id)
	}
	return m, true
}

// heldSource emits every parallelism-th line of items from its subtask's
// index with its timestamp and no watermark, then emits nothing and never
// ends.
type heldSource struct {
	items   []tsLine
	next    int
	step    int
	subtask int
	drained atomic.Bool
	held    *heldMark
}

func (s *heldSource) Open(_ context.Context, oc *runtime.OperatorContext) error {
	s.next, s.step, s.subtask = oc.Subtask, oc.Parallelism, oc.Subtask
	return nil
}

func (s *heldSource) Poll(ctx context.Context, out runtime.Collector[tsLine]) error {
	if s.next >= len(s.items) {
		s.drained.Store(true)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		return nil
	}
	tc, ok := out.(runtime.TimestampCollector[tsLine])
	if !ok {
		return fmt.Errorf("held source: the collector %T takes no timestamps", out)
	}
	for k := 0; k < 64 && s.next < len(s.items); k++ {
		tc.CollectWithTimestamp(s.items[s.next], s.items[s.next].TS)
		s.next += s.step
	}
	return nil
}

func (s *heldSource) Snapshot(_ context.Context, id checkpoint.ID) (runtime.OperatorState, error) {
	if s.drained.Load() {
		s.held.mark(s.subtask, id)
	}
	return runtime.OperatorState{}, nil
}

func (s *heldSource) Close() error { return nil }
