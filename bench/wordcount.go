package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
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
//
// Between them it measures the ceiling of a parallel wordcount of the same
// shape on this machine (limit-runtime-wordcount, parallelWordcount), so the
// report shows how far above the loop two cores can take it at all.
func RuntimeWordcount(ctx context.Context, cfg Config) ([]Line, error) {
	lines, runs := cfg.sizeOf(400_000, 150_000, 20_000), cfg.runsOf(5, 2)
	corpus := Corpus(1, lines, 10, 20_000)
	var words int
	for _, l := range corpus {
		words += len(strings.Fields(l))
	}
	vs, err := alternateSides(runs, func(side string, i int) { cfg.progress("run %d/%d: %s", i+1, runs, side) },
		side{"weir", func(int) (float64, error) {
			el, err := weirWordcount(ctx, corpus, int64(words))
			return float64(words) / el.Seconds(), err
		}},
		side{"baseline", func(int) (float64, error) { return float64(words) / baselineWordcount(corpus).Seconds(), nil }},
		side{"ceiling", func(int) (float64, error) {
			el, counts := parallelWordcount(corpus, runtimeWordcountPar)
			if n := countedWords(counts); n != int64(words) {
				return 0, errWrongCount{n, int64(words)}
			}
			return float64(words) / el.Seconds(), nil
		}})
	if err != nil {
		return nil, err
	}
	weir, base, ceiling := vs[0], vs[1], vs[2]
	l := compared("runtime-wordcount", "words_per_s", "single-goroutine-fields-map", weir, base)
	l.Note = fmt.Sprintf("%d lines, %d words; %s", lines, words, l.Note)
	lim := compared("limit-runtime-wordcount", "words_per_s", "single-goroutine-fields-map", ceiling, base)
	lim.Note = fmt.Sprintf("words/s of the ceiling of a parallel in-memory wordcount on this machine: runtime-wordcount's shape "+
		"written by hand (%d goroutines split alternate lines and route each word by hash, in batches of %d over channels of %d, "+
		"to %d goroutines that count in maps of their own; no operators, checkpoints, state backend or sink), measured in turn "+
		"with runtime-wordcount's runs; ratio: ceiling / loop; median of %d runs; ceiling %s",
		runtimeWordcountPar, ceilingBatch, ceilingChanCap, runtimeWordcountPar, len(ceiling), rates(ceiling))
	return []Line{l, lim}, nil
}

// runtimeWordcountPar is the parallelism of runtime-wordcount's job and of
// its hand-written ceiling.
const runtimeWordcountPar = 2

// The ceiling's batch size and channel capacity: the mini cluster's
// defaults (runtime's defaultBatchSize and defaultChannelCap).
const ceilingBatch, ceilingChanCap = 256, 8

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

// parallelWordcount is the fastest parallel wordcount of runtime-wordcount's
// shape this package knows how to write: par splitters, each over every
// par-th line, send each word (lower-cased, as the loop) to counter
// hash(word) % par in batches of ceilingBatch over channels of
// ceilingChanCap, and each counter keeps its running counts in a map of its
// own, as the loop does. Batches are recycled. It returns the time from start
// until every counter drained its input, and each counter's counts.
func parallelWordcount(corpus []string, par int) (time.Duration, []map[string]int64) {
	seed := maphash.MakeSeed()
	ins := make([]chan []string, par)
	for i := range ins {
		ins[i] = make(chan []string, ceilingChanCap)
	}
	free := make(chan []string, par*par*(ceilingChanCap+1))
	counted := make([]map[string]int64, par)
	start := time.Now()
	var splitters, counters sync.WaitGroup
	for c := range par {
		counters.Go(func() {
			counts := map[string]int64{}
			var sink int64
			for b := range ins[c] {
				for _, w := range b {
					counts[w]++
					sink += counts[w]
				}
				select {
				case free <- b[:0]:
				default:
				}
			}
			_ = sink
			counted[c] = counts
		})
	}
	for s := range par {
		splitters.Go(func() {
			bufs := make([][]string, par)
			for i := range bufs {
				bufs[i] = make([]string, 0, ceilingBatch)
			}
			for i := s; i < len(corpus); i += par {
				for _, w := range strings.Fields(strings.ToLower(corpus[i])) {
					c := int(maphash.String(seed, w) % uint64(par))
					bufs[c] = append(bufs[c], w)
					if len(bufs[c]) == ceilingBatch {
						ins[c] <- bufs[c]
						select {
						case bufs[c] = <-free:
						default:
							bufs[c] = make([]string, 0, ceilingBatch)
						}
					}
				}
			}
			for c, b := range bufs {
				if len(b) > 0 {
					ins[c] <- b
				}
			}
		})
	}
	splitters.Wait()
	for _, in := range ins {
		close(in)
	}
	counters.Wait()
	return time.Since(start), counted
}

// countedWords is the number of words counts counted.
func countedWords(counts []map[string]int64) int64 {
	var n int64
	for _, m := range counts {
		for _, c := range m {
			n += c
		}
	}
	return n
}

func weirWordcount(ctx context.Context, corpus []string, words int64) (time.Duration, error) {
	j, seen := wordcountJob(runtime.SliceSource(corpus, 64))
	start := time.Now()
	_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond), runtime.MinPause(0)).Run(ctx, j)
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
	j := runtime.NewJob("bench-wordcount", runtime.DefaultParallelism(runtimeWordcountPar))
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
