package runtime

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// memTableEntryOverhead is what pebble charges a memtable per entry beyond
// its key and value: an arena skiplist node at its largest height, the
// key's 8-byte trailer and alignment (pebble v2's memTableEntrySize). A
// batch's Len counts a few bytes per entry instead, so for small entries
// (q5's counts: about 35 bytes each) pebble's size of a batch is several
// times its Len.
const memTableEntryOverhead = 200

// stateBatch is the batch the pebble backend's large writes go through:
// write-backs, evictions, restores of a key group (a TTL sweep's batch,
// bounded by the entries a sweep checks, commits on its own). It commits
// what it holds once pebble's size of it (Len plus
// memTableEntryOverhead per entry) reaches chunk, so that no commit
// reaches pebble's large-batch threshold (half a memtable), at or above
// which pebble turns a batch into a flushable batch of its own: a
// memtable rotation and an L0 file per commit
// (docs/guide/state-backends.md).
//
// A write-back committed in chunks is not atomic, and need not be: only
// the task goroutine writes or reads the instance outside snapshots, and a
// snapshot is taken after the write-back returns. After a failure the
// instance is rebuilt from a checkpoint.
type stateBatch struct {
	b     *pebble.Batch
	chunk uint64
}

// newBatch returns an empty stateBatch of the instance; commit it (commit)
// and release it (close).
func (p *pebbleState) newBatch() *stateBatch {
	return &stateBatch{b: p.db.NewBatch(), chunk: p.chunk}
}

// Set adds key = value to the batch, committing the batch first if it
// reached its chunk. The batch copies key and value.
func (w *stateBatch) Set(key, value []byte) error {
	if err := w.b.Set(key, value, nil); err != nil {
		return err
	}
	return w.commitFull()
}

// Delete adds a deletion of key to the batch, as Set.
func (w *stateBatch) Delete(key []byte) error {
	if err := w.b.Delete(key, nil); err != nil {
		return err
	}
	return w.commitFull()
}

// size is pebble's size of the batch in a memtable, over-estimated.
func (w *stateBatch) size() uint64 {
	return uint64(w.b.Len()) + uint64(w.b.Count())*memTableEntryOverhead
}

func (w *stateBatch) commitFull() error {
	if w.size() < w.chunk {
		return nil
	}
	return w.commit()
}

// commit commits what the batch holds, leaving it empty and usable.
func (w *stateBatch) commit() error {
	if w.b.Empty() {
		return nil
	}
	if err := w.b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("commit state batch: %w", err)
	}
	w.b.Reset()
	return nil
}

// close releases the batch, dropping what was not committed.
func (w *stateBatch) close() { _ = w.b.Close() }
