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

// A key whose last window goes keeps its entry and its slice on the heap:
// its next window (a word that comes back in the next second) costs no
// allocation, where deleting the key's entry made it allocate a slice and
// insert the key again.
func TestWindowStateKeyWhoseLastWindowWentComesBackWithoutAllocating(t *testing.T) {
	b := newKeyedBackend[int64](Int64Codec(), 4)
	st, err := newWindowState[int64](&StateRegistry[int64]{b: b}, Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	var start int64
	allocs := testing.AllocsPerRun(1000, func() {
		for k := range int64(64) {
			b.scope.setKey(k, int(k%4))
			st.Put(TimeWindow{Start: start, End: start + 10}, k)
		}
		for k := range int64(64) {
			b.scope.setKey(k, int(k%4))
			st.Delete(TimeWindow{Start: start, End: start + 10})
		}
		start += 10
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per window of 64 keys that come back, want 0", allocs)
	}
	for k := range int64(64) {
		b.scope.setKey(k, int(k%4))
		if n := st.Len(); n != 0 {
			t.Fatalf("key %d: %d windows after its last went", k, n)
		}
	}
}

// Keys without windows are absent from snapshots (a key group with only
// such keys has no blob), and a key group sweeps out the keys that stay
// without windows, so that keys that never come back do not grow it while
// those that come back every window keep their entries.
func TestWindowStateSnapshotsAndSweepsKeysWithoutWindows(t *testing.T) {
	const maxPar = 4
	b := newKeyedBackend[int64](Int64Codec(), maxPar)
	st, err := newWindowState[int64](&StateRegistry[int64]{b: b}, Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	w := func(i int64) TimeWindow { return TimeWindow{Start: i * 10, End: i*10 + 10} }
	// Keys 0-99 (key group k%4) each hold window k; keys in key group 0
	// lose theirs, the others only if odd.
	for k := range int64(100) {
		b.scope.setKey(k, int(k%maxPar))
		st.Put(w(k), k)
	}
	live := map[int64]bool{}
	for k := range int64(100) {
		b.scope.setKey(k, int(k%maxPar))
		if k%maxPar == 0 || k%2 == 1 {
			st.Delete(w(k))
			continue
		}
		live[k] = true
	}
	blobs := snapshotBlobs(t, b)
	if _, ok := blobs[0]; ok {
		t.Errorf("key group 0, whose keys have no windows, has a blob of %d bytes", len(blobs[0]))
	}
	back := restoredBackend(t, blobs, maxPar)
	ms, err := NewMapState[TimeWindow, int64](&StateRegistry[int64]{b: back}, windowState, windowCodec{}, Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	for k := range int64(100) {
		back.scope.setKey(k, int(k%maxPar))
		if got, want := ms.Len(), map[bool]int{true: 1}[live[k]]; got != want {
			t.Fatalf("key %d: %d windows restored, want %d", k, got, want)
		}
	}

	// 200 windows in key group 1: keys 1001-1005 every window, 10 keys
	// of their own each window (2000 in all).
	store := st.s.(heapWindows[int64, int64]).s
	const kg = 1
	for r := range int64(200) {
		keys := []int64{1001, 1002, 1003, 1004, 1005}
		for i := range int64(10) {
			keys = append(keys, 10_000+r*10+i)
		}
		for _, k := range keys {
			b.scope.setKey(k, kg)
			st.Put(w(r), k)
		}
		for _, k := range keys {
			b.scope.setKey(k, kg)
			st.Delete(w(r))
		}
		g := store.groups[kg]
		if len(g.ents) > 80 {
			t.Fatalf("window %d: key group %d keeps %d entries for 15 keys a window", r, kg, len(g.ents))
		}
		for _, k := range keys[:5] {
			if _, ok := store.lookup(k, kg); !ok && r > 0 {
				t.Fatalf("window %d: key %d, which comes back every window, was swept", r, k)
			}
		}
	}
}
