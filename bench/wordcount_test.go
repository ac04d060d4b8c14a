package bench

import (
	"context"
	"strings"
	"testing"
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
