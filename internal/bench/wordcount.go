package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
)

// RuntimeWordcount measures an in-memory wordcount on the mini cluster
// (parallelism 2, a checkpoint every 100 ms, keyed running counts) against a
// hand-written single-goroutine strings.Fields + map loop over the same
// corpus, in words per second, alternating the two sides (5 runs each, 2
// with Quick).
func RuntimeWordcount(ctx context.Context, cfg Config) ([]Line, error) {
	lines, runs := cfg.sizeOf(400_000, 150_000, 20_000), cfg.runsOf(5, 2)
	corpus := Corpus(1, lines, 10, 20_000)
	var words int
	for _, l := range corpus {
		words += len(strings.Fields(l))
	}
	weir, base, err := alternate(runs, func(side string, i int) { cfg.progress("run %d/%d: %s", i+1, runs, side) },
		func(int) (float64, error) {
			el, err := weirWordcount(ctx, corpus, int64(words))
			return float64(words) / el.Seconds(), err
		},
		func(int) (float64, error) { return float64(words) / baselineWordcount(corpus).Seconds(), nil })
	if err != nil {
		return nil, err
	}
	l := compared("runtime-wordcount", "words_per_s", "single-goroutine-fields-map", weir, base)
	l.Note = fmt.Sprintf("%d lines, %d words; %s", lines, words, l.Note)
	return []Line{l}, nil
}

func baselineWordcount(corpus []string) time.Duration {
	start := time.Now()
	counts := map[string]int64{}
	var sink int64
	for _, l := range corpus {
		for _, w := range strings.Fields(strings.ToLower(l)) {
			counts[w]++
			sink += counts[w]
		}
	}
	_ = sink
	return time.Since(start)
}

func weirWordcount(ctx context.Context, corpus []string, words int64) (time.Duration, error) {
	j, seen := wordcountJob(runtime.SliceSource(corpus, 64))
	start := time.Now()
	_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(ctx, j)
	el := time.Since(start)
	if err == nil && seen.Load() != words {
		return 0, errWrongCount{seen.Load(), words}
	}
	return el, err
}

// wordcountJob is the in-memory wordcount, with examples/wordcount's
// split and keyed counter: lines, split into words, keyBy word, running
// count in keyed ValueState[int64], a sink that counts what it receives.
// Each sink subtask counts on its own and adds its count to the returned
// total when it closes (one shared counter bounced a cache line between
// the subtasks on every record).
func wordcountJob(lines func() runtime.Source[string]) (*runtime.Job, *atomic.Int64) {
	j := runtime.NewJob("bench-wordcount", runtime.DefaultParallelism(2))
	text := runtime.FromSource(j, "lines", lines)
	words := runtime.FlatMap(text, "split", func(l string, out runtime.Collector[string]) error {
		for _, w := range wordcount.Words(l) {
			out.Collect(w)
		}
		return nil
	})
	counts := runtime.Process(runtime.KeyBy(words, func(w string) string { return w }, nil), "count", wordcount.NewCounter)
	seen := new(atomic.Int64)
	runtime.SinkTo(counts, sinkUID, func() runtime.Sink[wordcount.Count] { return &countingSink{total: seen} })
	return j, seen
}

// sinkUID is the name (and uid) of the counting sink.
const sinkUID = "discard"

// countingSink counts the records of one sink subtask, snapshots its count
// (so that a job run elsewhere reports it in its final checkpoint) and adds
// it to total when it closes.
type countingSink struct {
	n     int64
	total *atomic.Int64
}

func (s *countingSink) Open(context.Context, *runtime.OperatorContext) error { return nil }

func (s *countingSink) Write(context.Context, wordcount.Count) error {
	s.n++
	return nil
}

func (s *countingSink) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{Entries: [][]byte{binary.AppendVarint(nil, s.n)}}, nil
}

func (s *countingSink) Close() error {
	s.total.Add(s.n)
	s.n = 0
	return nil
}

type errWrongCount struct{ got, want int64 }

func (e errWrongCount) Error() string {
	return fmt.Sprintf("wordcount emitted %d counts for %d words", e.got, e.want)
}
