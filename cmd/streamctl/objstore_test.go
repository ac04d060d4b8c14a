package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/proctest"
	"github.com/weirstream/weir/internal/s3server"
)

// s3Env is the environment that gives the AWS client the embedded S3
// server's (any) credentials, the standard AWS way.
var s3Env = []string{"AWS_ACCESS_KEY_ID=weir", "AWS_SECRET_ACCESS_KEY=weir", "AWS_REGION=us-east-1"}

// startS3 starts the embedded S3 server with bucket "weir" for the test.
func startS3(t *testing.T) *s3server.Server {
	t.Helper()
	srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// newS3ProcCluster is newProcCluster with its job manager started again
// with jmArgs, and task managers tm-a and tm-b (two slots each), every
// process given the S3 credentials (s3Env).
func newS3ProcCluster(t *testing.T, jmArgs ...string) *procCluster {
	t.Helper()
	c := newProcCluster(t, streamctlBin)
	c.JM.Stop(t)
	c.JMArgs = jmArgs
	c.StartJMEnv(s3Env)
	c.StartTMWith("tm-a", 2, s3Env)
	c.StartTMWith("tm-b", 2, s3Env)
	c.WaitTMs("tm-a,tm-b")
	return c
}

// The wordcount on a job manager and two task manager processes with
// checkpoint storage on the embedded S3 server, every task's state written
// there (--state-inline-limit 0): a task manager is SIGKILLed, the job
// restores from the references on the task manager left, every word is
// counted 1..n read_committed, and once the job is cancelled no object is
// left that no retained checkpoint references.
func TestWordcountWithStateOnS3IsExactlyOnceAcrossATaskManagerSIGKILLAndLeavesNoOrphan(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	srv := startS3(t)
	u := srv.URL("weir", "cp")
	c := newS3ProcCluster(t, "--checkpoint-storage", u, "--state-inline-limit", "0", "--checkpoint-orphan-grace", "0s")
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	// Kept on cancel (--retain-on-cancel): what is left is then checked against them.
	id := c.Submit(append(wordcountArgs(c.env.Addr, "wc", "lines", "counts"), "--retain-on-cancel")...)
	before := len(c.waitOutput(ctx, "counts", 600))
	c.TMs["tm-a"].Kill(t)
	st := c.WaitStatus(id, "restart on the task manager left", func(s proctest.JobStatus) bool { return s.Restarts >= 1 && s.State == "RUNNING" })
	c.waitOutput(ctx, "counts", before+300)
	in.halt()
	total := c.verify(ctx, "lines", "counts")
	if before >= total {
		t.Fatalf("all %d output records were committed before the kill", total)
	}
	if st.LastCompletedCheckpoint == 0 {
		t.Fatalf("status after the restart: %+v, want a completed checkpoint", st)
	}
	if _, err := c.Run("cancel", id); err != nil {
		t.Fatal(err)
	}
	c.WaitStatus(id, "cancelled", func(s proctest.JobStatus) bool { return s.State == "CANCELED" })
	// The job ended: its final sweep ran (grace 0). Stop the job manager
	// and read what its checkpoint store retains.
	s3, err := storage.Open(ctx, u, storage.Credentials("weir", "weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	var left []string
	if err := s3.List(ctx, checkpoint.SharedPrefix(id), func(o storage.Object) error { left = append(left, o.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	c.JM.Stop(t)
	if refs := retainedRefs(t, filepath.Join(c.DataDir, "checkpoints"), id); !slices.Equal(left, refs) {
		t.Fatalf("objects in checkpoint storage:\n%v\nreferenced by retained checkpoints:\n%v", left, refs)
	}
	if len(left) == 0 {
		t.Fatal("no object in checkpoint storage: the state stayed inline")
	}
	c.TMs["tm-b"].Stop(t)
	t.Logf("%d lines, %d of %d output records committed at the SIGKILL, %d restarts, %d objects retained", in.n, before, total, st.Restarts, len(left))
}

// retainedRefs are the objects the checkpoints of job retained in the
// checkpoint store at dir reference, sorted.
func retainedRefs(t *testing.T, dir, job string) []string {
	t.Helper()
	store, err := checkpoint.OpenStore(dir, checkpoint.ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sums, err := store.List(t.Context(), job)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range sums {
		c, err := store.Get(t.Context(), job, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range c.Refs() {
			seen[r.Key] = true
		}
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Savepoints on object storage: a job manager whose --savepoint-dir is an
// S3 URL stops the wordcount with a savepoint there; "savepoint inspect"
// reads it from S3; a fresh cluster (another job manager data directory,
// no checkpoint storage: it reads the savepoint with the standard AWS
// credentials) resumes the job from the URL at parallelism 3, and every
// word is counted 1..n once, read_committed, across both jobs.
func TestWordcountStoppedWithASavepointOnS3ResumesOnAFreshClusterAtAnotherParallelism(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	srv := startS3(t)
	spBase := srv.URL("weir", "savepoints")
	c := newS3ProcCluster(t, "--checkpoint-storage", srv.URL("weir", "cp"), "--state-inline-limit", "0", "--savepoint-dir", spBase)
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	args := wordcountArgs(c.env.Addr, "wc", "lines", "counts")
	id := c.Submit(args...)
	n1 := len(c.waitOutput(ctx, "counts", 600))
	out, err := c.Run("stop", id)
	if err != nil {
		t.Fatalf("stop %s: %v; %s", id, err, c.Logs(60))
	}
	sp := strings.TrimSpace(out)
	if want := strings.Split(spBase, "?")[0] + "/savepoint-"; !strings.HasPrefix(sp, want) {
		t.Fatalf("stop printed %q, want a savepoint URL under %s", out, want)
	}
	if st := c.Status(id); st.State != "FINISHED" {
		t.Fatalf("job %s after stop: %+v, want FINISHED", id, st)
	}
	inspect := exec.CommandContext(ctx, streamctlBin, "savepoint", "inspect", sp)
	inspect.Env = append(os.Environ(), s3Env...)
	if b, err := inspect.CombinedOutput(); err != nil || !strings.Contains(string(b), "count") {
		t.Fatalf("savepoint inspect %s: %v\n%s", sp, err, b)
	}
	for _, p := range []*proctest.Proc{c.TMs["tm-a"], c.TMs["tm-b"], c.JM} {
		p.Stop(t)
	}

	fresh := &procCluster{Cluster: proctest.NewCluster(t, streamctlBin), t: t, env: c.env}
	fresh.JM.Stop(t)
	// The fresh job manager allows the savepoints' place, its endpoint
	// with it.
	fresh.JMArgs = []string{"--savepoint-allowed-locations", spBase}
	fresh.StartJMEnv(s3Env)
	fresh.twoTMs()
	fresh.Submit(append(args, "--parallelism", "3", "--from-savepoint", sp)...)
	fresh.waitOutput(ctx, "counts", n1+600)
	in.halt()
	total := fresh.verify(ctx, "lines", "counts")
	t.Logf("%d lines, %d output records, %d of them before the stop; savepoint %s", in.n, total, n1, sp)
}
