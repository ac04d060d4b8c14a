package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/weirstream/weir/bench"
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
