package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/weirstream/weir/examples/input"
	"github.com/weirstream/weir/sources/sharegroup"
)

// BenchmarkWeirWordcount runs the runtime-wordcount job on 200k lines, for
// profiling (-cpuprofile).
func BenchmarkWeirWordcount(b *testing.B) {
	corpus := Corpus(1, 200_000, 10, 20_000)
	for i := 0; i < b.N; i++ {
		if _, err := weirWordcount(context.Background(), corpus, 2_000_000); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpointCycle runs checkpoint-cycle (100 checkpoints under the
// wordcount load), for profiling: go test -bench CheckpointCycle
// -benchtime 1x -cpuprofile cp.prof ./bench.
func BenchmarkCheckpointCycle(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := CheckpointCycle(context.Background(), Config{checkpoints: 100}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWeirWindowWordcount runs the window-wordcount job on 150k lines
// (its --quick size), for profiling: go test -run xxx -bench
// WeirWindowWordcount -benchtime 3x -cpuprofile win.prof ./bench.
func BenchmarkWeirWindowWordcount(b *testing.B) {
	corpus := windowCorpus(150_000)
	var words int
	for _, l := range corpus {
		words += len(strings.Fields(l.Line))
	}
	for b.Loop() {
		el, _, err := weirWindowWordcount(b.Context(), corpus)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(words)/el.Seconds(), "words/s")
	}
}

// BenchmarkWeirEOSWordcount runs eos-wordcount's Weir side (the
// exactly-once wordcount from a share group, 200k lines) against the
// limit-wordcount ceiling, alternately, for profiling: go test -run xxx
// -bench WeirEOSWordcount -benchtime 3x -cpuprofile eos.prof ./bench
// (the broker runs in the process: its share of the profile is in both).
func BenchmarkWeirEOSWordcount(b *testing.B) {
	eb, err := startEOSBench(b.Context(), Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer eb.kb.Close()
	i := 0
	for b.Loop() {
		el, err := weirEOSWordcount(b.Context(), eb.kb, i, eb.want, eb.words, input.ShareGroup, sharegroup.CommitWhenIdle(eosIdleCommit))
		if err != nil {
			b.Fatal(err)
		}
		ce, err := wordcountCeiling(b.Context(), eb.kb, i, eb.words)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(ce)/float64(el), "of-ceiling")
		i++
	}
}
