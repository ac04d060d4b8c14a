package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func TestCorpusIsDeterministic(t *testing.T) {
	a, b := Corpus(7, 100, 10, 50), Corpus(7, 100, 10, 50)
	if strings.Join(a, "\n") != strings.Join(b, "\n") || len(strings.Fields(a[0])) != 10 {
		t.Fatal("corpus differs between runs with one seed, or has the wrong shape")
	}
}

func TestWeirWordcountCountsEveryWord(t *testing.T) {
	corpus := Corpus(3, 2000, 10, 300)
	if _, err := weirWordcount(context.Background(), corpus, 20000); err != nil {
		t.Fatal(err)
	}
}

func TestRunPrintsOneJSONLinePerResult(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a benchmark")
	}
	var buf bytes.Buffer
	if err := Run(context.Background(), &buf, Config{Quick: true}, "runtime-wordcount"); err != nil {
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
	if err := Run(context.Background(), &buf, Config{Quick: true}, "checkpoint-cycle", "eos-wordcount"); err != nil {
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
