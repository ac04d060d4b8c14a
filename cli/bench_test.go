package cli

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/bench"
	"github.com/weirstream/weir/examples/nexmark"
	weirruntime "github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/test/demo"
)

func TestBenchOnlyUnknownNameIsAnErrorListingTheNames(t *testing.T) {
	stdout, stderr, err := runCLI(t, "bench", "--quick", "--only", "eos-sink,eos-wordcont")
	if !errors.Is(err, bench.ErrUnknownBenchmark) {
		t.Fatalf("bench --only eos-wordcont = %v, want ErrUnknownBenchmark", err)
	}
	want := `unknown benchmark "eos-wordcont": the benchmarks are ` + strings.Join(bench.Names(), ", ")
	if !strings.Contains(stderr, "Error: "+want) {
		t.Errorf("stderr %q lacks %q", stderr, want)
	}
	if stdout != "" {
		t.Errorf("a benchmark ran before the error: stdout %q", stdout)
	}
}

func TestBenchHelpListsTheBenchmarks(t *testing.T) {
	out, _, err := runCLI(t, "bench", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range bench.Names() {
		if !strings.Contains(out, "\n  "+name+"\n") {
			t.Errorf("bench --help does not list %s:\n%s", name, out)
		}
	}
}

func TestDemoRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--lines", "-5"}, {"--lines", "0"}, {"--partitions", "-1"}, {"--timeout", "0s"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			stdout, _, err := runCLI(t, append([]string{"demo"}, args...)...)
			if !errors.Is(err, demo.ErrBadConfig) || !strings.Contains(err.Error(), strings.Join(args, " ")) {
				t.Fatalf("demo %v = %v, want ErrBadConfig naming the flag", args, err)
			}
			if stdout != "" {
				t.Fatalf("demo started before refusing: %q", stdout)
			}
		})
	}
}

// bench --nexmark-backends runs every nexmark query to completion on each
// backend, each run in a process of its own (this binary), and reports per
// query and backend the events per CPU-second, the process's peak RSS and
// the largest checkpoint with its durations; a backend it does not know is
// an error before any run.
func TestBenchNexmarkBackendsReportsEveryQueryOnEveryBackendFromItsOwnProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 16 processes")
	}
	// Sixteen processes of this race-instrumented binary, one after the
	// other: more than runCLI's deadline on a loaded machine. 5,000 events
	// a run are enough for every line the test checks (at least the final
	// checkpoint, a job's peak RSS); 20,000 made q5 alone 13 s a run.
	stdout, stderr, err := runCLIWithin(t, 8*time.Minute, "bench", "--only", "nexmark", "--nexmark-events", "5000", "--nexmark-backends", "heap,pebble")
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	type line struct {
		Bench          string  `json:"bench"`
		Metric         string  `json:"metric"`
		Value          float64 `json:"value"`
		EventsPerS     float64 `json:"events_per_s"`
		PeakRSS        int64   `json:"peak_rss_bytes"`
		Checkpoints    int     `json:"checkpoints"`
		LargestTotalMs float64 `json:"largest_checkpoint_total_ms"`
		LargestSyncMs  float64 `json:"largest_checkpoint_sync_ms"`
		Baseline       string  `json:"baseline"`
		Ratio          float64 `json:"ratio"`
	}
	got := map[string]line{}
	for _, s := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("line %q: %v", s, err)
		}
		got[l.Bench] = l
	}
	var want []string
	for _, q := range nexmark.Queries() {
		for _, b := range []string{"heap", "pebble"} {
			want = append(want, "nexmark-"+q+"-"+b)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d lines, want %d (%v):\n%s", len(got), len(want), want, stdout)
	}
	for _, name := range want {
		l, ok := got[name]
		switch {
		case !ok:
			t.Errorf("no line %s", name)
		case l.Metric != "events_per_cpu_s" || l.Value <= 0 || l.EventsPerS <= 0:
			t.Errorf("%s: %+v, want events per CPU-second and per second", name, l)
		case l.PeakRSS < 8<<20 || l.PeakRSS > 4<<30:
			t.Errorf("%s: peak RSS %d bytes: not a process's that ran a job", name, l.PeakRSS)
		case l.Checkpoints < 1 || l.LargestTotalMs <= 0 || l.LargestSyncMs < 0:
			t.Errorf("%s: %+v, want the completed checkpoints (at least the final one) and the largest one's durations", name, l)
		}
	}
	if l := got["nexmark-q5-pebble"]; l.Baseline != "flink-1.13-rocksdb-per-core" || l.Ratio <= 0 {
		t.Errorf("nexmark-q5-pebble: %+v, want Flink's per-core figure as its baseline", l)
	}
	if l := got["nexmark-q5-heap"]; l.Baseline != "feldera-per-core" || l.Ratio <= 0 {
		t.Errorf("nexmark-q5-heap: %+v, want Feldera's per-core figure as its baseline", l)
	}

	_, _, err = runCLI(t, "bench", "--only", "nexmark", "--nexmark-events", "1000", "--nexmark-backends", "heap,rocksdb")
	if !errors.Is(err, weirruntime.ErrBadStateBackend) {
		t.Errorf("--nexmark-backends heap,rocksdb: %v, want ErrBadStateBackend", err)
	}
}

// bench --nexmark-state-memory is the pebble backend's budget in each run's
// process: the line's note names it and the longest checkpoint, and a
// budget the backend refuses fails the run with the backend's reason.
func TestBenchNexmarkStateMemoryIsThePebbleBudgetOfEachRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 2 processes")
	}
	stdout, stderr, err := runCLIWithin(t, 4*time.Minute, "bench", "--only", "nexmark", "--nexmark-events", "5000",
		"--nexmark-backends", "pebble", "--nexmark-queries", "q3", "--nexmark-state-memory", "64MiB")
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	var l struct {
		Bench string `json:"bench"`
		Note  string `json:"note"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(stdout)), &l); err != nil {
		t.Fatalf("output %q: %v", stdout, err)
	}
	if l.Bench != "nexmark-q3-pebble" || !strings.Contains(l.Note, "state memory 64 MiB") || !strings.Contains(l.Note, "the longest while every source ran") {
		t.Errorf("line %+v, want nexmark-q3-pebble whose note names state memory 64 MiB and the longest checkpoints", l)
	}

	_, stderr, err = runCLIWithin(t, 4*time.Minute, "bench", "--only", "nexmark", "--nexmark-events", "1000",
		"--nexmark-backends", "pebble", "--nexmark-queries", "q3", "--nexmark-state-memory", "1MiB")
	if err == nil || !strings.Contains(err.Error()+stderr, "below the minimum") {
		t.Errorf("--nexmark-state-memory 1MiB: %v (%s), want the run refused: below the backend's minimum", err, stderr)
	}
}
