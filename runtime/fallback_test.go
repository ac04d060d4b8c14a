package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/weirstream/weir/checkpoint"
)

// When the newest completed checkpoint is corrupt, the job restores the one
// before it, and still commits the newer checkpoint's transactions (it had
// completed: its output may be visible), never loses them.
func TestRestorePastACorruptCheckpointCommitsItsTransactions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		par        int
		delayOpen0 time.Duration
	}{
		{"parallelism 1", 1, 0},
		// Subtask 1 opens (and aborts its lingering transactions) while
		// subtask 0 is still slow to open.
		{"parallelism 2, subtask 0 opens late", 2, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) { testRestorePastACorruptCheckpoint(t, tc.par, tc.delayOpen0) })
	}
}

func testRestorePastACorruptCheckpoint(t *testing.T, par int, delayOpen0 time.Duration) {
	const keys, n = 10, 200
	dir := t.TempDir()
	viol := &violations{}
	txns := newMemTxns()

	// Run 1: the coordinator dies right after persisting the checkpoint in
	// which the sink pre-committed its second transaction, so that one is
	// pre-committed and never notified, and an older checkpoint exists.
	store, err := checkpoint.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	var precommits atomic.Int64
	var crashed atomic.Bool
	fp := &hookFailpoints{fn: func(name string) error {
		switch name {
		case "sink.after-precommit":
			precommits.Add(1)
		case "jm.after-checkpoint-persisted":
			if precommits.Load() >= int64(2*par) && crashed.CompareAndSwap(false, true) {
				return errors.New("coordinator crash")
			}
		}
		return nil
	}}
	src := seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 1, stallAt: n / 2, pollDelay: time.Millisecond})
	newSink := func() Sink[seqRec] { return &txnSink{txns: txns, fp: fp.Inject, delayOpen0: delayOpen0} }
	_, err = NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond), Failpoints(fp), Restarts(0, 0)).
		Run(context.Background(), seqJobTo(src, viol, newSink, 1, par))
	if !errors.Is(err, ErrJobFailed) {
		t.Fatalf("first run: %v, want the injected coordinator crash", err)
	}
	newest, err := store.Latest(context.Background(), "seq")
	if err != nil {
		t.Fatal(err)
	}
	pending := newest.Handles()
	if len(pending) == 0 {
		t.Fatal("the newest checkpoint holds no transaction: nothing to test")
	}
	for _, h := range pending {
		if txns.done[h.TransactionalID] {
			t.Fatalf("%s committed before any notification", h.TransactionalID)
		}
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	corruptMeta(t, dir, "seq", newest.ID)

	// Run 2 from the same directory.
	store, err = checkpoint.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var restoredFrom checkpoint.ID
	src = func() Source[seqRec] {
		return &restoreSpy{Source: seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 3})(), from: &restoredFrom}
	}
	newSink = func() Sink[seqRec] { return &txnSink{txns: txns, delayOpen0: delayOpen0} }
	if _, err := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond)).
		Run(context.Background(), seqJobTo(src, viol, newSink, 1, par)); err != nil {
		t.Fatal(err)
	}
	if restoredFrom == 0 || restoredFrom >= newest.ID {
		t.Fatalf("restored from checkpoint %d, want one before the corrupt %d", restoredFrom, newest.ID)
	}
	for _, h := range pending {
		if !txns.done[h.TransactionalID] {
			t.Fatalf("transaction %s of the corrupt checkpoint %d was not committed", h.TransactionalID, newest.ID)
		}
	}
	if v := viol.get(); len(v) > 0 {
		t.Fatalf("keyed state inconsistent after the fallback: %s", v[0])
	}
	// Output: nothing lost; records of the corrupt checkpoint's epoch may
	// appear twice (the documented at-least-once window).
	seen := map[string]map[int64]bool{}
	for _, r := range txns.output() {
		if seen[r.Key] == nil {
			seen[r.Key] = map[int64]bool{}
		}
		seen[r.Key][r.Seq] = true
	}
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("k%03d", k)
		for s := int64(1); s <= n; s++ {
			if !seen[key][s] {
				t.Fatalf("key %s: record %d lost", key, s)
			}
		}
	}
}

// corruptMeta flips a byte in the stored state record of checkpoint id (key
// layout documented in checkpoint/store.go: "cp/<job>\x00<id>m").
func corruptMeta(t *testing.T, dir, job string, id checkpoint.ID) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := binary.BigEndian.AppendUint64(append([]byte("cp/"+job), 0), uint64(id))
	key = append(key, 'm')
	v, closer, err := db.Get(key)
	if err != nil {
		t.Fatalf("checkpoint %d state record: %v", id, err)
	}
	bad := append([]byte(nil), v...)
	closer.Close()
	bad[len(bad)/2] ^= 0xff
	if err := db.Set(key, bad, pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

type hookFailpoints struct{ fn func(string) error }

func (h *hookFailpoints) Inject(name string) error { return h.fn(name) }

// restoreSpy records the checkpoint a source was restored from.
type restoreSpy struct {
	Source[seqRec]
	from *checkpoint.ID
}

func (r *restoreSpy) Open(ctx context.Context, oc *OperatorContext) error {
	*r.from = oc.RestoredFrom
	return r.Source.Open(ctx, oc)
}
