package main

import (
	"bytes"
	"context"
	"fmt"
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
	"github.com/weirstream/weir/internal/proctest"
)

// committedAtLeast waits until read_committed "counts" holds at least n
// records and returns them, failing the test if p exits first.
func committedAtLeast(t *testing.T, ctx context.Context, addr string, p *proctest.Proc, n int) []*kgo.Record {
	t.Helper()
	for {
		recs, err := kafkatest.ReadCommitted(ctx, []string{addr}, "counts")
		if err == nil && len(recs) >= n {
			return recs
		}
		select {
		case <-p.Done:
			t.Fatalf("%v exited (%v) with %d of %d output records; stderr:\n%s", p.Cmd.Args, p.Cmd.ProcessState, len(recs), n, p.Stderr.Tail(60))
		case <-ctx.Done():
			t.Fatalf("output did not reach %d records (have %d, %v); stderr:\n%s", n, len(recs), err, p.Stderr.Tail(60))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// expectedCounts reads the input topic "lines" read_committed as it is now
// and returns the wordcount expected from it, its number of output records
// and the number of lines.
func expectedCounts(t *testing.T, ctx context.Context, addr string) (want map[string]int, total, lines int) {
	t.Helper()
	in, err := kafkatest.ReadCommitted(ctx, []string{addr}, "lines")
	if err != nil {
		t.Fatalf("read input: %v", err)
	}
	vals := make([]string, len(in))
	for i, r := range in {
		vals[i] = string(r.Value)
	}
	want = wordcount.Expected(vals)
	for _, n := range want {
		total += n
	}
	return want, total, len(vals)
}

// streamctl run continues exactly-once across processes on one checkpoint
// dir while input keeps arriving: the first process is killed by a
// failpoint after a completed checkpoint was persisted and before its
// transactions were committed, the second is SIGKILLed mid-run, the third
// finishes the input and stops cleanly on SIGTERM. Every word is counted
// 1..n, read_committed.
func TestRunContinuesExactlyOnceAfterSIGKILLOnTheSameCheckpointDir(t *testing.T) {
	t.Parallel()
	env := kafkatest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
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
	produced := 0
	produce := func(n int) error {
		var recs []*kgo.Record
		for range n {
			i := produced
			produced++
			recs = append(recs, kgo.StringRecord(fmt.Sprintf("%s %s w%d", words[i%len(words)], words[(i*7)%len(words)], i%50)))
		}
		return cl.ProduceSync(ctx, recs...).FirstErr()
	}
	if err := produce(500); err != nil {
		t.Fatal(err)
	}
	// Input arrives throughout the first two processes.
	stopInput, inputDone := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-stopInput:
				inputDone <- nil
				return
			case <-time.After(20 * time.Millisecond):
			}
			if err := produce(20); err != nil {
				inputDone <- err
				return
			}
		}
	}()

	dir := t.TempDir()
	args := []string{"run", "wordcount", "--set", "brokers=" + env.Addr, "--set", "group=wc", "--parallelism", "2",
		"--checkpoint-interval", "100ms", "--checkpoint-dir", dir, "--log-format", "json"}
	first := startClusterEnv(t, []string{failpoint.EnvVar + "=" + failpoint.JMAfterCheckpointPersisted + "=crash@3"}, args...)
	select {
	case <-first.Done:
		if ws, ok := first.Cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("first run ended %v, want killed by its failpoint; stderr:\n%s", first.Cmd.ProcessState, first.Stderr.Tail(60))
		}
	case <-ctx.Done():
		t.Fatalf("first run not killed by its failpoint; stderr:\n%s", first.Stderr.Tail(60))
	}
	before, _ := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "counts")

	second := startClusterEnv(t, nil, args...)
	committedAtLeast(t, ctx, env.Addr, second, len(before)+300)
	if err := second.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-second.Done
	mid, _ := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "counts")
	time.Sleep(300 * time.Millisecond) // input goes on while no process runs
	close(stopInput)
	if err := <-inputDone; err != nil {
		t.Fatalf("produce input: %v", err)
	}

	want, total, lines := expectedCounts(t, ctx, env.Addr)
	if len(mid) >= total {
		t.Fatalf("all %d output records were committed before the second kill: the test did not kill mid-run", total)
	}
	third := startClusterEnv(t, nil, args...)
	out := committedAtLeast(t, ctx, env.Addr, third, total)
	if rep := wordcount.Check(out, want); !rep.OK() {
		t.Fatalf("after two killed processes: %s; third run's stderr:\n%s", rep, third.Stderr.Tail(60))
	}
	if !strings.Contains(third.Stderr.Tail(1<<20), "restoring from checkpoint") {
		t.Errorf("the third process did not restore from a checkpoint; stderr:\n%s", third.Stderr.Tail(40))
	}
	if err := third.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-third.Done:
	case <-ctx.Done():
		t.Fatalf("no exit within the deadline after SIGTERM; stderr:\n%s", third.Stderr.Tail(40))
	}
	if code := third.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, third.Stderr.Tail(40))
	}
	select {
	case l := <-third.Out:
		if !strings.Contains(l, "cancelled") {
			t.Errorf("stdout %q, want the cancelled line", l)
		}
	default:
		t.Error("no stdout line after SIGTERM, want the cancelled line")
	}
	t.Logf("%d input lines; %d output records committed after the failpoint kill, %d after the SIGKILL, %d in all",
		lines, len(before), len(mid), len(out))
}
func TestRunRefusesBadInputWithAClearError(t *testing.T) {
	t.Parallel()
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

// streamctl run --retain-on-cancel: a run cancelled mid-stream by SIGTERM
// (checkpoints in memory: no --checkpoint-dir) writes its latest completed
// checkpoint out as a savepoint and prints its path; a run started from it
// at another parallelism continues the job while input keeps arriving:
// every word counted 1..n once, read_committed.
func TestRunRetainOnCancelLeavesASavepointThatContinuesTheJob(t *testing.T) {
	t.Parallel()
	env := kafkatest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	in := newInput(t, ctx, env.Addr, "lines", 300)
	in.run(ctx)

	spDir := t.TempDir()
	args := []string{"run", "wordcount", "--set", "brokers=" + env.Addr, "--set", "group=wc", "--checkpoint-interval", "100ms"}
	first := startClusterEnv(t, nil, append(args, "--parallelism", "2", "--retain-on-cancel", "--savepoint-dir", spDir)...)
	committedAtLeast(t, ctx, env.Addr, first, 900)
	if err := first.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Done:
	case <-ctx.Done():
		t.Fatalf("no exit after SIGTERM; stderr:\n%s", first.Stderr.Tail(40))
	}
	if code := first.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, first.Stderr.Tail(40))
	}
	var retained string
	for done := false; !done; {
		select {
		case l := <-first.Out:
			if p, ok := strings.CutPrefix(l, "retained checkpoint: "); ok {
				retained, _, _ = strings.Cut(p, " ")
			}
		default:
			done = true
		}
	}
	if retained == "" || !strings.HasPrefix(retained, spDir+"/retained-run-") {
		t.Fatalf("no retained checkpoint under %s printed (got %q); stderr:\n%s", spDir, retained, first.Stderr.Tail(40))
	}
	mid, _ := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "counts")

	second := startClusterEnv(t, nil, append(args, "--parallelism", "1", "--from-savepoint", retained)...)
	committedAtLeast(t, ctx, env.Addr, second, len(mid)+300)
	in.halt()
	want, total, lines := expectedCounts(t, ctx, env.Addr)
	out := committedAtLeast(t, ctx, env.Addr, second, total)
	if rep := wordcount.Check(out, want); !rep.OK() {
		t.Fatalf("continued from the retained checkpoint: %s; stderr:\n%s", rep, second.Stderr.Tail(60))
	}
	if err := second.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-second.Done
	t.Logf("%d input lines, %d output records, %d committed when the first run was cancelled (retained %s)", lines, len(out), len(mid), retained)
}
