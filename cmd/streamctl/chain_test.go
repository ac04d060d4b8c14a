package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
)

// txnInput writes lines to a topic in transactions while a test runs: a
// committed transaction of 20 lines (each with the unique word l<i>), then
// an aborted one of 10 lines of words found nowhere else (ghost<i>), every
// 20 ms, from its own goroutine.
type txnInput struct {
	kafkatest.Feeder
	addr, topic string
	n           int // committed lines written
}

func (in *txnInput) write(ctx context.Context, lines int) error {
	var recs, ghosts []*kgo.Record
	for range lines {
		i := in.n
		in.n++
		recs = append(recs, &kgo.Record{Topic: in.topic, Key: fmt.Appendf(nil, "%d", i),
			Value: []byte(kafkatest.InputLine(i))})
	}
	for k := range lines / 2 {
		ghosts = append(ghosts, &kgo.Record{Topic: in.topic, Key: fmt.Appendf(nil, "%d", in.n+k),
			Value: fmt.Appendf(nil, "ghost%d the quick fox", in.n+k)})
	}
	if err := kafkatest.WriteTxn(ctx, []string{in.addr}, "input-committer", true, recs...); err != nil {
		return err
	}
	return kafkatest.WriteTxn(ctx, []string{in.addr}, "input-aborter", false, ghosts...)
}

func (in *txnInput) run(ctx context.Context) { in.Run(ctx, in.write) }

// runJob is one `streamctl run` process of a job on its own checkpoint dir,
// started again on that dir after a SIGKILL.
type runJob struct {
	t    *testing.T
	args []string
	p    *proctest.Proc
}

func startRunJob(t *testing.T, job, dir string, set ...string) *runJob {
	args := []string{"run", job, "--parallelism", "2", "--checkpoint-interval", "100ms", "--checkpoint-dir", dir}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	j := &runJob{t: t, args: args}
	j.p = startCluster(t, args...)
	return j
}

// kill SIGKILLs the process and starts it again on the same checkpoint dir.
func (j *runJob) kill() {
	j.t.Helper()
	if err := j.p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		j.t.Fatal(err)
	}
	<-j.p.Done
	j.p = startCluster(j.t, j.args...)
}

func (j *runJob) stop() {
	j.t.Helper()
	if err := j.p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		j.t.Fatal(err)
	}
	select {
	case <-j.p.Done:
	case <-time.After(60 * time.Second):
		j.t.Fatalf("%v did not stop within 60s of SIGTERM; stderr:\n%s", j.args, j.p.Stderr.Tail(40))
	}
}

// atLeast waits until topic holds n records read_committed and returns
// them, failing if a job's process exits first.
func atLeast(t *testing.T, ctx context.Context, addr, topic string, n int, jobs ...*runJob) []*kgo.Record {
	t.Helper()
	for {
		recs, err := kafkatest.ReadCommitted(ctx, []string{addr}, topic)
		if err == nil && len(recs) >= n {
			return recs
		}
		for _, j := range jobs {
			select {
			case <-j.p.Done:
				t.Fatalf("%v exited (%v) with %s at %d of %d records; stderr:\n%s", j.args, j.p.Cmd.ProcessState, topic, len(recs), n, j.p.Stderr.Tail(60))
			default:
			}
		}
		select {
		case <-ctx.Done():
			logs := ""
			for _, j := range jobs {
				logs += fmt.Sprintf("\n%v:\n%s", j.args, j.p.Stderr.Tail(30))
			}
			t.Fatalf("%s did not reach %d records (have %d, %v)%s", topic, n, len(recs), err, logs)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Exactly-once jobs chained through a topic, each its own process: the
// uppercase job reads the share group on "lines" and writes "upper"; a
// wordcount reads the share group on "upper" and writes "counts", another
// reads "upper"'s partitions (source=kafka, offsets in checkpoint state)
// and writes "counts-kafka". The input is written in transactions with
// aborted ones between the committed ones, and one transaction stays open
// for a while, then is aborted. Each job's process is SIGKILLed once while
// input flows (leaving transactions in "upper" and the counts that its next
// process aborts) and started again on its checkpoint dir. Record by
// record, read_committed: "upper" holds each committed line once,
// upper-cased, and each counts topic counts each of their words 1..n;
// nothing of an aborted or open transaction is read by any job.
func TestChainedExactlyOnceJobsSurviveSIGKILLsOfEither(t *testing.T) {
	t.Parallel()
	if out, err := exec.Command(streamctlBin, "jobs").Output(); err != nil || !strings.Contains(string(out), "uppercase ") {
		t.Fatalf("streamctl jobs: %q, %v; want the uppercase job listed", out, err)
	}
	env := kafkatest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Second)
	defer cancel()
	env.CreateTopic(t, "lines", 4, nil)
	env.CreateTopic(t, "upper", 4, nil)
	in := &txnInput{addr: env.Addr, topic: "lines"}
	if err := in.write(ctx, 200); err != nil {
		t.Fatal(err)
	}
	var open []*kgo.Record
	for k := range 20 {
		open = append(open, &kgo.Record{Topic: "lines", Key: fmt.Appendf(nil, "%d", k), Value: fmt.Appendf(nil, "open%d the lazy dog", k)})
	}
	endOpen := env.OpenTxn(t, "input-open", open...)
	in.run(ctx)

	up := startRunJob(t, "uppercase", t.TempDir(), "brokers="+env.Addr, "group=up", "input=lines", "output=upper")
	wc := startRunJob(t, "wordcount", t.TempDir(), "brokers="+env.Addr, "group=wc", "input=upper", "output=counts")
	wck := startRunJob(t, "wordcount", t.TempDir(), "brokers="+env.Addr, "group=wck", "input=upper", "output=counts-kafka", "source=kafka")
	atLeast(t, ctx, env.Addr, "upper", 200, up, wc, wck)
	endOpen(false)
	atLeast(t, ctx, env.Addr, "counts", 300, up, wc, wck)
	atLeast(t, ctx, env.Addr, "counts-kafka", 300, up, wc, wck)
	up.kill()
	before := len(atLeast(t, ctx, env.Addr, "counts", 800, up, wc, wck))
	wc.kill()
	atLeast(t, ctx, env.Addr, "counts", before+300, up, wc, wck)
	beforeK := len(atLeast(t, ctx, env.Addr, "counts-kafka", 800, up, wc, wck))
	wck.kill()
	atLeast(t, ctx, env.Addr, "counts-kafka", beforeK+300, up, wc, wck)
	in.Halt(t)

	lines := env.ReadCommitted(t, "lines")
	if len(lines) != in.n {
		t.Fatalf("%d lines read_committed, %d committed", len(lines), in.n)
	}
	want := make(map[string]int, len(lines))
	upper := make([]string, len(lines))
	for i, r := range lines {
		upper[i] = strings.ToUpper(string(r.Value))
		want[upper[i]]++
	}
	got := atLeast(t, ctx, env.Addr, "upper", len(lines), up, wc, wck)
	seen := make(map[string]int, len(got))
	for _, r := range got {
		seen[string(r.Value)]++
	}
	for l, n := range seen {
		if want[l] != n {
			t.Errorf("upper: %q %d times, want %d", l, n, want[l])
		}
	}
	for l, n := range want {
		if seen[l] != n {
			t.Errorf("upper: %q %d times, want %d", l, seen[l], n)
		}
	}
	// What a read_uncommitted reader of "upper" would also get: the
	// records of the upstream job's aborted transactions.
	dirty := 0
	if err := eachRecord(ctx, env.Addr, "upper", func(r *kgo.Record) {
		if !r.Attrs.IsControl() {
			dirty++
		}
	}); err != nil {
		t.Fatal(err)
	}
	dirty -= len(got)
	counts := wordcount.Expected(upper)
	total := 0
	for _, n := range counts {
		total += n
	}
	out := atLeast(t, ctx, env.Addr, "counts", total, up, wc, wck)
	if rep := wordcount.Check(out, counts); !rep.OK() {
		t.Fatalf("counts: %s", rep)
	}
	outK := atLeast(t, ctx, env.Addr, "counts-kafka", total, up, wc, wck)
	if rep := wordcount.Check(outK, counts); !rep.OK() {
		t.Fatalf("counts-kafka (source=kafka): %s", rep)
	}
	up.stop()
	wc.stop()
	wck.stop()
	t.Logf("%d committed input lines, %d output records each; %d counted when the share-group wordcount was killed, %d when the "+
		"partition-source one was; %d records of aborted upstream transactions in upper, not counted", in.n, len(out), before, beforeK, dirty)
}
