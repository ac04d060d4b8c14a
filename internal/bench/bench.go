// Package bench holds Weir's benchmarks behind `streamctl bench`: each one
// runs Weir and a hand-written baseline on the same data in the same process
// run and reports one JSON line (DESIGN.md's benchmark contract).
//
// It measures; it must not assert. Speed is judged from its output, never by
// timed assertions in tests.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand"
	"strings"
)

// Line is one benchmark result, printed as one JSON object per line.
type Line struct {
	Bench         string  `json:"bench"`
	Metric        string  `json:"metric"`
	Value         float64 `json:"value"`
	Baseline      string  `json:"baseline,omitempty"`
	BaselineValue float64 `json:"baseline_value,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`
	Note          string  `json:"note,omitempty"`
}

// Config tunes a run of the benchmarks.
type Config struct {
	// Quick keeps the whole run under a minute.
	Quick bool
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
		{Name: "checkpoint-cycle", Run: CheckpointCycle},
		{Name: "eos-sink", Run: EOSSink},
		{Name: "eos-wordcount", Run: EOSWordcount},
	}
}

// Run runs the benchmarks whose names are in only (all when empty) and
// writes their lines to w as they finish.
func Run(ctx context.Context, w io.Writer, cfg Config, only ...string) error {
	want := map[string]bool{}
	for _, o := range only {
		want[o] = true
	}
	enc := json.NewEncoder(w)
	for _, b := range All() {
		if len(want) > 0 && !want[b.Name] {
			continue
		}
		lines, err := b.Run(ctx, cfg)
		if err != nil {
			return fmt.Errorf("bench %s: %w", b.Name, err)
		}
		for _, l := range lines {
			l.Value, l.BaselineValue, l.Ratio = round(l.Value), round(l.BaselineValue), round3(l.Ratio)
			if err := enc.Encode(l); err != nil {
				return err
			}
		}
	}
	return nil
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
