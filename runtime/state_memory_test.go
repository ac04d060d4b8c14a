package runtime

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"io"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// heapLive is the heap's live bytes after a full collection.
func heapLive() int64 {
	var ms goruntime.MemStats
	goruntime.GC()
	goruntime.GC()
	goruntime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// A timer of an int64 key takes its typed key and timestamp twice (the set
// and the heap) and little else: at most 72 bytes of heap at 200k timers
// (53 measured), where a timer whose key was encoded into a string owner
// took 95.
func TestTimersHoldNoEncodedOwnerPerTimer(t *testing.T) {
	const n = 200_000
	b := newKeyedBackend[int64](Int64Codec(), 128)
	before := heapLive()
	tm, err := NewTimers[struct{}](&StateRegistry[int64]{b: b}, "t", voidCodec{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(n) {
		b.scope.setKey(i, int(i%128))
		tm.RegisterEventTimeTimer(struct{}{}, i)
	}
	per := float64(heapLive()-before) / n
	goruntime.KeepAlive(tm)
	if tm.Len(EventTime) != n {
		t.Fatalf("%d timers, want %d", tm.Len(EventTime), n)
	}
	t.Logf("%.1f bytes of heap per timer", per)
	if per > 72 {
		t.Errorf("%.1f bytes of heap per timer, want at most 72", per)
	}
}

// A keyed snapshot's encoding allocates at most twice the bytes it returns
// (1.5 times measured; 7.7 before, with a value, a map and a timer per key),
// each
// key group's blob at its exact size: not each state's blobs and then
// their concatenation, nor the spare capacity of grown buffers (which the
// checkpoint then held until it was written: 23% of Nexmark q5's heap).
func TestKeyedSnapshotAllocatesAboutItsEncodedSize(t *testing.T) {
	const n = 100_000
	b := newKeyedBackend[int64](Int64Codec(), 128)
	r := &StateRegistry[int64]{b: b}
	v, err := NewValueState[int64](r, "v", Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMapState[int64, int64](r, "m", Int64Codec(), Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	tm, err := NewTimers[struct{}](r, "t", voidCodec{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(n) {
		b.scope.setKey(i, int(i%128))
		v.Update(i)
		m.Put(i, i)
		tm.RegisterEventTimeTimer(struct{}{}, i)
	}
	enc := b.snapshot()
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	blobs, err := enc()
	goruntime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	var size, capacity int64
	for _, blob := range blobs {
		size, capacity = size+int64(len(blob)), capacity+int64(cap(blob))
	}
	if len(blobs) != 128 || capacity != size {
		t.Errorf("%d key groups, %d bytes in blobs of %d bytes' capacity: want 128, no spare capacity", len(blobs), size, capacity)
	}
	alloc := int64(after.TotalAlloc - before.TotalAlloc)
	t.Logf("%d bytes encoded, %d allocated", size, alloc)
	if alloc > size*2 {
		t.Errorf("encoding %d bytes allocated %d, want at most twice as much", size, alloc)
	}
}

// After a snapshot, writing one key's map copies that map only (and the
// key group's entry slice): not every map of the key group, which a
// checkpoint every few seconds turned into a copy of the whole map state
// (28% of Nexmark q5's heap). The snapshot still encodes the maps as they
// were.
func TestMapStateWriteAfterASnapshotCopiesOnlyThatKeysMap(t *testing.T) {
	const keys = 10_000
	b := newKeyedBackend[int64](Int64Codec(), 1)
	r := &StateRegistry[int64]{b: b}
	m, err := NewMapState[int64, int64](r, "m", Int64Codec(), Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	for k := range int64(keys) {
		b.scope.setKey(k, 0)
		for e := range int64(10) {
			m.Put(e, k)
		}
	}
	enc := b.snapshot()
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	b.scope.setKey(7, 0)
	m.Put(3, -1)
	goruntime.ReadMemStats(&after)
	if n := after.Mallocs - before.Mallocs; n > 100 {
		t.Errorf("one Put after a snapshot made %d allocations, want at most 100 (no copy of the other %d maps)", n, keys-1)
	}
	if v, _ := m.Get(3); v != -1 {
		t.Fatalf("key 7's entry 3 = %d after the Put, want -1", v)
	}
	restored := newKeyedBackend[int64](Int64Codec(), 1)
	for kg, blob := range encoded(t, enc) {
		if err := restored.restoreKeyGroup(kg, blob); err != nil {
			t.Fatal(err)
		}
	}
	rm, err := NewMapState[int64, int64](&StateRegistry[int64]{b: restored}, "m", Int64Codec(), Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	restored.scope.setKey(7, 0)
	if v, _ := rm.Get(3); v != 7 || rm.Len() != 10 {
		t.Fatalf("the snapshot holds key 7's entry 3 = %d of %d entries, want 7 of 10 (as before the Put)", v, rm.Len())
	}
}

// TTL's incremental cleanup that drops an expired key after a snapshot
// moves the key group's last entry into its place, with its copy-on-write
// mark: a write to the moved key's map then copies it instead of changing
// the map the snapshot still encodes.
func TestTTLCleanupAfterASnapshotKeepsTheMovedMapCopyOnWrite(t *testing.T) {
	now := int64(1_000)
	b := newKeyedBackend[string](DefaultCodec[string](), 1)
	b.timers.clock = func() time.Time { return time.UnixMilli(now) }
	opts := []StateOpt{WithTTL(StateTTLConfig{TTL: 100 * time.Millisecond, CleanupPerAccess: 10})}
	m, err := NewMapState[int64, int64](&StateRegistry[string]{b: b}, "m", Int64Codec(), Int64Codec(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	b.scope.setKey("a", 0) // the key group's first entry
	m.Put(1, 1)
	m.Put(2, 2)
	now = 1_050
	b.scope.setKey("b", 0) // its last entry
	m.Put(1, 1)
	enc := b.snapshot()
	b.scope.setKey("a", 0)
	m.Delete(2) // a's map is its own now; its entry 1 is still of 1000
	now = 1_120 // a's entry expired, b's not
	b.scope.setKey("b", 0)
	m.Put(3, 3) // the cleanup drops a and moves b first
	restored := newKeyedBackend[string](DefaultCodec[string](), 1)
	restored.timers.clock = b.timers.clock
	now = 1_050
	for kg, blob := range encoded(t, enc) {
		if err := restored.restoreKeyGroup(kg, blob); err != nil {
			t.Fatal(err)
		}
	}
	rm, err := NewMapState[int64, int64](&StateRegistry[string]{b: restored}, "m", Int64Codec(), Int64Codec(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	restored.scope.setKey("b", 0)
	if _, ok := rm.Get(3); ok || rm.Len() != 1 {
		t.Fatalf("the snapshot holds b's map with %d entries (entry 3: %v), want only entry 1 (as at the snapshot)", rm.Len(), ok)
	}
}

// A heap checkpoint's key groups are encoded one at a time as they are
// written to checkpoint storage (checkpoint.OperatorSnapshot.Encode): the
// asynchronous part and the upload together allocate a small fraction of
// the encoded state, where encoding every key group first held a copy of
// it until the upload ended (23% of Nexmark q5's heap, issue 37). What
// the segment holds is the snapshot's encoding.
func TestAHeapCheckpointUploadsItsKeyGroupsAsItEncodesThem(t *testing.T) {
	const n = 200_000
	var v *ValueState[int64]
	j := NewJob("k", MaxParallelism(128))
	src := FromSource(j, "ops", SliceSource([]stateOp{}, 1))
	obs := ProcessKeyed(KeyBy(src, func(o stateOp) string { return o.Key }, nil), "values",
		func() KeyedProcessor[string, stateOp, stateObs] {
			return &declOnly{open: func(st *StateRegistry[string]) (err error) {
				v, err = NewValueState[int64](st, "v", Int64Codec())
				return err
			}}
		})
	h, err := NewOperatorHarness(t.Context(), obs, HarnessConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	k := h.inst.(*keyedInstance[string, stateOp, stateObs])
	for i := range n {
		k.backend.scope.setKey(fmt.Sprintf("key-%08d", i), i%128)
		v.Update(int64(i))
	}
	want, err := k.backend.snapshot()()
	if err != nil {
		t.Fatal(err)
	}
	st, err := storage.Open(t.Context(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := checkpoint.NewSegmentWriter(st, "job", 0)

	// The task's asynchronous part and its upload.
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	snap, async, err := k.snapshot(t.Context(), 1)
	if err == nil && async != nil {
		snap.KeyGroups, err = async()
	}
	if err != nil {
		t.Fatal(err)
	}
	snap.UID = h.UID()
	out, _, written, err := w.Write(t.Context(), 1, checkpoint.TaskSnapshot{Task: "values#0", Operators: []checkpoint.OperatorSnapshot{snap}}, nil)
	goruntime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	alloc := int64(after.TotalAlloc - before.TotalAlloc)
	t.Logf("%d bytes written, %d allocated", written, alloc)
	if written < n*8 || alloc > written/8 {
		t.Errorf("a checkpoint writing %d bytes allocated %d: want under an eighth (no copy of the encoded state)", written, alloc)
	}
	refs := out.Operators[0].KeyGroupRefs
	if len(refs) != len(want) {
		t.Fatalf("%d key groups written, want %d", len(refs), len(want))
	}
	for kg, r := range refs {
		rc, err := st.Open(t.Context(), r.Key, r.Offset, r.Length)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[kg]) || crc32.Checksum(got, crc32.MakeTable(crc32.Castagnoli)) != r.CRC {
			t.Fatalf("key group %d: %d bytes in storage (CRC %08x), want the snapshot's %d (CRC %08x)", kg, len(got),
				crc32.Checksum(got, crc32.MakeTable(crc32.Castagnoli)), len(want[kg]), r.CRC)
		}
	}
}
