package failpoint

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// helperEnv selects the child-process mode of the test binary used by the
// crash tests: the child hits a failpoint HELPER_HITS times, printing each
// hit, and exits 0 if it survives.
const (
	helperEnv     = "WEIR_FAILPOINT_TEST_HELPER"
	helperHitsEnv = "WEIR_FAILPOINT_TEST_HITS"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(runHelper())
	}
	goleak.VerifyTestMain(m)
}

func runHelper() int {
	s, err := FromEnv()
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 2
	}
	hits, _ := strconv.Atoi(os.Getenv(helperHitsEnv))
	for i := 1; i <= hits; i++ {
		os.Stdout.WriteString("hit " + strconv.Itoa(i) + "\n")
		if err := s.Inject(SinkAfterPrecommit); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			return 3
		}
	}
	return 0
}

// want is the expected parse result of one point.
type want struct {
	kind  kind
	nth   int64
	sleep time.Duration
}

func TestParseAcceptsContractSpecs(t *testing.T) {
	tests := []struct {
		spec string
		want map[string]want
	}{
		{spec: ""},
		{spec: " , "},
		{spec: "sink.after-precommit=crash", want: map[string]want{SinkAfterPrecommit: {kind: kindCrash}}},
		{spec: "jm.after-checkpoint-persisted=crash@3", want: map[string]want{JMAfterCheckpointPersisted: {kind: kindCrash, nth: 3}}},
		{spec: "task.process=sleep(25)", want: map[string]want{TaskProcess: {kind: kindSleep, sleep: 25 * time.Millisecond}}},
		{spec: "sink.after-commit=error, source.after-ack-commit = error@2 ,source.after-ack-precommit=sleep(0)", want: map[string]want{
			SinkAfterCommit:         {kind: kindError},
			SourceAfterAckCommit:    {kind: kindError, nth: 2},
			SourceAfterAckPrecommit: {kind: kindSleep},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			s, err := Parse(tt.spec)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.spec, err)
			}
			if len(s.points) != len(tt.want) {
				t.Fatalf("Parse(%q) has %d points, want %d", tt.spec, len(s.points), len(tt.want))
			}
			if s.Enabled() != (len(tt.want) > 0) {
				t.Errorf("Enabled() = %v", s.Enabled())
			}
			for name, w := range tt.want {
				p, ok := s.points[name]
				if !ok {
					t.Fatalf("point %q missing", name)
				}
				if p.kind != w.kind || p.nth != w.nth || p.sleep != w.sleep {
					t.Errorf("point %q = {kind %d nth %d sleep %v}, want {kind %d nth %d sleep %v}",
						name, p.kind, p.nth, p.sleep, w.kind, w.nth, w.sleep)
				}
			}
		})
	}
}

func TestParseRejectsBadSpecs(t *testing.T) {
	tests := []struct{ spec, mention string }{
		{"sink.after-precommit", "want name=action"},
		{"sink.after-precommit=", "want name=action"},
		{"=crash", "empty failpoint name"},
		{"sink after=crash", "illegal character"},
		{"task.process=explode", "unknown action"},
		{"task.process=crash@0", "@N"},
		{"task.process=crash@x", "@N"},
		{"task.process=crash@-1", "@N"},
		{"task.process=sleep(abc)", "sleep needs"},
		{"task.process=sleep(-5)", "sleep needs"},
		{"task.process=sleep(5", "unknown action"},
		{"task.process=error,task.process=crash", "configured twice"},
		{"task.proces=crash", `unknown failpoint "task.proces" (known: source.after-ack-precommit, sink.after-precommit, jm.after-checkpoint-persisted, sink.after-commit, source.after-ack-commit, task.process)`},
		{"sink.after-commit=error,source.after-ack=crash", `"source.after-ack=crash": unknown failpoint "source.after-ack"`},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			s, err := Parse(tt.spec)
			if err == nil {
				t.Fatalf("Parse(%q) = %v, want error", tt.spec, s.Names())
			}
			if !errors.Is(err, ErrBadSpec) {
				t.Errorf("error %v does not wrap ErrBadSpec", err)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Errorf("error %q does not mention %q", err, tt.mention)
			}
		})
	}
}

func TestFromEnvReportsVariableOnBadSpec(t *testing.T) {
	for _, spec := range []string{"x=nope", "task.process=error, sink.after-comit=crash@2"} {
		t.Setenv(EnvVar, spec)
		_, err := FromEnv()
		// The error quotes what the user wrote, whole.
		if quoted := EnvVar + "=" + strconv.Quote(spec); !errors.Is(err, ErrBadSpec) || !strings.HasPrefix(err.Error(), quoted) {
			t.Fatalf("FromEnv error = %v, want ErrBadSpec starting with %s", err, quoted)
		}
	}
	t.Setenv(EnvVar, "task.process=error")
	s, err := FromEnv()
	if err != nil || !errors.Is(s.Inject(TaskProcess), ErrInjected) {
		t.Fatalf("FromEnv = %v, %v; want a set whose task.process errors", s, err)
	}
}

func TestNilAndEmptySetInjectNothing(t *testing.T) {
	var nilSet *Set
	empty, err := Parse("")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Set{nilSet, empty} {
		if err := s.Inject(TaskProcess); err != nil {
			t.Errorf("Inject on %v = %v, want nil", s, err)
		}
		if err := s.InjectContext(context.Background(), TaskProcess); err != nil {
			t.Errorf("InjectContext on %v = %v, want nil", s, err)
		}
		if s.Hits(TaskProcess) != 0 || s.Enabled() {
			t.Errorf("empty set counts hits or is enabled")
		}
	}
}

func TestErrorActionWrapsErrInjectedAndNamesPoint(t *testing.T) {
	s, err := Parse("sink.after-commit=error,task.process=error@2")
	if err != nil {
		t.Fatal(err)
	}
	err = s.Inject(SinkAfterCommit)
	if !errors.Is(err, ErrInjected) || !strings.Contains(err.Error(), SinkAfterCommit) {
		t.Fatalf("Inject = %v, want ErrInjected naming the point", err)
	}
	if err := s.Inject(SinkAfterPrecommit); err != nil {
		t.Fatalf("unconfigured point returned %v", err)
	}
	var got []bool
	for range 4 {
		got = append(got, s.Inject(TaskProcess) != nil)
	}
	if want := []bool{false, true, false, false}; !equal(got, want) {
		t.Fatalf("error@2 fired on hits %v, want %v", got, want)
	}
	if h := s.Hits(TaskProcess); h != 4 {
		t.Fatalf("Hits = %d, want 4", h)
	}
}

func equal(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSleepActionSleepsAndHonoursContext(t *testing.T) {
	s, err := Parse("task.process=sleep(30),sink.after-commit=sleep(60000)")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.Inject(TaskProcess); err != nil {
		t.Fatalf("sleep returned %v", err)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("sleep(30) returned after %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.InjectContext(ctx, SinkAfterCommit); !errors.Is(err, context.Canceled) {
		t.Fatalf("InjectContext with done ctx = %v, want context.Canceled", err)
	}
}

func TestHookRunsAndItsErrorIsReturned(t *testing.T) {
	errCrash := errors.New("simulated crash")
	calls := 0
	s, err := Parse("sink.after-precommit=crash", WithHook(SinkAfterPrecommit, func() error {
		calls++
		if calls == 2 {
			return errCrash
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Inject(SinkAfterPrecommit); err != nil { // the hook replaced crash
		t.Fatalf("first hit = %v", err)
	}
	err = s.Inject(SinkAfterPrecommit)
	if !errors.Is(err, errCrash) || !strings.Contains(err.Error(), SinkAfterPrecommit) {
		t.Fatalf("second hit = %v, want the hook error naming the point", err)
	}
	if New(WithHook("x", nil)).Enabled() {
		t.Fatal("a nil hook configured a point")
	}
}

func TestCrashInProcessCallsKill(t *testing.T) {
	s, err := Parse("task.process=crash@2")
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	s.kill = func() { killed++ }
	_ = s.Inject(TaskProcess)
	if killed != 0 {
		t.Fatal("crash@2 killed on hit 1")
	}
	if err := s.Inject(TaskProcess); killed != 1 || !errors.Is(err, ErrInjected) {
		t.Fatalf("crash@2 on hit 2: killed=%d err=%v", killed, err)
	}
}

// TestCrashKillsChildWithSIGKILL re-executes the test binary as a helper that
// hits sink.after-precommit several times, and checks that it dies by SIGKILL
// exactly on the configured hit, having printed the hits before it.
func TestCrashKillsChildWithSIGKILL(t *testing.T) {
	tests := []struct {
		action   string
		hits     int
		wantDie  bool
		wantLast int
	}{
		{"crash", 5, true, 1},
		{"crash@3", 5, true, 3},
		{"crash@9", 5, false, 5},
	}
	for _, tt := range tests {
		t.Run(tt.action, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(),
				helperEnv+"=1",
				helperHitsEnv+"="+strconv.Itoa(tt.hits),
				EnvVar+"="+SinkAfterPrecommit+"="+tt.action,
			)
			var out, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &stderr
			err := cmd.Run()
			lines := strings.Fields(strings.ReplaceAll(out.String(), "hit ", ""))
			last := 0
			if len(lines) > 0 {
				last, _ = strconv.Atoi(lines[len(lines)-1])
			}
			if last != tt.wantLast {
				t.Errorf("last hit printed = %d, want %d (stdout %q)", last, tt.wantLast, out.String())
			}
			if !tt.wantDie {
				if err != nil {
					t.Fatalf("child failed: %v, stderr %q", err, stderr.String())
				}
				return
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("child exited with %v, want death by signal", err)
			}
			ws, ok := ee.Sys().(syscall.WaitStatus)
			if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("child status %v, want killed by SIGKILL", ee)
			}
			if !strings.Contains(stderr.String(), "failpoint "+SinkAfterPrecommit+": crash") {
				t.Errorf("stderr %q does not announce the crash", stderr.String())
			}
		})
	}
}

func TestDefaultIsParsedOnce(t *testing.T) {
	a, errA := Default()
	b, errB := Default()
	if a != b || errA != errB {
		t.Fatalf("Default returned different results: %p/%v, %p/%v", a, errA, b, errB)
	}
}

func BenchmarkInjectUnset(b *testing.B) {
	s, _ := Parse("")
	for b.Loop() {
		_ = s.Inject(TaskProcess)
	}
}

func BenchmarkInjectOtherPointSet(b *testing.B) {
	s, _ := Parse("sink.after-commit=error")
	for b.Loop() {
		_ = s.Inject(TaskProcess)
	}
}

// Known lists every name the code fires, each once, in contract order, and
// Parse accepts exactly those.
func TestKnownNamesAreTheContractAndParseAcceptsThem(t *testing.T) {
	want := []string{SourceAfterAckPrecommit, SinkAfterPrecommit, JMAfterCheckpointPersisted, SinkAfterCommit, SourceAfterAckCommit, TaskProcess}
	var got []string
	for _, p := range Known() {
		got = append(got, p.Name)
		if p.Where == "" {
			t.Errorf("failpoint %s has no description", p.Name)
		}
		if _, err := Parse(p.Name + "=error"); err != nil {
			t.Errorf("Parse(%s=error): %v", p.Name, err)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Known() = %v, want %v", got, want)
	}
}
