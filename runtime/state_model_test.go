package runtime

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// stateModel is what a keyed operator's states hold: a count and a map per
// key.
type stateModel struct {
	n map[string]int64
	m map[string]map[string]int
}

func (sm stateModel) clone() stateModel {
	c := stateModel{n: maps.Clone(sm.n), m: map[string]map[string]int{}}
	for k, v := range sm.m {
		c.m[k] = maps.Clone(v)
	}
	return c
}

type modelStates struct {
	b *keyedBackend[string]
	n *ValueState[int64]
	m *MapState[string, int]
}

func newModelStates(t *testing.T, kind StateBackendKind, maxPar int, restore map[int][]byte) modelStates {
	t.Helper()
	b := newKeyedBackend[string](DefaultCodec[string](), maxPar)
	if kind == PebbleState {
		b.usePebble(testPebbleState(t, maxPar))
	}
	for kg, blob := range restore {
		if err := b.restoreKeyGroup(kg, blob); err != nil {
			t.Fatal(err)
		}
	}
	r := &StateRegistry[string]{b: b}
	n, err := NewValueState[int64](r, "n", nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMapState[string, int](r, "m", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return modelStates{b: b, n: n, m: m}
}

func (s modelStates) scope(key string) {
	s.b.scope.setKey(key, int(hashString(key)%uint32(s.b.maxPar)))
}

// Random reads, read-modify-writes, clears and map changes, with snapshots
// taken in between and encoded only later (as the asynchronous part does):
// the states always match a plain map, and every snapshot restores what the
// states held when it was taken, whatever changed after, on either backend
// (a snapshot of one restores on the other).
func TestKeyedStateMatchesAModelAcrossSnapshots(t *testing.T) {
	for _, kind := range []StateBackendKind{HeapState, PebbleState} {
		t.Run(string(kind), func(t *testing.T) { testKeyedStateModel(t, kind) })
	}
}

func testKeyedStateModel(t *testing.T, kind StateBackendKind) {
	const maxPar = 8
	r := rand.New(rand.NewPCG(1, 2))
	s := newModelStates(t, kind, maxPar, nil)
	model := stateModel{n: map[string]int64{}, m: map[string]map[string]int{}}
	type pending struct {
		enc  func() (map[int][]byte, error)
		want stateModel
	}
	var snaps []pending
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	for step := range 20000 {
		k := keys[r.IntN(len(keys))]
		s.scope(k)
		switch op := r.IntN(10); {
		case op < 5: // read-modify-write, as the wordcount counter
			n, ok := s.n.Value()
			if w, wok := model.n[k]; ok != wok || n != w {
				t.Fatalf("step %d: %q = %d, %v; want %d, %v", step, k, n, ok, w, wok)
			}
			s.n.Update(n + 1)
			model.n[k] = n + 1
		case op < 6:
			s.n.Clear()
			delete(model.n, k)
		case op < 8:
			uk := keys[r.IntN(5)]
			s.m.Put(uk, step)
			if model.m[k] == nil {
				model.m[k] = map[string]int{}
			}
			model.m[k][uk] = step
		case op < 9:
			uk := keys[r.IntN(5)]
			s.m.Delete(uk)
			delete(model.m[k], uk)
			if len(model.m[k]) == 0 {
				delete(model.m, k)
			}
		default:
			if r.IntN(20) == 0 {
				snaps = append(snaps, pending{s.b.snapshot(), model.clone()})
			}
		}
		if len(snaps) > 3 || step == 19999 {
			for _, p := range snaps {
				blobs := encoded(t, p.enc)
				for _, to := range []StateBackendKind{HeapState, PebbleState} {
					check(t, newModelStates(t, to, maxPar, blobs), keys, p.want)
				}
			}
			snaps = snaps[:0]
		}
	}
	check(t, s, keys, model)
}

func check(t *testing.T, s modelStates, keys []string, want stateModel) {
	t.Helper()
	for _, k := range keys {
		s.scope(k)
		n, ok := s.n.Value()
		if w, wok := want.n[k]; ok != wok || n != w {
			t.Fatalf("%q = %d, %v; want %d, %v", k, n, ok, w, wok)
		}
		got := map[string]int{}
		s.m.Range(func(uk string, v int) bool { got[uk] = v; return true })
		if !maps.Equal(got, want.m[k]) && (len(got) > 0 || len(want.m[k]) > 0) {
			t.Fatalf("%q map = %v, want %v", k, got, want.m[k])
		}
	}
}
