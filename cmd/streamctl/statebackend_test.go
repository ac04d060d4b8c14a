package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/proctest"
)

// The exactly-once wordcount on each state backend, as processes: a task
// manager SIGKILLed while the job runs (it restarts from its latest
// checkpoint on the task managers left), then a rescale 2 -> 3 -> 2 through
// savepoints, the last job on the other backend (savepoints are
// backend-independent): every word is counted 1..n once, read_committed,
// and status shows the backend.
func TestWordcountOnEachStateBackendSurvivesATaskManagerSIGKILLAndARescale(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ backend, other string }{{"pebble", "heap"}, {"heap", "pebble"}} {
		t.Run(tc.backend, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			c := newProcCluster(t, streamctlBin)
			startTM := func(id string) {
				c.StartTMWith(id, 2, nil, "--data-dir", filepath.Join(c.DataDir, id), "--state-memory", "64MiB")
			}
			startTM("tm-a")
			startTM("tm-b")
			c.WaitTMs("tm-a,tm-b")
			spDir := filepath.Join(c.DataDir, "savepoints")
			in := newInput(t, ctx, c.env.Addr, "lines", 300)
			in.run(ctx)
			args := wordcountArgs(c.env.Addr, "wc", "lines", "counts")

			id1 := c.Submit(append(args, "--state-backend", tc.backend)...)
			if st := c.Status(id1); st.StateBackend != tc.backend {
				t.Fatalf("status %+v: want state backend %s", st, tc.backend)
			}
			n0 := len(c.waitOutput(ctx, "counts", 600))
			// The keyed operator's pebble instances live under the task
			// managers' --data-dir/state; on the heap there are none.
			insts, err := filepath.Glob(filepath.Join(c.DataDir, "tm-*", "state", "*"))
			if err != nil {
				t.Fatal(err)
			}
			if (len(insts) > 0) != (tc.backend == "pebble") {
				t.Fatalf("pebble instances under the task managers' data dirs: %v, want some only on pebble", insts)
			}
			c.TMs["tm-a"].Kill(t)
			c.WaitStatus(id1, "restart on the task manager left", func(s proctest.JobStatus) bool { return s.Restarts >= 1 && s.State == "RUNNING" })
			startTM("tm-c")
			n1 := len(c.waitOutput(ctx, "counts", n0+300))
			sp1 := c.stopWithSavepoint(id1, spDir)

			id2 := c.Submit(append(args, "--state-backend", tc.backend, "--parallelism", "3", "--from-savepoint", sp1)...)
			n2 := len(c.waitOutput(ctx, "counts", n1+600))
			sp2 := c.stopWithSavepoint(id2, spDir)

			id3 := c.Submit(append(args, "--state-backend", tc.other, "--parallelism", "2", "--from-savepoint", sp2)...)
			c.waitOutput(ctx, "counts", n2+600)
			in.halt()
			total := c.verify(ctx, "lines", "counts")
			if st := c.Status(id3); st.State != "RUNNING" || st.StateBackend != tc.other {
				t.Fatalf("job %s: %+v, want RUNNING on %s", id3, st, tc.other)
			}
			t.Logf("%d lines, %d output records: %d before the SIGKILL, %d by the first job, %d by the second (parallelism 3), the rest by the third (%s)",
				in.n, total, n0, n1, n2-n1, tc.other)
		})
	}
}
