package demo

import (
	"bytes"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/proctest"
)

// streamctlBin is streamctl, built by TestMain: the demo runs its processes.
var streamctlBin string

func TestMain(m *testing.M) {
	os.Exit(proctest.Main(m, "../../cmd/streamctl", "streamctl", &streamctlBin))
}

// The demo runs its cluster as processes, SIGKILLs a task manager after
// output was committed and before all of it, and verifies exactly-once.
func TestDemoVerifiesExactlyOnceAfterATaskManagerIsKilled(t *testing.T) {
	var out, logs bytes.Buffer
	var mu sync.Mutex
	var statuses []string
	cfg := DefaultConfig()
	cfg.Lines, cfg.Exe, cfg.Stderr = 3000, streamctlBin, &logs
	cfg.Progress = func(s string) {
		mu.Lock()
		defer mu.Unlock()
		statuses = append(statuses, s)
	}
	if err := Run(t.Context(), &out, cfg); err != nil {
		t.Fatalf("demo failed: %v\n%s\nprocess logs:\n%s", err, out.String(), logs.String())
	}
	s := out.String()
	for _, want := range []string{"SIGKILLed task manager demo-tm-1 with", "restarted the job on demo-tm-2 from checkpoint",
		"restarted 1 time(s)", "exactly-once verified:", "0 duplicates, 0 lost"} {
		if !strings.Contains(s, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, s)
		}
	}
	m := regexp.MustCompile(`with (\d+) of (\d+) output records already committed`).FindStringSubmatch(s)
	if m == nil || m[1] == "0" || m[1] == m[2] {
		t.Fatalf("the kill came with %v output records committed: want some, not all:\n%s", m, s)
	}
	// The two checkpoint numbers tell one story: the job restored the
	// checkpoint that was the latest completed when the task manager died,
	// or one the dead task manager had acknowledged that completed just
	// after, and then says so.
	killedAt := regexp.MustCompile(`already committed \(checkpoint (\d+) completed\)`).FindStringSubmatch(s)
	restored := regexp.MustCompile(`restarted the job on demo-tm-2 from checkpoint (\d+)(.*)`).FindStringSubmatch(s)
	if killedAt == nil || restored == nil {
		t.Fatalf("the demo does not say which checkpoint completed before the kill and which one the job restored:\n%s", s)
	}
	k, _ := strconv.Atoi(killedAt[1])
	r, _ := strconv.Atoi(restored[1])
	switch {
	case r == k:
	case r > k && strings.Contains(restored[2], "completed just after the kill"):
	default:
		t.Fatalf("the demo says checkpoint %d completed before the kill and the job restored checkpoint %d:\n%s", k, r, s)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(statuses) == 0 || statuses[len(statuses)-1] != "" {
		t.Fatalf("progress statuses %q: want at least one, the last one \"\" (clear the live line)", statuses)
	}
	for _, st := range statuses[:len(statuses)-1] {
		if st != "" && !strings.Contains(st, "output records committed") {
			t.Errorf("progress status %q does not say how far the output is", st)
		}
	}
}

// Bad flags and bad failpoints are refused before anything starts: no
// process, no output.
func TestDemoRefusesBadConfigBeforeStarting(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Config)
		mention string
	}{
		{"negative lines", func(c *Config) { c.Lines = -5 }, "--lines -5"},
		{"zero lines", func(c *Config) { c.Lines = 0 }, "--lines 0"},
		{"negative partitions", func(c *Config) { c.Partitions = -1 }, "--partitions -1"},
		{"zero timeout", func(c *Config) { c.Timeout = 0 }, "--timeout 0s"},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second }, "--timeout -1s"},
		{"unknown failpoint", func(c *Config) { c.Failpoints = "sink.after-comit=crash" }, `WEIR_FAILPOINTS="sink.after-comit=crash"`},
		{"bad action", func(c *Config) { c.Failpoints = "sink.after-commit=boom" }, `unknown action "boom"`},
		{"no binary", func(c *Config) { c.Exe = "" }, "no streamctl binary"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Exe = streamctlBin
			tt.change(&cfg)
			var out bytes.Buffer
			err := Run(t.Context(), &out, cfg)
			if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("Run = %v, want ErrBadConfig mentioning %q", err, tt.mention)
			}
			if out.Len() != 0 {
				t.Fatalf("demo started before refusing its config: %q", out.String())
			}
		})
	}
	// Bad failpoint specs keep their own sentinel too.
	cfg := DefaultConfig()
	cfg.Exe, cfg.Failpoints = streamctlBin, "nope=crash"
	if err := Run(t.Context(), new(bytes.Buffer), cfg); !errors.Is(err, failpoint.ErrBadSpec) {
		t.Fatalf("Run = %v, want failpoint.ErrBadSpec", err)
	}
}
