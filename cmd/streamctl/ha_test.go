package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
	"github.com/weirstream/weir/jobmanager/ha"
)

// haCluster is job managers of one highly available cluster (streamctl
// jobmanager --ha etcd processes) on an etcd this test process runs, task
// managers and clients given every job manager's address.
type haCluster struct {
	*procCluster
	etcd    []string
	storage string
	jms     []*haJM
	// jmArgs and jmEnv are added to every job manager's flags and
	// environment.
	jmArgs, jmEnv []string
}

type haJM struct {
	p          *proctest.Proc
	addr, http string
}

func newHACluster(t *testing.T) *haCluster {
	t.Helper()
	e, err := ha.StartEmbedded(t.Context(), t.TempDir(), ha.FastForTests())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	c := &haCluster{etcd: e.Endpoints(), storage: "file://" + t.TempDir()}
	c.procCluster = &procCluster{Cluster: proctest.NewStoppedCluster(t, streamctlBin), t: t, env: nil}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.haLogs())
		}
	})
	return c
}

// startJM starts a job manager of the cluster with env added to its
// environment.
func (c *haCluster) startJM(env ...string) *haJM {
	c.t.Helper()
	cmd := exec.Command(streamctlBin, "jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-format", "json",
		"--ha", "etcd", "--etcd-endpoints", strings.Join(c.etcd, ","), "--ha-cluster-id", "test",
		"--checkpoint-storage", c.storage, "--ha-lease-ttl", "3s")
	cmd.Args = append(cmd.Args, c.jmArgs...)
	cmd.Env = append(append(cmd.Environ(), c.jmEnv...), env...)
	jm := &haJM{p: proctest.Start(c.t, cmd)}
	jm.addr = jm.p.Line(c.t, `^jobmanager listening on (\S+)$`)
	jm.http = jm.p.Line(c.t, `^jobmanager http on (\S+)$`)
	c.jms = append(c.jms, jm)
	addrs := make([]string, len(c.jms))
	for i, j := range c.jms {
		addrs[i] = j.addr
	}
	c.JMAddr = strings.Join(addrs, ",")
	return jm
}

// leads reports whether jm logged that it leads (count times).
func (jm *haJM) leads(count int) bool {
	return strings.Count(jm.p.Stderr.String(), `"leading the cluster"`) >= count
}

// waitLeader waits (60s) until one of the running job managers leads and
// makes it the cluster's job manager for status and logs.
func (c *haCluster) waitLeader(alive ...*haJM) *haJM {
	c.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, jm := range alive {
			if jm.leads(1) {
				c.JM, c.HTTPAddr = jm.p, jm.http
				return jm
			}
		}
	}
	c.t.Fatalf("no job manager leads after 60s; %s", c.haLogs())
	return nil
}

func (c *haCluster) haLogs() string {
	var b strings.Builder
	for i, jm := range c.jms {
		fmt.Fprintf(&b, "job manager %d (%s) stderr:\n%s\n", i, jm.addr, jm.p.Stderr.Tail(30))
	}
	return b.String()
}

// Three job managers on etcd, two task managers, the exactly-once
// wordcount running on each source. The leader crashes right after it
// committed a checkpoint (SIGKILL from the jm.after-checkpoint-persisted
// failpoint, before any notification went out); a standby takes over after
// the lease expires and is SIGKILLed while it resumes the jobs; the last one
// takes over, resumes the jobs from their latest checkpoints in etcd and the
// checkpoint storage, the task managers find it by themselves, and every
// word is counted 1..n, read_committed, by each job.
func TestHAJobManagersFailOverTwiceAndTheWordcountStaysExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c := newHACluster(t)
	c.env = kafkatest.New(t)
	// Both jobs' checkpoints count: the 15th comes after a few of each.
	first := c.startJM("WEIR_FAILPOINTS=jm.after-checkpoint-persisted=crash@15")
	c.waitLeader(first)
	second, third := c.startJM(), c.startJM()
	c.twoTMs()

	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	jobs := wordcountOnEachSource()
	for _, j := range jobs {
		j.id = c.Submit(j.args(c.env.Addr, "lines")...)
	}
	for _, j := range jobs {
		c.waitOutput(ctx, j.output, 300)
	}
	select {
	case <-first.p.Done:
	case <-time.After(90 * time.Second):
		t.Fatalf("the leader did not crash at its 15th persisted checkpoint; %s", c.haLogs())
	}
	crashed := time.Now()
	for _, j := range jobs {
		j.before = len(committed(t, ctx, c.env.Addr, j.output))
	}

	// The next leader is SIGKILLed as soon as it starts resuming a job.
	var next *haJM
	for deadline := time.Now().Add(60 * time.Second); next == nil; time.Sleep(5 * time.Millisecond) {
		for _, jm := range []*haJM{second, third} {
			if strings.Contains(jm.p.Stderr.String(), `"resuming job"`) {
				next = jm
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no standby resumed the job within 60s of the leader's crash; %s", c.haLogs())
		}
	}
	select {
	case <-next.p.Done:
		t.Fatalf("the job manager resuming the job exited by itself (%v); %s", next.p.Cmd.ProcessState, c.haLogs())
	default:
	}
	next.p.Kill(t)
	last := second
	if next == second {
		last = third
	}
	c.JMAddr = strings.Join([]string{second.addr, third.addr, first.addr}, ",") // dead ones too: clients find the leader
	c.waitLeader(last)
	c.WaitTMs("tm-a,tm-b")
	var resumed time.Duration
	for _, j := range jobs {
		c.WaitStatus(j.id, "the job running on the last job manager", func(s proctest.JobStatus) bool { return s.State == "RUNNING" })
		c.waitOutput(ctx, j.output, j.before+1)
		resumed = max(resumed, time.Since(crashed))
	}
	for _, j := range jobs {
		c.waitOutput(ctx, j.output, j.before+300)
	}
	in.halt()
	for _, j := range jobs {
		total := c.verify(ctx, "lines", j.output)
		if j.before >= total {
			t.Fatalf("source=%s: all %d output records were committed before the failover", j.source, total)
		}
		t.Logf("source=%s: %d lines, %d of %d output records committed at the first leader's crash", j.source, in.n, j.before, total)
	}
	t.Logf("output of both jobs resumed %v after the first leader's crash (two failovers, lease 3s)", resumed.Round(100*time.Millisecond))
}

// Two job managers on etcd with the checkpoint storage on the embedded S3
// server, every task's state written there (--state-inline-limit 0), two
// task managers, the exactly-once wordcount: a task manager is SIGKILLed,
// then the leading job manager; the standby takes over, resumes the job
// from the checkpoint whose metadata and state are on S3, rebuilds which
// objects the retained checkpoints reference, and every word is counted
// 1..n, read_committed. Once the job is cancelled, the objects left under
// the job's shared state are exactly those its retained checkpoints (their
// metadata on S3) reference: no orphan.
func TestStateOnS3SurvivesATaskManagerAndALeaderSIGKILLExactlyOnceAndLeavesNoOrphan(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	srv := startS3(t)
	c := newHACluster(t)
	c.env = kafkatest.New(t)
	c.storage = srv.URL("weir", "cp")
	c.jmArgs = []string{"--state-inline-limit", "0", "--checkpoint-orphan-grace", "0s"}
	c.jmEnv = s3Env
	first := c.startJM()
	c.waitLeader(first)
	second := c.startJM()
	c.StartTMWith("tm-a", 2, s3Env)
	c.StartTMWith("tm-b", 2, s3Env)
	c.StartTMWith("tm-c", 2, s3Env)
	c.WaitTMs("tm-a,tm-b,tm-c")

	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	// Kept on cancel (--retain-on-cancel): what is left is then checked against them.
	id := c.Submit(append(wordcountArgs(c.env.Addr, "wc", "lines", "counts"), "--retain-on-cancel")...)
	before := len(c.waitOutput(ctx, "counts", 600))
	c.TMs["tm-a"].Kill(t)
	c.WaitStatus(id, "restart on the task managers left", func(s proctest.JobStatus) bool { return s.Restarts >= 1 && s.State == "RUNNING" })
	atLeader := len(c.waitOutput(ctx, "counts", before+300))
	first.p.Kill(t)
	c.waitLeader(second)
	c.JMAddr = strings.Join([]string{second.addr, first.addr}, ",")
	c.WaitStatus(id, "the job running on the new leader", func(s proctest.JobStatus) bool { return s.State == "RUNNING" })
	c.waitOutput(ctx, "counts", atLeader+300)
	in.halt()
	total := c.verify(ctx, "lines", "counts")
	if atLeader >= total {
		t.Fatalf("all %d output records were committed before the leader's SIGKILL", total)
	}

	if _, err := c.Run("cancel", id); err != nil {
		t.Fatal(err)
	}
	c.WaitStatus(id, "cancelled", func(s proctest.JobStatus) bool { return s.State == "CANCELED" })
	s3, err := storage.Open(ctx, c.storage, storage.Credentials("weir", "weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	var left, metadata []string
	if err := s3.List(ctx, checkpoint.SharedPrefix(id), func(o storage.Object) error { left = append(left, o.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s3.List(ctx, id+"/chk-", func(o storage.Object) error { metadata = append(metadata, o.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	referenced := map[string]bool{}
	for _, key := range metadata {
		var n uint64
		if _, err := fmt.Sscanf(key, id+"/chk-%d/_metadata", &n); err != nil {
			t.Fatalf("metadata object %s: %v", key, err)
		}
		r, err := s3.Open(ctx, key, 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		cp, err := checkpoint.DecodeCompleted(id, checkpoint.ID(n), b)
		if err != nil {
			t.Fatalf("metadata %s: %v", key, err)
		}
		for _, ref := range cp.Refs() {
			referenced[ref.Key] = true
		}
	}
	refs := slices.Sorted(maps.Keys(referenced))
	if len(metadata) == 0 || len(left) == 0 || !slices.Equal(left, refs) {
		t.Fatalf("retained checkpoints' metadata %v; objects under the job's shared state:\n%v\nreferenced by the retained checkpoints:\n%v",
			metadata, left, refs)
	}
	t.Logf("%d lines; %d of %d output records committed at the task manager's SIGKILL, %d at the leader's; %d checkpoints retained, %d state objects",
		in.n, before, total, atLeader, len(metadata), len(left))
}
