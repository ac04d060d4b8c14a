package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
)

// RuntimeWordcount measures an in-memory wordcount on the mini cluster
// (parallelism 2, a checkpoint every 100 ms, keyed running counts) against a
// hand-written single-goroutine strings.Fields + map loop over the same
// corpus, in words per second.
func RuntimeWordcount(ctx context.Context, cfg Config) ([]Line, error) {
	lines, rounds := 400_000, 3
	if cfg.Quick {
		lines, rounds = 150_000, 2
	}
	corpus := Corpus(1, lines, 10, 20_000)
	var words int
	for _, l := range corpus {
		words += len(strings.Fields(l))
	}
	var best, bestBase float64
	for r := 0; r < rounds; r++ {
		cfg.progress("round %d/%d", r+1, rounds)
		base := baselineWordcount(corpus)
		el, err := weirWordcount(ctx, corpus, int64(words))
		if err != nil {
			return nil, err
		}
		best = max(best, float64(words)/el.Seconds())
		bestBase = max(bestBase, float64(words)/base.Seconds())
	}
	return []Line{{Bench: "runtime-wordcount", Metric: "words_per_s", Value: best,
		Baseline: "single-goroutine-fields-map", BaselineValue: bestBase, Ratio: best / bestBase}}, nil
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
	runtime.SinkTo(counts, "discard", runtime.SinkFunc(func(context.Context, wordcount.Count) error {
		seen.Add(1)
		return nil
	}))
	return j, seen
}

type errWrongCount struct{ got, want int64 }

func (e errWrongCount) Error() string {
	return fmt.Sprintf("wordcount emitted %d counts for %d words", e.got, e.want)
}
