package main

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
)

// procCluster is a job manager and task managers, each a streamctl
// process, against an in-process embedded broker.
type procCluster struct {
	*proctest.Cluster
	t   *testing.T
	env *kafkatest.Env
}

func newProcCluster(t *testing.T, bin string, brokerOpts ...broker.Opt) *procCluster {
	t.Helper()
	env := kafkatest.New(t, brokerOpts...)
	return &procCluster{Cluster: proctest.NewCluster(t, bin), t: t, env: env}
}

// twoTMs starts task managers tm-a and tm-b of two slots each.
func (c *procCluster) twoTMs() {
	c.t.Helper()
	c.StartTM("tm-a", 2)
	c.StartTM("tm-b", 2)
	c.WaitTMs("tm-a,tm-b")
}

// input produces lines to a topic; each line holds the unique word l<i>,
// so the committed output tells which lines were processed.
type input struct {
	kafkatest.Feeder
	t  *testing.T
	cl *kgo.Client
	n  int
}

func newInput(t *testing.T, ctx context.Context, addr, topic string, first int) *input {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 4, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	in := &input{t: t, cl: cl}
	if err := in.produce(ctx, first); err != nil {
		t.Fatal(err)
	}
	return in
}

func (in *input) produce(ctx context.Context, n int) error {
	recs := make([]*kgo.Record, n)
	for k := range recs {
		i := in.n
		in.n++
		recs[k] = kgo.StringRecord(kafkatest.InputLine(i))
	}
	return in.cl.ProduceSync(ctx, recs...).FirstErr()
}

// run produces 20 lines every 20ms until halt.
func (in *input) run(ctx context.Context) { in.Run(ctx, in.produce) }

func (in *input) halt() { in.Halt(in.t) }

// committed reads topic read_committed.
func committed(t *testing.T, ctx context.Context, addr, topic string) []*kgo.Record {
	t.Helper()
	recs, err := kafkatest.ReadCommitted(ctx, []string{addr}, topic)
	if err != nil {
		t.Fatalf("read %s: %v", topic, err)
	}
	return recs
}

// waitOutput waits until topic holds at least n records read_committed.
func (c *procCluster) waitOutput(ctx context.Context, topic string, n int) []*kgo.Record {
	c.t.Helper()
	for {
		recs, err := kafkatest.ReadCommitted(ctx, []string{c.env.Addr}, topic)
		if err == nil && len(recs) >= n {
			return recs
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("%s did not reach %d records (have %d, %v); %s", topic, n, len(recs), err, c.Logs(80))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// verify waits for every count the input topic asks for and checks the
// output record by record: each word counted 1..n.
func (c *procCluster) verify(ctx context.Context, in, out string) (records int) {
	c.t.Helper()
	lines := committed(c.t, ctx, c.env.Addr, in)
	vals := make([]string, len(lines))
	for i, r := range lines {
		vals[i] = string(r.Value)
	}
	want := wordcount.Expected(vals)
	total := 0
	for _, n := range want {
		total += n
	}
	got := c.waitOutput(ctx, out, total)
	if rep := wordcount.Check(got, want); !rep.OK() {
		c.t.Fatalf("%s: %s", out, rep)
	}
	return total
}

func wordcountArgs(brokers, group, in, out string) []string {
	return []string{"wordcount", "--parallelism", "2", "--checkpoint-interval", "200ms",
		"--set", "brokers=" + brokers, "--set", "group=" + group, "--set", "input=" + in, "--set", "output=" + out}
}

// wordcountJob is one exactly-once wordcount of a test that runs the same
// scenario on both sources at once, on one cluster and one input topic:
// the failure hits both jobs, and the added test time stays small.
type wordcountJob struct {
	source, group, output string
	id                    string
	before                int // output records committed at the failure
}

// wordcountOnEachSource is a wordcount job on each source: the share group
// (group wc, output counts) and the partition source (group wck, output
// counts-kafka).
func wordcountOnEachSource() []*wordcountJob {
	return []*wordcountJob{{source: "sharegroup", group: "wc", output: "counts"}, {source: "kafka", group: "wck", output: "counts-kafka"}}
}

// args are the job's submit arguments reading topic in.
func (j *wordcountJob) args(brokers, in string) []string {
	return append(wordcountArgs(brokers, j.group, in, j.output), "--set", "source="+j.source)
}

// A task manager SIGKILLed while the jobs run (a wordcount on each source,
// both with a subtask on it): each job restarts from its latest completed
// checkpoint on the task manager left, and every word is counted 1..n,
// read_committed, by each.
func TestSubmittedJobIsExactlyOnceAcrossATaskManagerSIGKILL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin)
	// Four slots each: the task manager left runs both jobs.
	c.StartTM("tm-a", 4)
	c.StartTM("tm-b", 4)
	c.WaitTMs("tm-a,tm-b")
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	jobs := wordcountOnEachSource()
	for _, j := range jobs {
		j.id = c.Submit(j.args(c.env.Addr, "lines")...)
	}
	for _, j := range jobs {
		j.before = len(c.waitOutput(ctx, j.output, 600))
	}
	c.TMs["tm-a"].Kill(t)
	for _, j := range jobs {
		st := c.WaitStatus(j.id, "restart on the task manager left", func(s proctest.JobStatus) bool { return s.Restarts >= 1 && s.State == "RUNNING" })
		if st.LastCompletedCheckpoint == 0 {
			t.Errorf("source=%s: status after the restart: %+v, want a completed checkpoint", j.source, st)
		}
		c.waitOutput(ctx, j.output, j.before+300)
	}
	in.halt()
	for _, j := range jobs {
		total := c.verify(ctx, "lines", j.output)
		if j.before >= total {
			t.Fatalf("source=%s: all %d output records were committed before the kill", j.source, total)
		}
		t.Logf("source=%s: %d lines, %d of %d output records committed at the SIGKILL", j.source, in.n, j.before, total)
	}
}

// The job manager SIGKILLed while jobs run (a wordcount on each source) and
// started again on the same data directory: it resumes each job from its
// latest completed checkpoint, the task managers reconnect by themselves,
// and every word is counted 1..n, read_committed, by each.
func TestSubmittedJobContinuesExactlyOnceAfterTheJobManagerIsSIGKILLed(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin)
	c.twoTMs()
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	jobs := wordcountOnEachSource()
	for _, j := range jobs {
		j.id = c.Submit(j.args(c.env.Addr, "lines")...)
	}
	for _, j := range jobs {
		j.before = len(c.waitOutput(ctx, j.output, 600))
	}
	c.JM.Kill(t)
	c.StartJM()
	c.WaitTMs("tm-a,tm-b")
	for _, j := range jobs {
		c.WaitStatus(j.id, "resumed job", func(s proctest.JobStatus) bool { return s.State == "RUNNING" })
		c.waitOutput(ctx, j.output, j.before+300)
	}
	in.halt()
	for _, j := range jobs {
		total := c.verify(ctx, "lines", j.output)
		if j.before >= total {
			t.Fatalf("source=%s: all %d output records were committed before the kill", j.source, total)
		}
		t.Logf("source=%s: %d lines, %d of %d output records committed at the SIGKILL", j.source, in.n, j.before, total)
	}
	if !strings.Contains(c.JM.Stderr.Tail(1<<20), "resuming job") {
		t.Errorf("the restarted job manager did not log resuming the job; stderr:\n%s", c.JM.Stderr.Tail(40))
	}
	list, err := c.Run("list", "--output", "json")
	for _, j := range jobs {
		if err != nil || !strings.Contains(list, j.id) {
			t.Fatalf("list after the restart: %q, %v; want job %s", list, err, j.id)
		}
	}
	for _, p := range []*proctest.Proc{c.TMs["tm-a"], c.TMs["tm-b"], c.JM} {
		p.Stop(t)
	}
}

// lineIDs returns the l<i> tokens of lines.
func lineIDs(values [][]byte) map[string]int {
	ids := map[string]int{}
	for _, v := range values {
		for _, w := range strings.Fields(string(v)) {
			if strings.HasPrefix(w, "l") && len(w) > 1 && w[1] >= '0' && w[1] <= '9' {
				ids[w]++
			}
		}
	}
	return ids
}

// A cancelled job leaves nothing behind: no transaction open (read_committed
// readers see every topic up to its high watermark), and no share record
// held. Record by record: with record locks far longer than the test, a
// plain share consumer of the job's group then gets exactly the lines whose
// words the job did not commit, at once.
func TestCancelLeavesNoOpenTransactionAndNoHeldShareRecord(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin, broker.Config("group.share.record.lock.duration.ms", "600000"))
	c.twoTMs()
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	// Checkpoints 1s apart: the cancel comes with up to a second of input
	// read and not committed. The input runs on until the cancel returned:
	// halted before it, the job could read everything and commit it in a
	// checkpoint completing while the cancel is on its way, leaving nothing
	// held to check.
	args := wordcountArgs(c.env.Addr, "wc", "lines", "counts")
	args = append(args, "--checkpoint-interval", "1s")
	id := c.Submit(args...)
	c.waitOutput(ctx, "counts", 1000)
	out, err := c.Run("cancel", id, "--output", "json")
	in.halt()
	if err != nil {
		t.Fatal(err)
	}
	var st proctest.JobStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.State != "CANCELED" {
		t.Fatalf("cancel printed %q (%v), want state CANCELED", out, err)
	}

	c.env.RequireNothingOpen(c.t, "counts", "__weir-acklog-wc")

	var keys [][]byte
	for _, r := range committed(t, ctx, c.env.Addr, "counts") {
		keys = append(keys, r.Key)
	}
	done := lineIDs(keys)
	if len(done) == 0 || len(done) >= in.n {
		t.Fatalf("the job committed %d of %d lines before the cancel, want some but not all", len(done), in.n)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.env.Addr), kgo.ShareGroup("wc"), kgo.ConsumeTopics("lines"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string]int{}
	pctx, pcancel := context.WithTimeout(ctx, 60*time.Second)
	defer pcancel()
	for len(got)+len(done) < in.n && pctx.Err() == nil {
		fs := cl.PollFetches(pctx)
		var vals [][]byte
		fs.EachRecord(func(r *kgo.Record) { vals = append(vals, r.Value) })
		for l, n := range lineIDs(vals) {
			got[l] += n
		}
	}
	var redelivered, twice []string
	for l, n := range got {
		if done[l] > 0 {
			redelivered = append(redelivered, l)
		}
		if n > 1 {
			twice = append(twice, l)
		}
	}
	if len(redelivered) > 0 || len(twice) > 0 {
		t.Errorf("after the cancel %d committed lines were redelivered (e.g. %.5v) and %d lines delivered twice (%.5v)",
			len(redelivered), redelivered, len(twice), twice)
	}
	if missing := in.n - len(done) - len(got); missing > 0 {
		t.Fatalf("%d of %d lines neither committed by the job nor delivered after the cancel: held by the cancelled job (%d committed, %d delivered)",
			missing, in.n, len(done), len(got))
	}
	t.Logf("%d lines: %d committed by the job before the cancel, %d delivered to the next consumer", in.n, len(done), len(got))
}

// A job cancelled while it waits to restart (its attempt failed after a
// checkpoint was persisted and before any task was notified, through the
// job manager's jm.after-checkpoint-persisted failpoint; the restart delay
// is 5 minutes), or right after the job manager was SIGKILLed there and
// started again (the job resuming, its task managers reconnecting), ends at
// once: no transaction is left open, the lines it committed are counted
// once, and a second job on the same share group (record locks last 10
// minutes, so a record the first job held would not come back in time)
// counts every other line: record by record, every line exactly once over
// both jobs' outputs.
func TestCancelWhileRestartingCommitsTheCompletedCheckpointAndLeavesNothingOpen(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		restartJM bool
	}{
		{name: "restart delay"},
		{name: "job manager just restarted", restartJM: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			// The job manager's failpoint (3s in), in its environment
			// only: the test process runs other tests at once.
			jmEnv := []string{failpoint.EnvVar + "=jm.after-checkpoint-persisted=error@15"}
			c := &procCluster{Cluster: proctest.NewStoppedCluster(t, streamctlBin), t: t,
				env: kafkatest.New(t, broker.Config("group.share.record.lock.duration.ms", "600000"))}
			c.StartJMEnv(jmEnv)
			c.twoTMs()
			in := newInput(t, ctx, c.env.Addr, "lines", 300)
			in.run(ctx)
			args := append(wordcountArgs(c.env.Addr, "wc", "lines", "counts"), "--restart-strategy", "fixed-delay:attempts=3,delay=5m")
			id := c.Submit(args...)
			c.WaitStatus(id, "restart", func(s proctest.JobStatus) bool { return s.State == "RESTARTING" })
			in.halt()
			if tt.restartJM {
				c.JM.Kill(t)
				c.StartJMEnv(jmEnv)
			}
			out, err := c.Run("cancel", id, "--output", "json")
			if err != nil {
				t.Fatal(err)
			}
			var st proctest.JobStatus
			if err := json.Unmarshal([]byte(out), &st); err != nil || st.State != "CANCELED" {
				t.Fatalf("cancel printed %q (%v), want state CANCELED", out, err)
			}
			c.env.RequireNothingOpen(c.t, "counts", "__weir-acklog-wc")
			done := outputLines(t, committed(t, ctx, c.env.Addr, "counts"))
			if len(done) == 0 || len(done) >= in.n {
				t.Fatalf("the job committed %d of %d lines before the cancel, want some but not all", len(done), in.n)
			}
			if tt.restartJM {
				c.WaitTMs("tm-a,tm-b")
			}

			second := c.Submit(wordcountArgs(c.env.Addr, "wc", "lines", "counts2")...)
			var rest map[string]int
			for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				recs, err := kafkatest.ReadCommitted(ctx, []string{c.env.Addr}, "counts2")
				if err != nil && !errors.Is(err, kafkatest.ErrUnknownTopic) {
					t.Fatal(err)
				}
				rest = outputLines(t, recs)
				if len(done)+len(rest) >= in.n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 90s the second job counted %d lines, the first %d, of %d: the rest is held or lost; %s",
						len(rest), len(done), in.n, c.Logs(40))
				}
			}
			if _, err := c.Run("cancel", second); err != nil {
				t.Fatal(err)
			}
			var twice []string
			for l := range rest {
				if done[l] > 0 {
					twice = append(twice, l)
				}
			}
			if len(twice) > 0 || len(done)+len(rest) != in.n {
				t.Fatalf("%d lines counted by both jobs (%.5v); %d + %d lines counted of %d", len(twice), twice, len(done), len(rest), in.n)
			}
			t.Logf("%d lines: %d counted before the cancel, %d by the second job", in.n, len(done), len(rest))
		})
	}
}

// outputLines returns the l<i> words of wordcount output, failing the test
// if one was counted more than once.
func outputLines(t *testing.T, recs []*kgo.Record) map[string]int {
	t.Helper()
	keys := make([][]byte, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	ids := lineIDs(keys)
	for l, n := range ids {
		if n > 1 {
			t.Fatalf("line %s counted %d times", l, n)
		}
	}
	return ids
}

// Two wordcount jobs with their own groups, inputs and outputs run at once
// on one cluster (4 slots, 2 each): their transactional ids derive from
// their job ids, so neither fences the other, and both count every word
// 1..n, read_committed.
func TestTwoWordcountJobsRunAtOnceBothExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin)
	c.twoTMs()
	var ids []string
	var ins []*input
	for _, n := range []string{"1", "2"} {
		in := newInput(t, ctx, c.env.Addr, "lines"+n, 300)
		in.run(ctx)
		ins = append(ins, in)
		ids = append(ids, c.Submit(wordcountArgs(c.env.Addr, "wc"+n, "lines"+n, "counts"+n)...))
	}
	for _, n := range []string{"1", "2"} {
		c.waitOutput(ctx, "counts"+n, 1500)
	}
	for _, in := range ins {
		in.halt()
	}
	for i, n := range []string{"1", "2"} {
		total := c.verify(ctx, "lines"+n, "counts"+n)
		st := c.Status(ids[i])
		if st.State != "RUNNING" || st.Restarts != 0 {
			t.Errorf("job %s: %+v, want RUNNING without restarts", n, st)
		}
		t.Logf("job %s: %d lines, %d output records", n, ins[i].n, total)
	}
	// A job needing more slots than the cluster has is refused at submit.
	args := append([]string{"submit"}, wordcountArgs(c.env.Addr, "wc3", "lines1", "counts3")...)
	out, err := c.Run(append(args, "--parallelism", "5")...)
	if err == nil || !strings.Contains(err.Error(), "needs 5 slots") {
		t.Errorf("a job of parallelism 5 on 4 slots: %q, %v; want an error about slots", out, err)
	}
}

// Bad submissions are refused with one clear error and leave no job behind.
func TestSubmitRefusesBadInputWithAClearError(t *testing.T) {
	t.Parallel()
	c := newProcCluster(t, streamctlBin)
	c.StartTM("tm-a", 2)
	c.WaitTMs("tm-a")
	ok := "brokers=" + c.env.Addr
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown job type", []string{"submit", "wordcont", "--set", ok}, `unknown job type "wordcont" (registered: nexmark, sessions, uppercase, wordcount)`},
		{"unknown parameter", []string{"submit", "wordcount", "--set", ok, "--set", "ouput=x"}, `has no parameter "ouput"`},
		{"bad parameter value", []string{"submit", "wordcount", "--set", ok, "--set", "guarantee=twice"}, `guarantee="twice", want one of`},
		{"more slots than the cluster has", []string{"submit", "wordcount", "--set", ok, "--parallelism", "3"}, "needs 3 slots"},
		{"unreachable broker", []string{"submit", "wordcount", "--set", "brokers=127.0.0.1:1"}, "brokers 127.0.0.1:1: brokers unreachable"},
		{"bad restart strategy", []string{"submit", "wordcount", "--set", ok, "--restart-strategy", "sometimes"}, "--restart-strategy"},
		{"bad checkpoint interval", []string{"submit", "wordcount", "--set", ok, "--checkpoint-interval", "0s"}, "--checkpoint-interval 0s must be positive"},
		{"unknown job id", []string{"status", "0123"}, "no such job: 0123"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := c.Run(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v: stdout %q, error %v; want an error containing %q", tc.args, out, err, tc.want)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
		})
	}
	cmd := exec.Command(streamctlBin, "list", "--jobmanager", "127.0.0.1:1")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "job manager at 127.0.0.1:1 is unreachable") {
		t.Errorf("list from an unreachable job manager: %q, %v", out, err)
	}
	if list, err := c.Run("list", "--output", "json"); err != nil || strings.TrimSpace(list) != "[]" {
		t.Errorf("jobs after refused submissions: %q, %v; want none", list, err)
	}
}
