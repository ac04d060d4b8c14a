package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatest"
)

// runProc is a `streamctl run` child process.
type runProc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr syncBuffer
	done   chan error
}

func startRun(t *testing.T, env []string, args ...string) *runProc {
	t.Helper()
	p := &runProc{cmd: exec.Command(streamctlBin, append([]string{"run"}, args...)...), done: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// waitOutput waits until read_committed "counts" holds at least n records,
// failing the test if the process exits first (unless exitOK).
func waitOutput(t *testing.T, ctx context.Context, addr string, p *runProc, n int, exitOK bool) []*kgo.Record {
	t.Helper()
	for {
		recs, err := kafkatest.ReadCommitted(ctx, []string{addr}, "counts")
		if err == nil && len(recs) >= n {
			return recs
		}
		select {
		case err := <-p.done:
			p.done <- err
			if !exitOK {
				t.Fatalf("streamctl run exited (%v) with %d of %d output records; stderr:\n%s", err, len(recs), n, p.stderr.tail(60))
			}
		case <-ctx.Done():
			t.Fatalf("output did not reach %d records (have %d, %v); stderr:\n%s", n, len(recs), err, p.stderr.tail(60))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// streamctl run continues exactly-once across processes on one checkpoint
// dir: the first is killed by a failpoint after a completed checkpoint was
// persisted and before its transactions were committed, the second is
// SIGKILLed after it committed more output, the third finishes the input
// and stops cleanly on SIGTERM. Every word is counted 1..n, read_committed.
func TestRunContinuesExactlyOnceAfterSIGKILLOnTheSameCheckpointDir(t *testing.T) {
	env := kafkatest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.Addr), kgo.DefaultProduceTopic("lines"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 4, 1, nil, "lines"); err != nil {
		t.Fatal(err)
	}
	words := strings.Fields("the quick brown fox jumps over the lazy dog")
	var lines []string
	var recs []*kgo.Record
	for i := 0; i < 10000; i++ {
		l := fmt.Sprintf("%s %s w%d", words[i%len(words)], words[(i*7)%len(words)], i%50)
		lines = append(lines, l)
		recs = append(recs, kgo.StringRecord(l))
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	want := wordcount.Expected(lines)
	total := 0
	for _, n := range want {
		total += n
	}
	dir := t.TempDir()
	args := []string{"wordcount", "--set", "brokers=" + env.Addr, "--set", "group=wc", "--parallelism", "2",
		"--checkpoint-interval", "100ms", "--checkpoint-dir", dir, "--log-format", "json"}

	first := startRun(t, []string{failpoint.EnvVar + "=" + failpoint.JMAfterCheckpointPersisted + "=crash@1"}, args...)
	select {
	case err := <-first.done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("first run: %v, want killed by its failpoint; stderr:\n%s", err, first.stderr.tail(60))
		}
	case <-ctx.Done():
		t.Fatalf("first run not killed by its failpoint; stderr:\n%s", first.stderr.tail(60))
	}
	before, _ := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "counts")

	second := startRun(t, nil, args...)
	waitOutput(t, ctx, env.Addr, second, min(total, len(before)+total/4), false)
	if err := second.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-second.done
	mid, _ := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "counts")

	third := startRun(t, nil, args...)
	out := waitOutput(t, ctx, env.Addr, third, total, false)
	if rep := wordcount.Check(out, want); !rep.OK() {
		t.Fatalf("after two killed processes: %s; third run's stderr:\n%s", rep, third.stderr.tail(60))
	}
	if !strings.Contains(third.stderr.tail(1<<20), "restoring from checkpoint") {
		t.Errorf("the third process did not restore from a checkpoint; stderr:\n%s", third.stderr.tail(40))
	}
	if err := third.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-third.done; err != nil {
		t.Fatalf("SIGTERM: %v, want exit 0; stderr:\n%s", err, third.stderr.tail(40))
	}
	third.done <- nil
	if !strings.Contains(third.stdout.String(), "cancelled") {
		t.Errorf("stdout %q, want the cancelled line", third.stdout.String())
	}
	t.Logf("%d records committed before the first kill's restart, %d before the SIGKILL, %d in all", len(before), len(mid), len(out))
}

func TestRunRefusesBadInputWithAClearError(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown job", []string{"nope"}, `unknown job type "nope"`},
		{"unknown parameter", []string{"wordcount", "--set", "colour=red"}, `no parameter "colour"`},
		{"malformed set", []string{"wordcount", "--set", "brokers"}, "want key=value"},
		{"negative parallelism", []string{"wordcount", "--parallelism", "-1"}, "must not be negative"},
		{"zero interval", []string{"wordcount", "--checkpoint-interval", "0s"}, "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(streamctlBin, append([]string{"run"}, tc.args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Run(); err == nil {
				t.Fatal("exit 0, want an error")
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr %q, want it to contain %q", stderr.String(), tc.want)
			}
		})
	}
}
