package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/examples/wordcount"
	weirruntime "github.com/weirstream/weir/runtime"
)

// envActAsStreamctl makes the test binary act as streamctl (with
// wordcount registered) instead of running tests: the demo, run by the
// tests in-process, starts its cluster's processes from its own
// executable.
const envActAsStreamctl = "WEIR_CLI_TEST_ACT_AS_STREAMCTL"

// TestMain checks for leaked goroutines after all tests.
func TestMain(m *testing.M) {
	if os.Getenv(envActAsStreamctl) == "1" {
		reg := weirruntime.NewRegistry()
		if err := wordcount.Register(reg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		Main(reg)
		os.Exit(0)
	}
	os.Setenv(envActAsStreamctl, "1") // for the processes the tests start from this binary
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testRegistry is the registry streamctl is built with: wordcount.
func testRegistry(t *testing.T) *weirruntime.Registry {
	t.Helper()
	r := weirruntime.NewRegistry()
	if err := wordcount.Register(r); err != nil {
		t.Fatal(err)
	}
	return r
}

// runCLI runs the root command in-process.
//
// A command still running after runCLIDeadline is cancelled, so that a
// test expecting a refusal that never comes fails in minutes, not at the
// package's timeout.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return runCLIWithin(t, runCLIDeadline, args...)
}

// runCLIWithin is runCLI with another deadline, for a command that runs
// many processes of this (race-instrumented) test binary.
func runCLIWithin(t *testing.T, deadline time.Duration, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRootCmd(testRegistry(t), &out, &errb)
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	err = root.ExecuteContext(ctx)
	if ctx.Err() != nil && t.Context().Err() == nil {
		err = fmt.Errorf("streamctl %v still running after %v (cancelled): %w", args, deadline, err)
	}
	return out.String(), errb.String(), err
}

// runCLIDeadline bounds one runCLI call; no command the tests run with it
// takes a minute even under -race.
const runCLIDeadline = 3 * time.Minute

func TestVersionPrintsModuleAndGoVersion(t *testing.T) {
	out, _, err := runCLI(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"streamctl ", "module: github.com/weirstream/weir", "go: " + runtime.Version()} {
		if !strings.Contains(out, want) {
			t.Errorf("version output %q lacks %q", out, want)
		}
	}
}

func TestCLIRejectsBadInvocations(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate" for "streamctl"`},
		{"unknown flag", []string{"broker", "--frobnicate"}, "unknown flag: --frobnicate"},
		{"bad log level", []string{"--log-level", "loud", "version"}, `invalid --log-level "loud"`},
		{"bad log format", []string{"--log-format", "xml", "version"}, `invalid --log-format "xml"`},
		{"extra argument", []string{"version", "extra"}, `unknown command "extra"`},
		{"config without =", []string{"broker", "--config", "nokey"}, `"nokey": want key=value`},
		{"unknown config", []string{"broker", "--listen", "127.0.0.1:0", "--config", "no.such=1"}, `unknown broker config "no.such"`},
		{"config out of range", []string{"broker", "--listen", "127.0.0.1:0", "--config", "group.share.delivery.count.limit=-5"},
			`group.share.delivery.count.limit=-5 out of range [2, 10]`},
		// The job manager keeps the interval in milliseconds: 500us reached
		// it as 0 and silently became 1s; 1500us became 1ms.
		{"sub-millisecond interval (submit)", []string{"submit", "wordcount", "--jobmanager", "127.0.0.1:1", "--checkpoint-interval", "500us"},
			"--checkpoint-interval 500µs: want a whole number of milliseconds"},
		{"fractional millisecond interval (submit)", []string{"submit", "wordcount", "--jobmanager", "127.0.0.1:1", "--checkpoint-interval", "1500us"},
			"--checkpoint-interval 1.5ms: want a whole number of milliseconds"},
		{"data ports not a range", []string{"taskmanager", "--jobmanager", "127.0.0.1:1", "--data-ports", "7000"},
			`--data-ports: "7000" is not a port range LO-HI`},
		{"data ports reversed", []string{"taskmanager", "--jobmanager", "127.0.0.1:1", "--data-ports", "7001-7000"},
			`--data-ports: "7001-7000" is not a port range LO-HI`},
		{"sub-millisecond interval (run)", []string{"run", "wordcount", "--checkpoint-interval", "500us"},
			"--checkpoint-interval 500µs: want a whole number of milliseconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, err := runCLI(t, tt.args...)
			if err == nil {
				t.Fatal("command succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q lacks %q", err, tt.want)
			}
			if !strings.Contains(stderr, "Error: ") {
				t.Errorf("stderr %q does not show the error", stderr)
			}
		})
	}
}

func TestCompletionScriptIsGenerated(t *testing.T) {
	out, _, err := runCLI(t, "completion", "bash")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "__start_streamctl") {
		t.Fatalf("bash completion lacks __start_streamctl: %.200q", out)
	}
}

func TestLogFormatJSONWritesJSONToStderr(t *testing.T) {
	var out, errb bytes.Buffer
	a := &app{stdout: &out, stderr: &errb, logLevel: "info", logFormat: "json"}
	log, err := a.logger()
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("hidden")
	log.Info("shown")
	_ = log.Sync()
	if out.Len() != 0 {
		t.Fatalf("logger wrote to stdout: %q", out.String())
	}
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "{") || !strings.Contains(lines[0], `"msg":"shown"`) {
		t.Fatalf("stderr = %q, want one JSON line for the info message only", errb.String())
	}
}

// `run` of a bounded job ends with what it read and wrote and how fast it
// read: with Nexmark's discarding sink nothing else would say it.
func TestRunPrintsTheRecordsInAndOutAndTheRateAtTheEnd(t *testing.T) {
	reg := weirruntime.NewRegistry()
	if err := nexmark.Register(reg); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	root := newRootCmd(reg, &out, &errb)
	root.SetArgs([]string{"run", "nexmark", "--set", "query=q1", "--set", "events=3000", "--parallelism", "2", "--checkpoint-interval", "50ms"})
	if err := root.ExecuteContext(t.Context()); err != nil {
		t.Fatalf("run: %v\n%s", err, errb.String())
	}
	re := regexp.MustCompile(`(?m)^job \S+ finished: 0 restarts, last completed checkpoint \d+, records in 3000, out (\d+) in [0-9.]+(ms|s) \((\d+) records/s in\)$`)
	m := re.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("run printed %q; want the records in (3000) and out and the rate", out.String())
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Errorf("q1 wrote %d records, want one per bid", n)
	}
}
