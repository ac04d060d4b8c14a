package demo

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weirstream/weir/internal/failpoint"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDemoVerifiesExactlyOnceAfterAnInjectedFailure(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	var statuses []string
	cfg := DefaultConfig()
	cfg.Lines = 3000
	cfg.Progress = func(s string) {
		mu.Lock()
		defer mu.Unlock()
		statuses = append(statuses, s)
	}
	if err := Run(t.Context(), &out, cfg); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"restarted 1 time(s)", "exactly-once verified:", "0 duplicates, 0 lost"} {
		if !strings.Contains(s, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, s)
		}
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
// broker, no output.
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
		{"task.process taken by the demo", func(c *Config) { c.Failpoints = "task.process=sleep(1)" }, "the demo injects task.process itself"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
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
	cfg.Failpoints = "nope=crash"
	if err := Run(t.Context(), new(bytes.Buffer), cfg); !errors.Is(err, failpoint.ErrBadSpec) {
		t.Fatalf("Run = %v, want failpoint.ErrBadSpec", err)
	}
}
