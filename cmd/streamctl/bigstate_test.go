package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/proctest"
)

// produceDistinct produces lines lines of five words each, word j of line
// i being "d<i>w<j>": from first on, each line brings five words never seen
// before.
func (in *input) produceDistinct(ctx context.Context, first, lines int) {
	in.t.Helper()
	const batch = 5000
	for start := first; start < first+lines; start += batch {
		recs := make([]*kgo.Record, 0, batch)
		for i := start; i < min(start+batch, first+lines); i++ {
			recs = append(recs, kgo.StringRecord(fmt.Sprintf("d%dw0 d%dw1 d%dw2 d%dw3 d%dw4", i, i, i, i, i)))
		}
		if err := in.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			in.t.Fatalf("produce input: %v", err)
		}
		in.n += len(recs)
	}
}

// The exactly-once wordcount with a million distinct words on two task
// manager processes: each task's snapshot (about 9 MB) is above gRPC's
// 4 MiB message limit, so before chunking no checkpoint past the first
// few MB completed and the job restarted forever. Here a checkpoint of
// 800k+ words completes, a task manager is SIGKILLed, the job restores
// that state on the other one, the same words come again, and every word
// is counted 1..n, read_committed.
func TestWordcountWithAMillionDistinctWordsSurvivesATaskManagerSIGKILL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin)
	c.twoTMs()
	const lines = 200_000
	in := newInput(t, ctx, c.env.Addr, "lines", 0)
	in.produceDistinct(ctx, 0, lines)
	id := c.Submit(wordcountArgs(c.env.Addr, "wc", "lines", "counts")...)
	before := len(c.waitOutput(ctx, "counts", 800_000))
	c.TMs["tm-a"].Kill(t)
	st := c.WaitStatus(id, "restart on the task manager left", func(s proctest.JobStatus) bool { return s.Restarts >= 1 && s.State == "RUNNING" })
	// Every word again: a count restored wrongly shows as a repeat or a gap.
	in.produceDistinct(ctx, 0, lines)
	total := c.verify(ctx, "lines", "counts")
	if total != 2*5*lines {
		t.Fatalf("verified %d output records, want %d", total, 2*5*lines)
	}
	t.Logf("%d lines, %d of %d output records committed at the SIGKILL, restored checkpoint %d, %d restarts",
		in.n, before, total, st.LastCompletedCheckpoint, st.Restarts)
}
