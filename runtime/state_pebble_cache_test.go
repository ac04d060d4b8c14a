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
	b := pebbleBackendFrom(t, mem, "canonical", maxPar, blobs)
	check("canonical snapshot", declareNativeStates(t, b), want)
}

// A map state's write-back cache of whole keys reaches pebble before every
// snapshot: entries written, overwritten, removed and keys cleared under a
// cache bound far below the state, keys that grow past what the cache
// holds, are read back as written (Get, Range, Len), and a native
// checkpoint restored and a canonical snapshot taken after them hold
// exactly those entries.
func TestMapEntriesCachedBeforeASnapshotAreInIt(t *testing.T) {
	const maxPar, keys = 8, 1500
	mem := testStateMemory(t)
	st, err := storage.Open(t.Context(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := openSubtask(t, mem, st, maxPar, 0, 1, nil)
	s.b.pebble.cacheLimit = 32 << 10
	want := map[string]map[string]int{}
	// entries is how many user keys key i holds: some keys grow past
	// mapCacheEntries, so that they leave the cache.
	entries := func(i int) int { return 1 + i%(mapCacheEntries+4) }
	write := func(round int) {
		for i := range keys {
			k := fmt.Sprintf("key-%d", i)
			s.scope(k)
			if want[k] == nil {
				want[k] = map[string]int{}
			}
			w := want[k]
			switch {
			case round == 2 && i%5 == 0:
				s.m.Clear()
				clear(w)
			case round == 2 && i%5 == 1:
				s.m.Clear()
				clear(w)
				s.m.Put("after-clear", i)
				w["after-clear"] = i
			case round == 1 && i%3 == 1:
				// unchanged
			default:
				for j := range entries(i) {
					uk := fmt.Sprintf("uk-%d", j)
					if round > 0 && j%2 == 1 {
						s.m.Delete(uk)
						delete(w, uk)
						continue
					}
					s.m.Put(uk, i*1000+j*10+round)
					w[uk] = i*1000 + j*10 + round
				}
			}
		}
	}
	check := func(what string, s nativeStates, want map[string]map[string]int) {
		t.Helper()
		for i := range keys {
			k := fmt.Sprintf("key-%d", i)
			s.scope(k)
			got := map[string]int{}
			s.m.Range(func(uk string, uv int) bool {
				got[uk] = uv
				return true
			})
			if !maps.Equal(got, want[k]) || s.m.Len() != len(want[k]) {
				t.Fatalf("%s: %s = %v (len %d); want %v", what, k, got, s.m.Len(), want[k])
			}
			for uk, uv := range want[k] {
				if v, ok := s.m.Get(uk); !ok || v != uv {
					t.Fatalf("%s: %s[%s] = %d, %v; want %d", what, k, uk, v, ok, uv)
				}
			}
			if _, ok := s.m.Get("uk-1"); ok != (want[k]["uk-1"] != 0) {
				t.Fatalf("%s: %s[uk-1] present %v; want %v", what, k, ok, !ok)
			}
		}
	}
	for round := range 3 {
		write(round)
	}
	if s.b.pebble.cached == 0 {
		t.Fatal("nothing cached: the test checks nothing")
	}
	check("live state", s, want)
	// A native checkpoint, restored into a fresh instance.
	h, _, _ := nativeCheckpoint(t, st, s, "op#0", 1, nil)
	nativeWant := map[string]map[string]int{}
	for k, w := range want {
		nativeWant[k] = maps.Clone(w)
	}
	r := openSubtask(t, mem, st, maxPar, 0, 1, []*checkpoint.NativeState{h})
	check("native checkpoint", r, nativeWant)
	// More writes after the native checkpoint, for the canonical one.
	write(3)
	blobs := canonical(t, s, 0, maxPar)
	b := pebbleBackendFrom(t, mem, "canonical", maxPar, blobs)
	check("canonical snapshot", declareNativeStates(t, b), want)
}

// An operator whose only keyed state is a map state (the window
// operator's) writes its cache back before a canonical snapshot: every
// entry written just before the snapshot is in it.
func TestAMapStateAloneHasItsCachedWritesInACanonicalSnapshot(t *testing.T) {
	const maxPar, keys = 8, 200
	mem := testStateMemory(t)
	declare := func(name string, blobs map[int][]byte) (*keyedBackend[string], *MapState[string, int]) {
		b := pebbleBackendFrom(t, mem, name, maxPar, blobs)
		m, err := NewMapState[string, int](&StateRegistry[string]{b: b}, "m", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return b, m
	}
	scope := func(b *keyedBackend[string], k string) { b.scope.setKey(k, int(hashString(k)%maxPar)) }
	b, m := declare("alone", nil)
	for i := range keys {
		scope(b, fmt.Sprintf("key-%d", i))
		m.Put("a", i)
		m.Put("b", -i)
	}
	r, rm := declare("restored", encoded(t, b.snapshot()))
	for i := range keys {
		scope(r, fmt.Sprintf("key-%d", i))
		a, aok := rm.Get("a")
		bv, bok := rm.Get("b")
		if !aok || !bok || a != i || bv != -i || rm.Len() != 2 {
			t.Fatalf("key-%d: a %d, %v; b %d, %v; len %d; want %d and %d", i, a, aok, bv, bok, rm.Len(), i, -i)
		}
	}
}

// Timers beyond the cached heads of the key groups are registered and
// removed without a pebble read (register): registered again, removed,
// and every timer left fires once, in order, and is counted.
func TestTimersBeyondTheCachedHeadRegisteredAgainAndRemovedFireOnceInOrder(t *testing.T) {
	const maxPar, n = 4, 20000
	pt := newPebbleTimers(testPebbleState(t, maxPar), "t", pebbleKindEventTimers)
	owner := func(i int) string { return fmt.Sprint("key-", i) }
	for i := range n {
		if !pt.register(i%maxPar, owner(i), int64(i)) {
			t.Fatalf("timer %d registered before", i)
		}
	}
	if got := pt.len(); got != n {
		t.Fatalf("%d timers counted, want %d", got, n)
	}
	// Registered again: no new timer. Every third removed.
	for i := range n {
		if pt.register(i%maxPar, owner(i), int64(i)) {
			t.Fatalf("timer %d registered twice", i)
		}
		if i%3 == 0 && !pt.remove(i%maxPar, owner(i), int64(i)) {
			t.Fatalf("timer %d not removed", i)
		}
	}
	for i := range n {
		if i%3 == 0 {
			continue
		}
		id, kg, ok := pt.next(int64(n))
		if !ok || id.ts != int64(i) || id.owner != owner(i) || kg != i%maxPar {
			t.Fatalf("fired %v (key group %d, %v); want timer %d", id, kg, ok, i)
		}
	}
	if id, _, ok := pt.next(int64(n)); ok || pt.len() != 0 {
		t.Fatalf("fired %v after every timer, %d left", id, pt.len())
	}
}

// dirtyBytes is the bytes charged to the cache's dirty entries: what a
// write-back would commit.
func (s *pebbleValue[K, V]) dirtyBytes() int {
	n := 0
	for _, e := range s.cache {
		if e.dirty {
			n += e.size
		}
	}
	return n
}

func (m *pebbleMap[K, UK, UV]) dirtyBytes() int {
	n := 0
	for _, c := range m.cache {
		for _, e := range c.ents {
			if e.dirty {
				n += e.size
			}
		}
	}
	return n
}

// dirtyBytes is the bytes of dirty entries in p's caches: what the
// synchronous part of a checkpoint taken now writes back.
func (p *pebbleState) dirtyBytes() int {
	n := 0
	for _, c := range p.caches {
		n += c.(interface{ dirtyBytes() int }).dirtyBytes()
	}
	return n
}

// The dirty entries of an instance's write-back caches, which the
// synchronous part of a checkpoint writes back, stay under
// cacheLimit/dirtyShare, and under the cap in bytes (dirtyMax) where that
// is lower, however many writes were made since the last checkpoint: with
// state far above the cache bound (the cache evicts) and with a few hot
// keys the cache holds (it never evicts), for value and map states. Every
// value is then read back as last written, and a native checkpoint
// restored holds them all.
func TestCheckpointWritesBackAtMostAShareOfTheCacheBound(t *testing.T) {
	const maxPar, cacheLimit, rounds = 8, 64 << 10, 6
	for _, tc := range []struct {
		name     string
		keys     int
		mapState bool
		// dirtyMax, when set, caps the dirty bytes below cacheLimit/dirtyShare.
		dirtyMax int
	}{
		{name: "values far above the bound", keys: 20000},
		{name: "hot values within the bound", keys: 300},
		{name: "map entries far above the bound", keys: 10000, mapState: true},
		{name: "hot map entries within the bound", keys: 100, mapState: true},
		{name: "hot values under a cap below the share", keys: 300, dirtyMax: 2 << 10},
		{name: "hot map entries under a cap below the share", keys: 100, mapState: true, dirtyMax: 2 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := testStateMemory(t)
			st, err := storage.Open(t.Context(), "file://"+t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			s := openSubtask(t, mem, st, maxPar, 0, 1, nil)
			p := s.b.pebble
			p.cacheLimit = cacheLimit
			limit := cacheLimit / dirtyShare
			if tc.dirtyMax > 0 {
				p.dirtyMax, limit = tc.dirtyMax, tc.dirtyMax
			}
			most := 0
			for round := range rounds {
				for i := range tc.keys {
					s.scope(fmt.Sprintf("key-%d", i))
					if tc.mapState {
						s.m.Put("a", i*rounds+round)
						s.m.Put("b", round)
					} else {
						s.n.Update(int64(i*rounds + round))
					}
					most = max(most, p.dirtyBytes())
				}
			}
			if most == 0 {
				t.Fatal("nothing dirty: the test checks nothing")
			}
			if most > limit {
				t.Fatalf("up to %d dirty bytes to write back at a barrier; want at most %d (cache bound %d / %d, cap %d)", most, limit, cacheLimit, dirtyShare, tc.dirtyMax)
			}
			h, _, _ := nativeCheckpoint(t, st, s, "op#0", 1, nil)
			r := openSubtask(t, mem, st, maxPar, 0, 1, []*checkpoint.NativeState{h})
			last := rounds - 1
			for i := range tc.keys {
				k := fmt.Sprintf("key-%d", i)
				for _, got := range []nativeStates{s, r} {
					got.scope(k)
					if tc.mapState {
						a, aok := got.m.Get("a")
						b, bok := got.m.Get("b")
						if !aok || !bok || a != i*rounds+last || b != last {
							t.Fatalf("%s: a=%d,%v b=%d,%v; want %d, %d", k, a, aok, b, bok, i*rounds+last, last)
						}
					} else if v, ok := got.n.Value(); !ok || v != int64(i*rounds+last) {
						t.Fatalf("%s = %d, %v; want %d", k, v, ok, i*rounds+last)
					}
				}
			}
		})
	}
}

// What a barrier flushes and writes back is capped in bytes, not only a
// share of the budget: at the default budget of a large machine the
// shares were hundreds of MiB, seconds of synchronous work at a barrier.
// Small budgets keep their shares.
func TestTheBarriersFlushAndWriteBackAreCappedInBytes(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		budget                 int64
		slots                  int
		memTable, dirty, cache int
	}{
		{name: "3 GiB over two slots", budget: 3 << 30, slots: 2, memTable: 64 << 20, dirty: 8 << 20, cache: 256 << 20},
		{name: "1 GiB over two slots", budget: 1 << 30, slots: 2, memTable: 64 << 20, dirty: 8 << 20, cache: (1 << 30) / 12},
		{name: "256 MiB over one slot", budget: 256 << 20, slots: 1, memTable: (256 << 20) / 6, dirty: (256 << 20) / 6 / 8, cache: (256 << 20) / 6},
		{name: "the smallest budget", budget: minStateMemory, slots: 1, memTable: minStateMemory / 6, dirty: minStateMemory / 6 / 8, cache: minStateMemory / 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, err := NewStateMemory(StateDir(t.TempDir()), StateMemoryBudget(tc.budget), StateSlots(tc.slots))
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			p, err := mem.openInstance("op", 8)
			if err != nil {
				t.Fatal(err)
			}
			defer p.close()
			if got := int(mem.memTableSize(1)); got != tc.memTable {
				t.Errorf("memtable %d bytes, want %d", got, tc.memTable)
			}
			if p.cacheLimit != tc.cache {
				t.Errorf("cache bound %d bytes, want %d", p.cacheLimit, tc.cache)
			}
			if got := p.dirtyLimit(); got != tc.dirty {
				t.Errorf("dirty bytes written back past %d, want %d", got, tc.dirty)
			}
			// Pebble makes a batch of half a memtable or more (counting its
			// per-entry overhead, a few times a small entry's bytes) a
			// flushable batch of its own: a memtable rotation and an L0 file
			// per write-back (pebble's DB.commitWrite). A q5 run at 100M
			// events with 32 MiB write-backs beside 64 MiB memtables was
			// stopped unfinished (docs/guide/state-backends.md).
			if got := p.dirtyLimit(); got*8 > int(mem.memTableSize(1)) {
				t.Errorf("write-back of up to %d bytes beside %d-byte memtables: want an eighth of a memtable or less", got, mem.memTableSize(1))
			}
		})
	}
}
