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

