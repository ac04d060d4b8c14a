package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/nexmark"
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

// The parallel ceiling counts each word exactly as the loop does, every
// word in one counter only (its hash routes it there every time).
func TestParallelWordcountCountsEachWordInOneCounter(t *testing.T) {
	corpus := Corpus(1, 5_000, 10, 2_000)
	want := map[string]int64{}
	for _, l := range corpus {
		for _, w := range strings.Fields(strings.ToLower(l)) {
			want[w]++
		}
	}
	for _, par := range []int{1, 2, 3} {
		_, counts := parallelWordcount(corpus, par)
		got := map[string]int64{}
		for _, m := range counts {
			for w, n := range m {
				if got[w] != 0 {
					t.Fatalf("parallelism %d: %q counted by two counters", par, w)
				}
				got[w] = n
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("parallelism %d: %d distinct words counted, %d in the corpus, or their counts differ", par, len(got), len(want))
		}
	}
}

// Every benchmark reports its lines, each comparison with its alternated
// runs and their spread, each limit with its runs (values are measured,
// never asserted).
func TestEveryBenchmarkReportsItsLines(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the benchmarks")
	}
	want := map[string][]string{
		"runtime-wordcount":           {"words_per_s"},
		"limit-runtime-wordcount":     {"words_per_s"},
		"runtime-wordcount-2tm":       {"words_per_s"},
		"checkpoint-cycle":            {"p50_ms", "p99_ms", "s3_full_p50_ms", "s3_incremental_p50_ms", "s3_incremental_bytes"},
		"window-wordcount":            {"words_per_s"},
		"window-state-per-key":        {"bytes_per_key_window"},
		"eos-sink":                    {"records_per_s"},
		"eos-wordcount":               {"records_per_s"},
		"eos-wordcount-kafka":         {"records_per_s"},
		"eos-wordcount-kafka-ceiling": {"records_per_s"},
		"nexmark-topic-q0-kafka":      {"events_per_cpu_s"},
		"share-inflight":              {"max_held_per_partition"},
		"recovery":                    {"seconds_to_resume"},
		"failover":                    {"seconds_to_resume"},
		"limit-produce":               {"records_per_s"},
		"limit-share-consume":         {"records_per_s"},
		"limit-wordcount":             {"records_per_s"},
		"nexmark-generator":           {"events_per_cpu_s"},
		"sharegroup-watermark":        {"clicks_per_s", "watermark_lag_p50_ms", "watermark_lag_p99_ms"},
		"state-memory":                {"heap_bytes_per_value_entry", "heap_bytes_per_map_entry", "heap_bytes_per_timer"},
	}
	var nexmarkQueries []string
	for _, q := range nexmark.Queries() {
		for _, cp := range []string{"10s", "1s"} {
			b := "nexmark-" + q + "-cp" + cp
			want[b] = []string{"events_per_cpu_s"}
			nexmarkQueries = append(nexmarkQueries, b)
		}
	}
	compared := []string{"runtime-wordcount", "limit-runtime-wordcount", "runtime-wordcount-2tm", "window-wordcount", "eos-sink", "eos-wordcount", "eos-wordcount-kafka",
		"eos-wordcount-kafka-ceiling", "nexmark-topic-q0-kafka", "limit-wordcount", "recovery", "failover", "sharegroup-watermark"}
	limits := []string{"limit-produce", "limit-share-consume"}
	const runs = 2
	var buf bytes.Buffer
	if err := Run(t.Context(), &buf, Config{Quick: true, tiny: true, runs: runs, checkpoints: 5}); err != nil {
		t.Fatal(err)
	}
	t.Logf("bench output:\n%s", buf.String())
	got := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l Line
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		got[l.Bench] = append(got[l.Bench], l.Metric)
		if l.Value <= 0 {
			t.Errorf("%s %s: value %v", l.Bench, l.Metric, l.Value)
		}
		if slices.Contains(compared, l.Bench) {
			if l.Baseline == "" || l.BaselineValue <= 0 || l.Ratio <= 0 {
				t.Errorf("%s: no baseline: %s", l.Bench, line)
			}
			if l.Runs != runs || !(l.RatioMin <= l.Ratio && l.Ratio <= l.RatioMax) || !(l.ValueMin <= l.Value && l.Value <= l.ValueMax) {
				t.Errorf("%s: want %d runs, ratio_min <= ratio <= ratio_max, value_min <= value <= value_max: %s", l.Bench, runs, line)
			}
		}
		if slices.Contains(nexmarkQueries, l.Bench) || l.Bench == "nexmark-generator" {
			if l.Runs != runs || l.EventsPerS <= 0 || !(l.ValueMin <= l.Value && l.Value <= l.ValueMax) {
				t.Errorf("%s: want %d runs, events_per_s, value_min <= value <= value_max: %s", l.Bench, runs, line)
			}
			if l.Bench != "nexmark-generator" && (l.Baseline != "nexmark-generator" || l.BaselineValue <= 0 || l.Ratio <= 0) {
				t.Errorf("%s: want the generator alone as baseline: %s", l.Bench, line)
			}
		}
		if slices.Contains(limits, l.Bench) {
			if l.Runs != runs || !(l.ValueMin <= l.Value && l.Value <= l.ValueMax) || l.Baseline != "" {
				t.Errorf("%s: want %d runs, value_min <= value <= value_max, no baseline: %s", l.Bench, runs, line)
			}
		}
	}
	for b, metrics := range want {
		if strings.Join(got[b], ",") != strings.Join(metrics, ",") {
			t.Errorf("bench %s reported %v, want %v", b, got[b], metrics)
		}
	}
	if len(got) != len(want) {
		t.Errorf("benches reported: %v, want those of %v", got, want)
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
	// tiny: the checkpoint-storage part that follows (its lines are not
	// asserted here) runs at the size TestEveryBenchmarkReportsItsLines
	// checks it at, 3 checkpoints a side instead of 5.
	cfg := Config{Quick: true, tiny: true, checkpoints: 5, clusterOpts: []runtime.ClusterOpt{runtime.Failpoints(fp)}}
	lines, err := CheckpointCycle(t.Context(), cfg)
	if err != nil {
		t.Fatalf("checkpoint-cycle with slow checkpoints: %v", err)
	}
	if len(lines) < 2 || lines[0].Metric != "p50_ms" || lines[1].Metric != "p99_ms" {
		t.Fatalf("lines = %+v, want p50_ms and p99_ms first", lines)
	}
	// Every measured cycle includes the injected 1000 ms.
	for _, l := range lines[:2] {
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
			wantErr: []string{`unknown benchmark "eos-wordcont"`, "runtime-wordcount, runtime-wordcount-2tm, checkpoint-cycle, window-wordcount, eos-sink, eos-wordcount"}},
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

func TestComparedIsTheMedianOfAlternatedRunsWithItsSpread(t *testing.T) {
	tests := []struct {
		name       string
		weir, base []float64
		want       Line
	}{
		{name: "one run", weir: []float64{3}, base: []float64{2},
			want: Line{Value: 3, BaselineValue: 2, Ratio: 1.5, RatioMin: 1.5, RatioMax: 1.5, ValueMin: 3, ValueMax: 3, Runs: 1}},
		// The ratio is the median of per-run ratios (0.5, 2, 1), not
		// the ratio of the medians (2/2).
		{name: "odd", weir: []float64{1, 4, 3}, base: []float64{2, 2, 3},
			want: Line{Value: 3, BaselineValue: 2, Ratio: 1, RatioMin: 0.5, RatioMax: 2, ValueMin: 1, ValueMax: 4, Runs: 3}},
		{name: "even: mean of the middle two", weir: []float64{2, 6, 4, 8}, base: []float64{2, 2, 2, 2},
			want: Line{Value: 5, BaselineValue: 2, Ratio: 2.5, RatioMin: 1, RatioMax: 4, ValueMin: 2, ValueMax: 8, Runs: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := compared("b", "m", "base", tt.weir, tt.base)
			got.Note = ""
			tt.want.Bench, tt.want.Metric, tt.want.Baseline = "b", "m", "base"
			if got != tt.want {
				t.Errorf("compared(%v, %v) = %+v, want %+v", tt.weir, tt.base, got, tt.want)
			}
		})
	}
}

// alternate measures Weir, then the baseline, then Weir again, ...
func TestAlternateInterleavesTheSides(t *testing.T) {
	var order []string
	side := func(name string) measure {
		return func(run int) (float64, error) {
			order = append(order, fmt.Sprintf("%s%d", name, run))
			return float64(run + 1), nil
		}
	}
	w, b, err := alternate(3, func(string, int) {}, side("w"), side("b"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"w0", "b0", "w1", "b1", "w2", "b2"}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if !slices.Equal(w, []float64{1, 2, 3}) || !slices.Equal(b, []float64{1, 2, 3}) {
		t.Errorf("rates %v %v", w, b)
	}
}

// With three sides (eos-wordcount's Weir, loop and ceiling) each run
// measures every side in the given order, and a later side's error names it.
func TestAlternateSidesMeasuresEverySideInEachRun(t *testing.T) {
	var order []string
	side := func(name string, fail int) side {
		return side{name, func(run int) (float64, error) {
			order = append(order, fmt.Sprintf("%s%d", name, run))
			if run == fail {
				return 0, errors.New("broke")
			}
			return float64(run + 1), nil
		}}
	}
	vs, err := alternateSides(2, func(string, int) {}, side("w", -1), side("b", -1), side("c", -1))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"w0", "b0", "c0", "w1", "b1", "c1"}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if len(vs) != 3 || !slices.Equal(vs[2], []float64{1, 2}) {
		t.Errorf("rates %v", vs)
	}
	_, err = alternateSides(2, func(string, int) {}, side("w", -1), side("c", 1))
	if err == nil || !strings.HasPrefix(err.Error(), "c: ") {
		t.Errorf("error %v, want one naming side c", err)
	}
}

func TestVisibleAtIsTheFirstSamplePastEveryPartitionsLastRecord(t *testing.T) {
	samples := []lsoSample{
		{at: 1 * time.Millisecond, lso: map[int32]int64{}},
		{at: 2 * time.Millisecond, lso: map[int32]int64{0: 5, 1: 3}},
		{at: 3 * time.Millisecond, lso: map[int32]int64{0: 10, 1: 3}},
		{at: 4 * time.Millisecond, lso: map[int32]int64{0: 10, 1: 8}},
	}
	tests := []struct {
		name   string
		last   map[int32]int64
		want   time.Duration
		wantOK bool
	}{
		{name: "last record at the last stable offset is not visible yet", last: map[int32]int64{0: 5}, want: 3 * time.Millisecond, wantOK: true},
		{name: "every partition", last: map[int32]int64{0: 9, 1: 2}, want: 3 * time.Millisecond, wantOK: true},
		{name: "the slower partition decides", last: map[int32]int64{0: 4, 1: 7}, want: 4 * time.Millisecond, wantOK: true},
		{name: "never", last: map[int32]int64{0: 10}},
		{name: "a partition never sampled", last: map[int32]int64{2: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := visibleAt(samples, tt.last)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("visibleAt(%v) = %v, %v; want %v, %v", tt.last, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestCheckCountsWantsEveryValueOnceInAnyOrder(t *testing.T) {
	rec := func(w, v string) *kgo.Record { return &kgo.Record{Key: []byte(w), Value: []byte(v)} }
	want := map[string]int{"a": 3, "b": 1}
	tests := []struct {
		name    string
		recs    []*kgo.Record
		wantErr string // substring; "" for none
	}{
		{name: "in order", recs: []*kgo.Record{rec("a", "1"), rec("a", "2"), rec("b", "1"), rec("a", "3")}},
		{name: "interleaved", recs: []*kgo.Record{rec("a", "2"), rec("b", "1"), rec("a", "1"), rec("a", "3")}},
		{name: "duplicate", recs: []*kgo.Record{rec("a", "1"), rec("a", "2"), rec("a", "2"), rec("a", "3"), rec("b", "1")}, wantErr: `word "a": 4 values`},
		{name: "lost", recs: []*kgo.Record{rec("a", "1"), rec("a", "3"), rec("b", "1")}, wantErr: `word "a": 2 values`},
		{name: "word missing", recs: []*kgo.Record{rec("a", "1"), rec("a", "2"), rec("a", "3")}, wantErr: `word "b": 0 values`},
		{name: "unknown word", recs: []*kgo.Record{rec("a", "1"), rec("a", "2"), rec("a", "3"), rec("b", "1"), rec("c", "1")}, wantErr: `"c" was never in the input`},
		{name: "not a count", recs: []*kgo.Record{rec("a", "x")}, wantErr: `value "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkCounts(tt.recs, want)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("checkCounts = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestFirstDeliveriesSkipsARecordDeliveredAgain(t *testing.T) {
	var f firstDeliveries
	for _, c := range []struct {
		partition int32
		offset    int64
		first     bool
	}{
		{0, 7, true},
		{1, 7, true}, // same offset, other partition
		{0, 8, true},
		{0, 7, false}, // delivered again
		{1, 7, false},
		{0, 130, true}, // past the first words of the bitmap
		{0, 129, true},
		{0, 130, false},
		{0, 8, false},
	} {
		if got := f.first(&kgo.Record{Partition: c.partition, Offset: c.offset}); got != c.first {
			t.Errorf("first(%d/%d) = %v, want %v", c.partition, c.offset, got, c.first)
		}
	}
}

// A run of --nexmark-backends writes its CPU profile when
// WEIR_NEXMARK_CPUPROFILE names a directory, as the default runs do.
func TestANexmarkRunOnABackendWritesACPUProfileWhenAsked(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvNexmarkCPUProfile, dir)
	r, err := RunNexmarkQuery(t.Context(), NexmarkRunSpec{Query: "q1", Backend: "pebble", Events: 5000, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.CPU <= 0 {
		t.Errorf("CPU %v", r.CPU)
	}
	b, err := os.ReadFile(filepath.Join(dir, "nexmark-q1-pebble.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b { // a pprof profile is gzipped
		t.Errorf("the profile is %d bytes, not gzip: % x", len(b), b[:min(len(b), 8)])
	}
}
