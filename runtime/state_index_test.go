package runtime

import (
	"fmt"
	"testing"
)

// indexedStore is a heap ValueState[int64] of a subtask with maxPar key
// groups, and its store.
func indexedStore(t *testing.T, maxPar int) (*keyedBackend[string], *ValueState[int64], *keyedStore[string, int64]) {
	t.Helper()
	kb := newKeyedBackend[string](StringCodec(), maxPar)
	v, err := NewValueState[int64](&StateRegistry[string]{b: kb}, "count", Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	return kb, v, v.s.(*keyedStore[string, int64])
}

// checkIndex fails unless the store's one index holds every entry of every
// key group at its key group and position, and nothing else.
func checkIndex(t *testing.T, s *keyedStore[string, int64]) {
	t.Helper()
	n := 0
	for kg, g := range s.groups {
		if g == nil {
			continue
		}
		for i, e := range g.ents {
			p, ok := s.idx[e.key]
			if !ok || p.kg() != kg || p.pos() != int32(i) {
				t.Fatalf("key %q (key group %d, position %d) is indexed at %d/%d (found %v)", e.key, kg, i, p.kg(), p.pos(), ok)
			}
			n++
		}
	}
	if len(s.idx) != n {
		t.Fatalf("the index holds %d keys for %d entries", len(s.idx), n)
	}
}

// A subtask's keyed state finds the keys of all its key groups in one
// index (one map probe a lookup, not a key group's map and then a probe),
// which follows every entry through updates, deletes that move another
// entry, and a restore.
func TestHeapStateIndexesTheKeysOfEveryKeyGroupInOneMap(t *testing.T) {
	const maxPar = 8
	kb, v, s := indexedStore(t, maxPar)
	set := func(k string) { kb.scope.setKey(k, int(hashString(k)%maxPar)) }
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		set(keys[i])
		v.Update(int64(i))
	}
	groups := 0
	for _, g := range s.groups {
		if g != nil {
			groups++
		}
	}
	if groups != maxPar || len(s.idx) != len(keys) {
		t.Fatalf("%d keys in %d key groups: the index holds %d", len(keys), groups, len(s.idx))
	}
	checkIndex(t, s)
	for i := 0; i < len(keys); i += 3 { // each delete moves its group's last entry
		set(keys[i])
		v.Clear()
	}
	checkIndex(t, s)
	for i, k := range keys {
		set(k)
		n, ok := v.Value()
		if want := i%3 != 0; ok != want || (ok && n != int64(i)) {
			t.Fatalf("key %s: Value() = %d, %v; want %d, %v", k, n, ok, i, want)
		}
	}

	blobs := encoded(t, kb.snapshot())
	// Restored into another subtask's backend, the state declared again
	// takes its key groups.
	kb3 := newKeyedBackend[string](StringCodec(), maxPar)
	for kg, blob := range blobs {
		if err := kb3.restoreKeyGroup(kg, blob); err != nil {
			t.Fatal(err)
		}
	}
	v3, err := NewValueState[int64](&StateRegistry[string]{b: kb3}, "count", Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	s3 := v3.s.(*keyedStore[string, int64])
	checkIndex(t, s3)
	if len(s3.idx) != len(keys)-(len(keys)+2)/3 {
		t.Fatalf("restored %d keys, want %d", len(s3.idx), len(keys)-(len(keys)+2)/3)
	}
	for i, k := range keys {
		kb3.scope.setKey(k, int(hashString(k)%maxPar))
		n, ok := v3.Value()
		if want := i%3 != 0; ok != want || (ok && n != int64(i)) {
			t.Fatalf("restored key %s: Value() = %d, %v; want %d, %v", k, n, ok, i, want)
		}
	}
}

// A key group restored again replaces the key group's keys in the index:
// a key of the first restore that the second does not hold is gone.
func TestHeapStateKeyGroupRestoredAgainReplacesItsKeys(t *testing.T) {
	const maxPar = 4
	kb, v, s := indexedStore(t, maxPar)
	var a, b string
	for i := 0; a == "" || b == ""; i++ { // two keys of key group 1
		if k := fmt.Sprintf("k%d", i); hashString(k)%maxPar == 1 {
			if a == "" {
				a = k
			} else {
				b = k
			}
		}
	}
	blobOf := func(vals map[string]int64) []byte {
		src, sv, _ := indexedStore(t, maxPar)
		for k, n := range vals {
			src.scope.setKey(k, 1)
			sv.Update(n)
		}
		blobs := encoded(t, src.snapshot())
		_, data, err := readFrame(blobs[1]) // the state's name, then its data
		if err != nil {
			t.Fatal(err)
		}
		data, _, err = readFrame(data)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if err := s.restore(1, blobOf(map[string]int64{a: 1, b: 2})); err != nil {
		t.Fatal(err)
	}
	if err := s.restore(1, blobOf(map[string]int64{a: 5})); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, s)
	kb.scope.setKey(a, 1)
	if n, ok := v.Value(); !ok || n != 5 {
		t.Fatalf("%s: Value() = %d, %v; want 5, true", a, n, ok)
	}
	kb.scope.setKey(b, 1)
	if n, ok := v.Value(); ok {
		t.Fatalf("%s, not in the second restore: Value() = %d, true", b, n)
	}
}
