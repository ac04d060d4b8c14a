package runtime

import (
	"encoding/binary"
	"fmt"
	"testing"
)

// A write-back of more than half a memtable is committed in chunks of at
// most an eighth of a memtable, as pebble counts entries (a skiplist node
// each, several times a small entry's bytes): pebble turns a commit of
// half a memtable or more into a flushable batch of its own, a memtable
// rotation and an L0 file per write-back. Every entry is written.
func TestAWriteBackOfHalfAMemtableIsCommittedInChunks(t *testing.T) {
	mem := testStateMemory(t)
	p, err := mem.openInstance("op", 8)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if p.chunk*8 > mem.memTableSize(1) || p.chunk == 0 {
		t.Fatalf("chunks of %d bytes beside %d-byte memtables; want an eighth of a memtable or less", p.chunk, mem.memTableSize(1))
	}
	// Entries as small as q5's counts: 0.7 of a memtable in all.
	const keyLen, valueLen = 20, 8
	n := int(mem.memTableSize(1) * 7 / 10 / (keyLen + valueLen + memTableEntryOverhead))
	key := func(i int) []byte { return fmt.Appendf(nil, "k%019d", i) }
	commits := 0
	p.writeNow("test", func(b *stateBatch) error {
		for i := range n {
			before := b.b.Count()
			if err := b.Set(key(i), binary.BigEndian.AppendUint64(nil, uint64(i))); err != nil {
				return err
			}
			if b.b.Count() <= before {
				commits++
			}
			if b.size() >= p.chunk {
				t.Fatalf("the batch holds %d bytes after entry %d, over its chunk of %d", b.size(), i, p.chunk)
			}
		}
		return nil
	})
	if commits < 5 {
		t.Fatalf("%d entries (0.7 of a %d-byte memtable) committed in %d chunks; want 5 or more", n, mem.memTableSize(1), commits+1)
	}
	for i := range n {
		v, closer, err := p.db.Get(key(i))
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if got := binary.BigEndian.Uint64(v); got != uint64(i) {
			t.Fatalf("entry %d = %d", i, got)
		}
		_ = closer.Close()
	}
}
