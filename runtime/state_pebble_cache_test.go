package runtime

import (
	"fmt"
	"maps"
	"testing"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// A value state's write-back cache reaches pebble before every snapshot:
// writes, overwrites and deletions made just before a native checkpoint,
// and just before a canonical snapshot, are in it (a restore from the
// native one, and the canonical blobs, hold exactly the values written),
// and so are the writes the cache evicted on the way.
func TestValueWritesCachedBeforeASnapshotAreInIt(t *testing.T) {
	const maxPar, keys = 8, 3000
	mem := testStateMemory(t)
	st, err := storage.Open(t.Context(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := openSubtask(t, mem, st, maxPar, 0, 1, nil)
	// A cache bound far below the keys written: it evicts while they are
	// written, and still holds some when the snapshots are taken.
	s.b.pebble.cacheLimit = 32 << 10
	val := func(i, round int) int64 { return int64(i*1000 + round) }
	want := map[string]int64{}
	for round := range 3 {
		for i := range keys {
			k := fmt.Sprintf("key-%d", i)
			s.scope(k)
			switch {
			case round == 2 && i%3 == 0:
				s.n.Clear()
				delete(want, k)
			case round == 1 && i%2 == 1:
				// unchanged
			default:
				s.n.Update(val(i, round))
				want[k] = val(i, round)
			}
		}
	}
	if s.b.pebble.cached == 0 {
		t.Fatal("nothing cached: the test checks nothing")
	}
	check := func(what string, s nativeStates, want map[string]int64) {
		t.Helper()
		for i := range keys {
			k := fmt.Sprintf("key-%d", i)
			s.scope(k)
			got, ok := s.n.Value()
			w, wok := want[k]
			if ok != wok || got != w {
				t.Fatalf("%s: %s = %d, %v; want %d, %v", what, k, got, ok, w, wok)
			}
		}
	}
	// A native checkpoint, restored into a fresh instance.
	h, _, _ := nativeCheckpoint(t, st, s, "op#0", 1, nil)
	nativeWant := maps.Clone(want)
	r := openSubtask(t, mem, st, maxPar, 0, 1, []*checkpoint.NativeState{h})
	check("native checkpoint", r, nativeWant)
	// More writes after the native checkpoint, for the canonical one.
	for i := range keys / 2 {
		k := fmt.Sprintf("key-%d", i)
		s.scope(k)
		s.n.Update(val(i, 3))
		want[k] = val(i, 3)
	}
	// The canonical snapshot, decoded into a fresh instance.
	blobs := canonical(t, s, 0, maxPar)
	p, err := mem.openInstance("canonical", maxPar)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	b := newKeyedBackend[string](DefaultCodec[string](), maxPar)
	b.usePebble(p)
	for kg, blob := range blobs {
		if err := b.restoreKeyGroup(kg, blob); err != nil {
			t.Fatal(err)
		}
	}
	check("canonical snapshot", declareNativeStates(t, b), want)
}
