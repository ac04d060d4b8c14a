package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// runUntilCheckpoints runs job on store until n checkpoints completed, then
// cancels it, and returns the id of the last one.
func runUntilCheckpoints(t *testing.T, store *checkpoint.Store, job *Job, n int) checkpoint.ID {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var completed int
	var last checkpoint.ID
	mc := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond),
		OnCheckpointComplete(func(e CheckpointEvent) {
			last = e.ID
			if completed++; completed == n {
				cancel()
			}
		}))
	if _, err := mc.Run(ctx, job); !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v, want it stopped after %d checkpoints", err, n)
	}
	return last
}

func openStore(t *testing.T) *checkpoint.Store {
	t.Helper()
	store, err := checkpoint.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// Keyed state is split into max-parallelism key groups; restoring it into
// another number of key groups would put keys into the wrong group (their
// state silently reset) or index past the end. The restore is refused with
// a clear error, and the job emits nothing.
func TestRestoreRefusesAnotherMaxParallelism(t *testing.T) {
	const keys, n = 20, 200
	for _, tc := range []struct{ from, to int }{{128, 256}, {256, 128}} {
		t.Run(fmt.Sprintf("%d->%d", tc.from, tc.to), func(t *testing.T) {
			store := openStore(t)
			viol, txns := &violations{}, newMemTxns()
			newSink := func() Sink[seqRec] { return &txnSink{txns: txns} }
			src := seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 1, stallAt: n / 2})
			runUntilCheckpoints(t, store, seqJobTo(src, viol, newSink, 1, 2, MaxParallelism(tc.from)), 5)
			before := len(txns.output())

			src = seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 3})
			res, err := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond)).
				Run(t.Context(), seqJobTo(src, viol, newSink, 1, 2, MaxParallelism(tc.to)))
			if err == nil {
				t.Fatalf("restore at max parallelism %d from a checkpoint taken at %d succeeded (%d violations: %v)",
					tc.to, tc.from, len(viol.get()), first(viol.get()))
			}
			if !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), "max parallelism") ||
				!strings.Contains(err.Error(), "checker") {
				t.Fatalf("err = %v; want ErrIncompatibleState naming the operator and the max parallelism", err)
			}
			if res.Restarts != 0 {
				t.Fatalf("%d restarts for a configuration error", res.Restarts)
			}
			if after := len(txns.output()); after != before {
				t.Fatalf("the refused job committed %d records", after-before)
			}
			if v := viol.get(); len(v) > 0 {
				t.Fatalf("keyed state violated: %s", v[0])
			}
		})
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// crashAfterPersisting runs job until the coordinator "dies" right after
// persisting the first checkpoint that holds a transaction, so that
// checkpoint's transactions are pre-committed and never notified, and
// returns that checkpoint. (A fixed count of checkpoints was not enough:
// on a loaded machine the source's records could all be committed by the
// third, which then held none.)
func crashAfterPersisting(t *testing.T, store *checkpoint.Store, job *Job) checkpoint.Completed {
	t.Helper()
	fp := &hookFailpoints{fn: func(name string) error {
		if name == "jm.after-checkpoint-persisted" {
			if c, err := store.Latest(t.Context(), job.Name()); err == nil && len(c.Handles()) > 0 {
				return errors.New("coordinator crash")
			}
		}
		return nil
	}}
	_, err := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond), Failpoints(fp), Restarts(0, 0)).
		Run(t.Context(), job)
	if !errors.Is(err, ErrJobFailed) {
		t.Fatalf("first run: %v, want the injected coordinator crash", err)
	}
	c, err := store.Latest(t.Context(), job.Name())
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Handles()) == 0 {
		t.Fatal("the latest checkpoint holds no transaction: nothing to test")
	}
	return c
}

// A checkpoint holding state of an operator the job no longer has (here a
// sink whose UID changed) is refused, naming the UID. With
// AllowNonRestoredState the job runs, and the dropped operator's
// pre-committed transactions are committed all the same: nothing is lost.
func TestRestoreWithStateOfARemovedOperator(t *testing.T) {
	const keys, n = 10, 100
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow non-restored state %v", allow), func(t *testing.T) {
			store := openStore(t)
			viol, txns := &violations{}, newMemTxns()
			src := seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 1, stallAt: n / 2, pollDelay: time.Millisecond})
			c := crashAfterPersisting(t, store, seqJob(src, viol, txns, nil, 1, 2))
			before := len(txns.output())

			// The same job, its sink renamed.
			j := NewJob("seq", DefaultParallelism(2))
			recs := FromSource(j, "source", seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 3}), Parallelism(1))
			checked := Process(KeyBy(recs, func(r seqRec) string { return r.Key }, nil), "checker",
				func() KeyedProcessFunction[string, seqRec, seqRec] { return &seqChecker{violations: viol} })
			SinkTo(checked, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} }, UID("sink-v2"))
			opts := []ClusterOpt{CheckpointStore(store), CheckpointInterval(5 * time.Millisecond)}
			if allow {
				opts = append(opts, AllowNonRestoredState())
			}
			res, err := NewMiniCluster(opts...).Run(t.Context(), j)
			if !allow {
				if err == nil {
					var lost []string
					for _, h := range c.Handles() {
						if !txns.done[h.TransactionalID] {
							lost = append(lost, h.TransactionalID)
						}
					}
					t.Fatalf("restore without the state of uid sink succeeded; its transactions %v were never committed", lost)
				}
				if !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), `"sink"`) && !strings.Contains(err.Error(), "uids sink") {
					t.Fatalf("err = %v; want ErrIncompatibleState naming uid sink", err)
				}
				if res.Restarts != 0 || len(txns.output()) != before {
					t.Fatalf("refused restore: %d restarts, %d records committed", res.Restarts, len(txns.output())-before)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range c.Handles() {
				if !txns.done[h.TransactionalID] {
					t.Fatalf("transaction %s of the dropped sink (checkpoint %d) was not committed", h.TransactionalID, c.ID)
				}
			}
			if v := viol.get(); len(v) > 0 {
				t.Fatalf("keyed state: %s", v[0])
			}
			checkSequences(t, txns.output(), keys, n)
		})
	}
}

// An operator added to a job restored from a checkpoint that does not hold
// its UID starts fresh (RestoredFrom 0, as in Flink: no restored state), not
// "restored empty": the added source emits every one of its items, once.
// The operators the checkpoint holds still restore: the seq source resumes
// where it was, so the keyed checker and the sink see every sequence once.
func TestRestoreStartsAnAddedOperatorFresh(t *testing.T) {
	const keys, n, added = 10, 100, 50
	store := openStore(t)
	viol, txns := &violations{}, newMemTxns()
	stalled := seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 1, stallAt: n / 2})
	runUntilCheckpoints(t, store, seqJob(stalled, viol, txns, nil, 1, 2), 3)
	if before := len(txns.output()); before == 0 || before == keys*n {
		t.Fatalf("first run committed %d of %d records: want a run stopped mid-input", before, keys*n)
	}

	// The same job, plus a source and a sink the checkpoint knows nothing of.
	j := seqJob(seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 3}), viol, txns, nil, 1, 2)
	items := make([]seqRec, added)
	for i := range items {
		items[i] = seqRec{Key: "added", Seq: int64(i + 1)}
	}
	addedTxns := newMemTxns()
	SinkTo(FromSource(j, "added-source", SliceSource(items, 7), Parallelism(2), UID("added-source")), "added-sink",
		func() Sink[seqRec] { return &txnSink{txns: addedTxns} }, Parallelism(1), UID("added-sink"))
	var from []checkpoint.ID
	res, err := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond),
		OnRestore(func(_ int, id checkpoint.ID) { from = append(from, id) })).Run(t.Context(), j)
	if err != nil {
		t.Fatal(err)
	}
	if len(from) == 0 || from[0] == 0 {
		t.Fatalf("second run restored from %v, want the first run's checkpoint", from)
	}
	if v := viol.get(); len(v) > 0 {
		t.Fatalf("keyed state of the restored checker: %d violations, first: %s", len(v), v[0])
	}
	checkSequences(t, txns.output(), keys, n)
	// The slice source's subtasks emit interleaved progressions: check the
	// set, each item once.
	got := map[int64]int{}
	for _, r := range addedTxns.output() {
		got[r.Seq]++
	}
	var wrong []string
	for seq := int64(1); seq <= added; seq++ {
		if got[seq] != 1 {
			wrong = append(wrong, fmt.Sprintf("%d x%d", seq, got[seq]))
		}
	}
	if len(wrong) > 0 || len(addedTxns.output()) != added {
		t.Fatalf("added source: %d records committed, want %d, each once (restarts %d); items not committed exactly once: %v",
			len(addedTxns.output()), added, res.Restarts, wrong)
	}
}
