package main

import (
	"context"
	"path/filepath"
	"slices"
	"sort"
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

// The wordcount on a job manager and two task manager processes with
// checkpoint storage on the embedded S3 server, every task's state written
// there (--state-inline-limit 0): a task manager is SIGKILLed, the job
// restores from the references on the task manager left, every word is
// counted 1..n read_committed, and once the job is cancelled no object is
// left that no retained checkpoint references.
func TestWordcountWithStateOnS3IsExactlyOnceAcrossATaskManagerSIGKILLAndLeavesNoOrphan(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	srv, err := s3server.Start(ctx, s3server.Buckets("weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	u := srv.URL("weir", "cp")
	env := newProcCluster(t, streamctlBin)
	// newProcCluster started a job manager without storage: start the
	// cluster's own with it.
	env.JM.Stop(t)
	env.JMArgs = []string{"--checkpoint-storage", u, "--state-inline-limit", "0", "--checkpoint-orphan-grace", "0s"}
	env.StartJMEnv(s3Env)
	c := env
	c.StartTMWith("tm-a", 2, s3Env)
	c.StartTMWith("tm-b", 2, s3Env)
	c.WaitTMs("tm-a,tm-b")
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	id := c.Submit(wordcountArgs(c.env.Addr, "wc", "lines", "counts")...)
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
