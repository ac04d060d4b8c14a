package runtime

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/weirstream/weir/checkpoint"
)

// A checkpoint persist whose outcome is unknown (the store's write-ahead
// log failed to sync) fails the job over; the restart reopens the store and
// restores from what it holds, and the output stays exactly-once.
func TestUnknownPersistOutcomeReopensTheStoreAndRestores(t *testing.T) {
	const keys, n = 10, 300
	var armed, fired atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			if armed.Load() && strings.HasSuffix(op.Path, ".log") && fired.CompareAndSwap(false, true) {
				return errorfs.ErrInjected
			}
		}
		return nil
	})
	store, err := checkpoint.OpenStore("db", checkpoint.WithFS(errorfs.Wrap(vfs.NewMem(), inj)))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	viol, txns := &violations{}, newMemTxns()
	var completed atomic.Int64
	src := seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 1, pollDelay: time.Millisecond})
	res, err := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond), Restarts(3, time.Millisecond),
		OnCheckpointComplete(func(CheckpointEvent) {
			if completed.Add(1) == 3 {
				armed.Store(true)
			}
		})).Run(t.Context(), seqJob(src, viol, txns, nil, 1, 2))
	if err != nil {
		t.Fatalf("job failed: %v", err)
	}
	if !fired.Load() || res.Restarts == 0 {
		t.Fatalf("injected %v, %d restarts: the store never failed", fired.Load(), res.Restarts)
	}
	if v := viol.get(); len(v) > 0 {
		t.Fatalf("keyed state: %s", v[0])
	}
	checkSequences(t, txns.output(), keys, n)
}
