package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/runtime"
)

func TestCorpusIsDeterministic(t *testing.T) {
	a, b := Corpus(7, 100, 10, 50), Corpus(7, 100, 10, 50)
	if strings.Join(a, "\n") != strings.Join(b, "\n") || len(strings.Fields(a[0])) != 10 {
		t.Fatal("corpus differs between runs with one seed, or has the wrong shape")
	}
}

func TestWeirWordcountCountsEveryWord(t *testing.T) {
	corpus := Corpus(3, 2000, 10, 300)
	if _, err := weirWordcount(t.Context(), corpus, 20000); err != nil {
		t.Fatal(err)
	}
}

func TestRunPrintsOneJSONLinePerResult(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a benchmark")
	}
	var buf bytes.Buffer
	if err := Run(t.Context(), &buf, Config{Quick: true}, "runtime-wordcount"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines: %q", len(lines), buf.String())
	}
	var l Line
	if err := json.Unmarshal([]byte(lines[0]), &l); err != nil {
		t.Fatal(err)
	}
	if l.Bench != "runtime-wordcount" || l.Metric != "words_per_s" || l.Value <= 0 || l.BaselineValue <= 0 || l.Ratio <= 0 {
		t.Fatalf("incomplete line %+v", l)
	}
}

// Every benchmark produces its lines (values are measured, not asserted).
func TestEveryBenchmarkReportsItsLines(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the benchmarks")
	}
	want := map[string][]string{
		"checkpoint-cycle": {"p50_ms", "p99_ms"},
		"eos-wordcount":    {"records_per_s"},
		"share-inflight":   {"max_held_per_partition"},
	}
	var buf bytes.Buffer
	if err := Run(t.Context(), &buf, Config{Quick: true}, "checkpoint-cycle", "eos-wordcount"); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l Line
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if l.Value <= 0 {
			t.Errorf("%s %s: value %v", l.Bench, l.Metric, l.Value)
		}
		got[l.Bench] = append(got[l.Bench], l.Metric)
	}
	for b, metrics := range want {
		if strings.Join(got[b], ",") != strings.Join(metrics, ",") {
			t.Errorf("bench %s reported %v, want %v", b, got[b], metrics)
		}
	}
}

// A busy machine makes every checkpoint slow. The benchmark must still
// report its lines: it measures a number of checkpoints, however long they
// take, instead of counting what completed in a fixed time. Each checkpoint
// is slowed by 1000 ms after it is persisted (the failpoint the driver fires
// between persisting and notifying), which is what a loaded machine did to
// the old 4-second window.
func TestCheckpointCycleReportsOnASlowMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a benchmark")
	}
	fp, err := failpoint.Parse(failpoint.JMAfterCheckpointPersisted + "=sleep(1000)")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Quick: true, checkpoints: 5, clusterOpts: []runtime.ClusterOpt{runtime.Failpoints(fp)}}
	lines, err := CheckpointCycle(t.Context(), cfg)
	if err != nil {
		t.Fatalf("checkpoint-cycle with slow checkpoints: %v", err)
	}
	if len(lines) != 2 || lines[0].Metric != "p50_ms" || lines[1].Metric != "p99_ms" {
		t.Fatalf("lines = %+v, want p50_ms and p99_ms", lines)
	}
	// Every measured cycle includes the injected 1000 ms.
	for _, l := range lines {
		if l.Value < 1000 {
			t.Errorf("%s = %v ms, below the injected 1000 ms: not the slowed checkpoints", l.Metric, l.Value)
		}
	}
}

func TestOnlyWithAnUnknownNameIsAnErrorListingTheNames(t *testing.T) {
	tests := []struct {
		name    string
		only    []string
		wantErr []string // substrings of the error; nil: no error
		want    []string // selected benchmarks
	}{
		{name: "none selects all", want: Names()},
		{name: "one known", only: []string{"eos-sink"}, want: []string{"eos-sink"}},
		{name: "run order kept", only: []string{"eos-wordcount", "runtime-wordcount"}, want: []string{"runtime-wordcount", "eos-wordcount"}},
		{name: "unknown", only: []string{"eos-wordcont"},
			wantErr: []string{`unknown benchmark "eos-wordcont"`, "runtime-wordcount, checkpoint-cycle, eos-sink, eos-wordcount"}},
		{name: "unknown among known", only: []string{"eos-sink", "nope", ""},
			wantErr: []string{`"nope", ""`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Select(tt.only...)
			if tt.wantErr != nil {
				if !errors.Is(err, ErrUnknownBenchmark) {
					t.Fatalf("Select(%q) = %v, want ErrUnknownBenchmark", tt.only, err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				// Run refuses before running anything.
				var buf bytes.Buffer
				if err := Run(t.Context(), &buf, Config{Quick: true}, tt.only...); !errors.Is(err, ErrUnknownBenchmark) || buf.Len() != 0 {
					t.Errorf("Run(%q) = %v, output %q; want ErrUnknownBenchmark and no output", tt.only, err, buf.String())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, b := range got {
				names = append(names, b.Name)
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("Select(%q) = %v, want %v", tt.only, names, tt.want)
			}
		})
	}
}

// A running benchmark passes its status to Config.Progress, then "" before
// its results are written.
func TestRunReportsProgressWhileABenchmarkRuns(t *testing.T) {
	var mu sync.Mutex
	var statuses []string
	cfg := Config{Progress: func(s string) {
		mu.Lock()
		defer mu.Unlock()
		statuses = append(statuses, s)
	}}
	b := Benchmark{Name: "fake", Run: func(_ context.Context, cfg Config) ([]Line, error) {
		cfg.progress("half way")
		return []Line{{Bench: "fake", Metric: "m", Value: 1}}, nil
	}}
	if _, err := runOne(t.Context(), cfg, b, "bench fake (1/1)"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(statuses) < 2 || !strings.HasPrefix(statuses[0], "bench fake (1/1): ") || statuses[len(statuses)-1] != "" {
		t.Fatalf("statuses = %q, want a status line first and \"\" last", statuses)
	}
}
