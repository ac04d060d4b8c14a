package runtime

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/weirstream/weir/checkpoint"
)

// testStateMemory is a small state memory in a test directory.
func testStateMemory(t testing.TB, opts ...StateMemoryOpt) *StateMemory {
	t.Helper()
	m, err := NewStateMemory(append([]StateMemoryOpt{StateDir(t.TempDir()), StateMemoryBudget(minStateMemory)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

// testPebbleState is a pebble instance closed at the end of the test.
func testPebbleState(t testing.TB, maxPar int) *pebbleState {
	t.Helper()
	p, err := testStateMemory(t).openInstance(t.Name(), maxPar)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// A job's checkpoints restore across state backends at another
// parallelism (the canonical format): a run stopped mid-way with map state
// and timers pending, resumed on the other backend at another parallelism
// and stopped mid-way again, then finished on the first backend at a third
// parallelism, emits exactly what a run without failure emits, record by
// record.
func TestKeyedStateRestoresAcrossBackendsAtAnotherParallelism(t *testing.T) {
	cs := clicks(2000, 23)
	want := sortedByKey(cs)
	ref := newMemTxns()
	if _, err := NewMiniCluster(CheckpointInterval(10*time.Millisecond)).Run(t.Context(), sortJob(cs, 2, 2, ref, nil)); err != nil {
		t.Fatal(err)
	}
	type stage struct {
		kind StateBackendKind
		par  int
	}
	for _, stages := range [][]stage{
		{{HeapState, 2}, {PebbleState, 3}, {HeapState, 1}},
		{{PebbleState, 1}, {HeapState, 3}, {PebbleState, 2}},
	} {
		t.Run(fmt.Sprint(stages), func(t *testing.T) {
			store, err := checkpoint.OpenStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			txns := newMemTxns()
			for i, s := range stages[:len(stages)-1] {
				before := len(txns.output())
				stopMidStream(t, store, len(cs)/8, func(stall stallFn) *Job {
					return sortJob(cs, 2, s.par, txns, stall, StateBackend(s.kind))
				})
				if got := len(txns.output()); got == before || got >= len(cs) {
					t.Fatalf("run %d (%v) committed %d records after %d of %d: want a run stopped mid-way", i, s, got, before, len(cs))
				}
			}
			last := stages[len(stages)-1]
			mc := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond))
			if _, err := mc.Run(t.Context(), sortJob(cs, 2, last.par, txns, nil, StateBackend(last.kind))); err != nil {
				t.Fatal(err)
			}
			checkSorted(t, txns.output(), want)
			if !slices.Equal(perKey(txns.output()), perKey(ref.output())) {
				t.Error("the restored runs' output differs from the run without failure")
			}
		})
	}
}

// pebbleModel fills a model's states on instance p: 3000 keys, a count
// and a map of up to 5 entries each; it returns the model and the keys.
func pebbleModel(t *testing.T, p *pebbleState, maxPar int, seed uint64) (modelStates, stateModel, []string) {
	t.Helper()
	b := newKeyedBackend[string](DefaultCodec[string](), maxPar)
	b.usePebble(p)
	r := &StateRegistry[string]{b: b}
	n, err := NewValueState[int64](r, "n", nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMapState[string, int](r, "m", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := modelStates{b: b, n: n, m: m}
	model := stateModel{n: map[string]int64{}, m: map[string]map[string]int{}}
	rng := rand.New(rand.NewPCG(seed, 7))
	keys := make([]string, 3000)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	for step := range 20000 {
		k := keys[rng.IntN(len(keys))]
		s.scope(k)
		s.n.Update(int64(step))
		model.n[k] = int64(step)
		uk := fmt.Sprint(rng.IntN(5))
		s.m.Put(uk, step)
		if model.m[k] == nil {
			model.m[k] = map[string]int{}
		}
		model.m[k][uk] = step
	}
	return s, model, keys
}

// pebbleBackendFrom opens pebble instance name of mem (closed when t
// ends) and restores a keyed backend on it from the canonical key-group
// blobs.
func pebbleBackendFrom(t *testing.T, mem *StateMemory, name string, maxPar int, blobs map[int][]byte) *keyedBackend[string] {
	t.Helper()
	p, err := mem.openInstance(name, maxPar)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.close() })
	b := newKeyedBackend[string](DefaultCodec[string](), maxPar)
	b.usePebble(p)
	for kg, blob := range blobs {
		if err := b.restoreKeyGroup(kg, blob); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// restoreModel restores blobs into a fresh pebble instance of mem.
func restoreModel(t *testing.T, mem *StateMemory, maxPar int, blobs map[int][]byte) modelStates {
	t.Helper()
	b := pebbleBackendFrom(t, mem, "op", maxPar, blobs) // the name (and directory) the crashed one had
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

// Reads of the pebble instance's files failing while the asynchronous part
// of a snapshot scans it: the snapshot fails with the I/O error (the
// checkpoint is declined), it never yields partial key groups; once reads
// work again, a snapshot of the same instance restores every value.
func TestPebbleSnapshotFailsWithTheIOErrorAndNeverYieldsPartialState(t *testing.T) {
	const maxPar = 16
	var failReads atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failReads.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsRead && strings.HasSuffix(op.Path, ".sst") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	mem := testStateMemory(t, stateFS(fs), StateDir("/tm/state"))
	p, err := mem.openInstance("op", maxPar)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.close() })
	s, model, keys := pebbleModel(t, p, maxPar, 1)
	if err := p.writeBack(); err != nil { // the cached writes in pebble,
		t.Fatal(err)
	}
	if err := p.db.Flush(); err != nil { // then in SSTs, which the scan must read
		t.Fatal(err)
	}
	failReads.Store(true)
	blobs, err := s.b.snapshot()()
	failReads.Store(false)
	if !errors.Is(err, errorfs.ErrInjected) || blobs != nil {
		t.Fatalf("snapshot while reads fail: %d key groups, %v; want none and the injected error", len(blobs), err)
	}
	blobs = encoded(t, s.b.snapshot())
	check(t, restoreModel(t, testStateMemory(t), maxPar, blobs), keys, model)
}

// A task manager killed with state in its pebble instances (a crash-clone
// of the filesystem: what was synced, and a random part of the rest): the
// state directory is emptied when the task manager starts again, and a
// restore from the checkpoint holds exactly the checkpoint's values, never
// what the crashed instance wrote after it.
func TestPebbleStateAfterACrashIsTheCheckpointsNotTheLeftovers(t *testing.T) {
	const maxPar = 16
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			mem, err := NewStateMemory(stateFS(fs), StateDir("/tm/state"), StateMemoryBudget(minStateMemory))
			if err != nil {
				t.Fatal(err)
			}
			p, err := mem.openInstance("op", maxPar)
			if err != nil {
				t.Fatal(err)
			}
			s, model, keys := pebbleModel(t, p, maxPar, seed)
			blobs := encoded(t, s.b.snapshot()) // the checkpoint
			for _, k := range keys[:500] {      // written after it
				s.scope(k)
				s.n.Update(-1)
				s.m.Clear()
			}
			if err := p.db.Flush(); err != nil {
				t.Fatal(err)
			}
			crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(seed, 1))})
			_ = p.close() // the process is gone; nothing of this counts
			_ = mem.Close()

			again := testStateMemory(t, stateFS(crashed), StateDir("/tm/state"))
			if left, err := crashed.List("/tm/state"); err != nil || len(left) != 0 {
				t.Fatalf("state directory after the restart: %v, %v; want it empty", left, err)
			}
			check(t, restoreModel(t, again, maxPar, blobs), keys, model)
		})
	}
}

// Random registers, deletes and firings, hundreds of timers per key group
// (beyond what pebble's timer store caches per key group): pebble's timer
// store fires exactly what the heap's timerQueue fires, in the same order,
// and holds the same timers at every snapshot.
func TestPebbleTimerStoreMatchesTheHeapsAtAnySize(t *testing.T) {
	const maxPar = 4
	heap := heapTimers[string]{newTimerQueue(appendStringOwner)}
	peb := newEncodedTimers(newPebbleTimers(testPebbleState(t, maxPar), "t", pebbleKindEventTimers), appendStringOwner, decodeStringOwner)
	r := rand.New(rand.NewPCG(3, 4))
	type reg struct {
		kg    int
		owner string
		ts    int64
	}
	var live []reg
	now := int64(0)
	for step := range 30000 {
		switch op := r.IntN(10); {
		case op < 6:
			k := r.IntN(50) // an owner (key) is in one key group
			g := reg{kg: k % maxPar, owner: fmt.Sprint("k", k), ts: now + int64(r.IntN(2000))}
			// Pebble registers without a read: it may call a timer it
			// holds new, never a new one known.
			if a, b := heap.register(g.kg, g.owner, g.ts), peb.register(g.kg, g.owner, g.ts); a && !b {
				t.Fatalf("step %d: register %v: heap %v, pebble %v", step, g, a, b)
			}
			live = append(live, g)
		case op < 8 && len(live) > 0:
			g := live[r.IntN(len(live))]
			if a, b := heap.remove(g.kg, g.owner, g.ts), peb.remove(g.kg, g.owner, g.ts); a && !b {
				t.Fatalf("step %d: remove %v: heap %v, pebble %v", step, g, a, b)
			}
		default:
			now += int64(r.IntN(40))
			for {
				a, akg, aok, aerr := heap.next(now)
				b, bkg, bok, berr := peb.next(now)
				if aerr != nil || berr != nil {
					t.Fatalf("step %d: next(%d): heap %v, pebble %v", step, now, aerr, berr)
				}
				if a != b || akg != bkg || aok != bok {
					t.Fatalf("step %d: next(%d): heap %v %d %v, pebble %v %d %v", step, now, a, akg, aok, b, bkg, bok)
				}
				if !aok {
					break
				}
			}
		}
		// Pebble counts its timers by a scan: compared every 500 steps.
		if step%500 == 0 && heap.len() != peb.len() {
			t.Fatalf("step %d: heap holds %d timers, pebble %d", step, heap.len(), peb.len())
		}
		if step%500 == 0 {
			a, aok := heap.latest()
			b, bok := peb.latest()
			if a != b || aok != bok {
				t.Fatalf("step %d: latest timer: heap %d %v, pebble %d %v", step, a, aok, b, bok)
			}
		}
		if step%5000 == 4999 {
			hs, err := frozenTimerBlobs(heap.snapshot(appendStringOwner))
			if err != nil {
				t.Fatal(err)
			}
			ps, err := frozenTimerBlobs(peb.snapshot(appendStringOwner))
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(hs) != fmt.Sprint(ps) {
				t.Fatalf("step %d: snapshots differ", step)
			}
		}
	}
	if heap.len() < 4*timerCacheSize {
		t.Fatalf("only %d timers at the end: want several per key group beyond the cache", heap.len())
	}
}
