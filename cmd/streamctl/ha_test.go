package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

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
	cmd.Env = append(cmd.Environ(), env...)
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
// wordcount running. The leader crashes right after it committed a
// checkpoint (SIGKILL from the jm.after-checkpoint-persisted failpoint,
// before any notification went out); a standby takes over after the lease
// expires and is SIGKILLed while it resumes the job; the last one takes
// over, resumes the job from its latest checkpoint in etcd and the
// checkpoint storage, the task managers find it by themselves, and every
// word is counted 1..n, read_committed.
func TestHAJobManagersFailOverTwiceAndTheWordcountStaysExactlyOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c := newHACluster(t)
	c.env = kafkatest.New(t)
	first := c.startJM("WEIR_FAILPOINTS=jm.after-checkpoint-persisted=crash@15")
	c.waitLeader(first)
	second, third := c.startJM(), c.startJM()
	c.twoTMs()

	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	id := c.Submit(wordcountArgs(c.env.Addr, "wc", "lines", "counts")...)
	c.waitOutput(ctx, "counts", 300)
	select {
	case <-first.p.Done:
	case <-time.After(90 * time.Second):
		t.Fatalf("the leader did not crash at its 15th persisted checkpoint; %s", c.haLogs())
	}
	crashed := time.Now()
	before := len(committed(t, ctx, c.env.Addr, "counts"))

	// The next leader is SIGKILLed as soon as it starts resuming the job.
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
	c.WaitStatus(id, "the job running on the last job manager", func(s proctest.JobStatus) bool { return s.State == "RUNNING" })
	c.waitOutput(ctx, "counts", before+1)
	resumed := time.Since(crashed)
	c.waitOutput(ctx, "counts", before+300)
	in.halt()
	total := c.verify(ctx, "lines", "counts")
	if before >= total {
		t.Fatalf("all %d output records were committed before the failover", total)
	}
	t.Logf("%d lines, %d of %d output records committed at the first leader's crash; output resumed %v after it (two failovers, lease 3s)",
		in.n, before, total, resumed.Round(100*time.Millisecond))
}
