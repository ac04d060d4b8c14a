package runtime

import (
	"fmt"
	goruntime "runtime"
	"testing"
)

// snapshotBlobs snapshots b and returns its key-group blobs.
func snapshotBlobs[K comparable](t *testing.T, b *keyedBackend[K]) map[int][]byte {
	t.Helper()
	blobs, err := b.snapshot()()
	if err != nil {
		t.Fatal(err)
	}
	return blobs
}

// restoredBackend is a backend of maxPar key groups restored from blobs.
func restoredBackend(t *testing.T, blobs map[int][]byte, maxPar int) *keyedBackend[int64] {
	t.Helper()
	b := newKeyedBackend[int64](Int64Codec(), maxPar)
	for kg, blob := range blobs {
		if err := b.restoreKeyGroup(kg, blob); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// The heap window store writes the bytes of a MapState[TimeWindow, ACC]
// of the same name and reads them: a checkpoint or savepoint taken before
// the window operator kept its windows in slices (or on the pebble
// backend, whose window state is a map state) restores into it, and one
// taken with it restores into a map state, every window and accumulator
// equal.
func TestWindowStateRestoresFromAndIntoAMapStateOfItsWindows(t *testing.T) {
	const keys, maxPar = 300, 16
	// Key k holds k%5 windows (none for some keys), from k%3 windows back
	// (negative starts too) with accumulators above 127 bytes for some.
	want := map[int64]map[TimeWindow]string{}
	for k := range int64(keys) {
		for i := range k % 5 {
			w := TimeWindow{Start: (i - k%3) * 1000, End: (i-k%3)*1000 + 1000}
			if want[k] == nil {
				want[k] = map[TimeWindow]string{}
			}
			want[k][w] = fmt.Sprintf("%d/%d/%0*d", k, i, int(k%200), 0)
		}
	}
	check := func(t *testing.T, b *keyedBackend[int64], m *MapState[TimeWindow, string]) {
		t.Helper()
		for k := range int64(keys) {
			b.scope.setKey(k, int(k%maxPar))
			if m.Len() != len(want[k]) {
				t.Fatalf("key %d: %d windows, want %d", k, m.Len(), len(want[k]))
			}
			for w, v := range want[k] {
				if got, ok := m.Get(w); !ok || got != v {
					t.Fatalf("key %d window %v: %q, %v; want %q", k, w, got, ok, v)
				}
			}
		}
	}

	// A map state, as the window state was kept before.
	src := newKeyedBackend[int64](Int64Codec(), maxPar)
	ms, err := NewMapState[TimeWindow, string](&StateRegistry[int64]{b: src}, windowState, windowCodec{}, StringCodec())
	if err != nil {
		t.Fatal(err)
	}
	for k, ws := range want {
		src.scope.setKey(k, int(k%maxPar))
		for w, v := range ws {
			ms.Put(w, v)
		}
	}

	win := restoredBackend(t, snapshotBlobs(t, src), maxPar)
	wst, err := newWindowState[string](&StateRegistry[int64]{b: win}, StringCodec())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := wst.s.(heapWindows[int64, string]); !ok {
		t.Fatalf("the heap window state is a %T", wst.s)
	}
	check(t, win, wst)

	back := restoredBackend(t, snapshotBlobs(t, win), maxPar)
	ms2, err := NewMapState[TimeWindow, string](&StateRegistry[int64]{b: back}, windowState, windowCodec{}, StringCodec())
	if err != nil {
		t.Fatal(err)
	}
	check(t, back, ms2)
}

// The heap window store keeps each key's windows sorted whatever the
// order they come and go in, above and below the length where lookups
// bisect, and copies a key's windows before changing them while a
// snapshot holds them.
func TestWindowStateKeepsEachKeysWindowsAcrossPutsDeletesAndSnapshots(t *testing.T) {
	b := newKeyedBackend[int64](Int64Codec(), 4)
	st, err := newWindowState[int64](&StateRegistry[int64]{b: b}, Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	b.scope.setKey(7, 3)
	model := map[TimeWindow]int64{}
	var enc func() (map[int][]byte, error)
	var encModel map[TimeWindow]int64
	for i := range 400 {
		w := TimeWindow{Start: int64((i * 37) % 50), End: int64((i*37)%50) + 10}
		switch {
		case i%7 == 3:
			st.Delete(w)
			delete(model, w)
		default:
			st.Put(w, int64(i))
			model[w] = int64(i)
		}
		if i%50 == 10 {
			enc = b.snapshot()
			encModel = map[TimeWindow]int64{}
			for w, v := range model {
				encModel[w] = v
			}
		}
		if i%50 == 30 {
			// The snapshot taken at i%50 == 10 encodes its windows, not
			// the ones written since.
			got := restoredBackend(t, mustBlobs(t, enc), 4)
			gst, err := NewMapState[TimeWindow, int64](&StateRegistry[int64]{b: got}, windowState, windowCodec{}, Int64Codec())
			if err != nil {
				t.Fatal(err)
			}
			got.scope.setKey(7, 3)
			if gst.Len() != len(encModel) {
				t.Fatalf("step %d: the snapshot has %d windows, want %d", i, gst.Len(), len(encModel))
			}
			for w, v := range encModel {
				if g, ok := gst.Get(w); !ok || g != v {
					t.Fatalf("step %d: the snapshot's %v is %d, %v; want %d", i, w, g, ok, v)
				}
			}
		}
		if st.Len() != len(model) {
			t.Fatalf("step %d: %d windows, want %d", i, st.Len(), len(model))
		}
		var prev TimeWindow
		n := 0
		st.Range(func(w TimeWindow, v int64) bool {
			if n > 0 && cmpWindow(prev, w) >= 0 {
				t.Fatalf("step %d: %v after %v", i, w, prev)
			}
			if model[w] != v {
				t.Fatalf("step %d: %v is %d, want %d", i, w, v, model[w])
			}
			prev, n = w, n+1
			return true
		})
	}
}

func mustBlobs(t *testing.T, enc func() (map[int][]byte, error)) map[int][]byte {
	t.Helper()
	blobs, err := enc()
	if err != nil {
		t.Fatal(err)
	}
	return blobs
}

// A key's tumbling window on the heap takes its key, its window and its
// accumulator and little else: at most 128 bytes of heap per key of an
// int64 key and accumulator at 200k keys (95 measured: the key's entry and
// index in its key group, and its slice of one window), where the Go map
// per key it was kept in took 306.
func TestWindowStateOfAKeyTakesNoMapOnTheHeap(t *testing.T) {
	const n = 200_000
	b := newKeyedBackend[int64](Int64Codec(), 128)
	before := heapLive()
	st, err := newWindowState[int64](&StateRegistry[int64]{b: b}, Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(n) {
		b.scope.setKey(i, int(i%128))
		st.Put(TimeWindow{Start: 0, End: 10_000}, i)
	}
	per := float64(heapLive()-before) / n
	goruntime.KeepAlive(st)
	t.Logf("%.1f bytes of heap per key and window", per)
	if per > 128 {
		t.Errorf("%.1f bytes of heap per key and window, want at most 128", per)
	}
}
