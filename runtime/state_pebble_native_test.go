package runtime

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// nativeStates are the states of one keyed operator subtask on the pebble
// backend, as the native tests fill and check them: a value, a map, a
// list and event-time timers.
type nativeStates struct {
	b  *keyedBackend[string]
	n  *ValueState[int64]
	m  *MapState[string, int]
	l  *ListState[string]
	tm *Timers[string, string]
}

// flush writes the value states' caches back and flushes the memtable:
// an SST of its own.
func (p *pebbleState) flush() error {
	if err := p.writeBack(); err != nil {
		return err
	}
	return p.db.Flush()
}

func declareNativeStates(t *testing.T, b *keyedBackend[string]) nativeStates {
	t.Helper()
	r := &StateRegistry[string]{b: b}
	s := nativeStates{b: b}
	var err error
	if s.n, err = NewValueState[int64](r, "n", nil); err != nil {
		t.Fatal(err)
	}
	if s.m, err = NewMapState[string, int](r, "m", nil, nil); err != nil {
		t.Fatal(err)
	}
	if s.l, err = NewListState[string](r, "l", nil); err != nil {
		t.Fatal(err)
	}
	if s.tm, err = NewTimers[string](r, "t", nil); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s nativeStates) scope(key string) {
	s.b.scope.setKey(key, int(hashString(key)%uint32(s.b.maxPar)))
}

// nativeKey is key i, and whether subtask sub of par owns it.
func nativeKey(i, sub, maxPar, par int) (string, bool) {
	k := fmt.Sprintf("key-%d", i)
	return k, SubtaskOf(int(hashString(k)%uint32(maxPar)), maxPar, par) == sub
}

// fillNative writes every state of each of keys owned by subtask sub of
// par, each value derived from the key and round.
func fillNative(s nativeStates, keys, sub, par, round int) {
	for i := range keys {
		k, ok := nativeKey(i, sub, s.b.maxPar, par)
		if !ok {
			continue
		}
		s.scope(k)
		s.n.Update(int64(i*10 + round))
		s.m.Put(fmt.Sprint(round%3), i+round)
		s.l.Add(fmt.Sprintf("%d/%d", i, round))
		s.tm.RegisterEventTimeTimer(fmt.Sprint(round), int64(i+round))
	}
}

// openSubtask opens subtask sub of par of a keyed operator on mem,
// restored from the native snapshots handles in st that overlap it.
func openSubtask(t *testing.T, mem *StateMemory, st storage.Storage, maxPar, sub, par int, handles []*checkpoint.NativeState) nativeStates {
	t.Helper()
	own := KeyGroupRange(sub, maxPar, par)
	lo, hi := own[0], own[len(own)-1]+1
	var mine []*checkpoint.NativeState
	for _, h := range handles {
		if h.Overlaps(lo, hi) {
			mine = append(mine, h)
		}
	}
	p, err := mem.openInstanceFrom(t.Context(), fmt.Sprintf("op-%d-%d", sub, par), maxPar, lo, hi, 1, st, mine)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.close() })
	b := newKeyedBackend[string](DefaultCodec[string](), maxPar)
	b.usePebble(p)
	return declareNativeStates(t, b)
}

// nativeCheckpoint takes a native snapshot of s and writes it to st as
// checkpoint id of task against base; it returns the handle as
// acknowledged, the next base and the bytes uploaded.
func nativeCheckpoint(t *testing.T, st storage.Storage, s nativeStates, task string, id checkpoint.ID, base checkpoint.StateBase) (*checkpoint.NativeState, checkpoint.StateBase, int64) {
	t.Helper()
	n, err := s.b.pebble.nativeSnapshot(id)
	if err != nil {
		t.Fatal(err)
	}
	snap := checkpoint.TaskSnapshot{Task: checkpoint.TaskID(task), Operators: []checkpoint.OperatorSnapshot{{UID: "op", Native: n}}}
	out, next, written, err := checkpoint.NewSegmentWriter(st, "job", 0).Write(t.Context(), id, snap, base)
	if err != nil {
		t.Fatal(err)
	}
	return out.Operators[0].Native, next, written
}

// canonical is the canonical snapshot of s, restricted to key groups
// [lo, hi).
func canonical(t *testing.T, s nativeStates, lo, hi int) map[int][]byte {
	t.Helper()
	blobs := encoded(t, s.b.snapshot())
	maps.DeleteFunc(blobs, func(kg int, _ []byte) bool { return kg < lo || kg >= hi })
	return blobs
}

// A pebble operator's second checkpoint, with a few keys of a big state
// changed, uploads a small fraction of the first: the SSTs of the first
// are referenced again (same objects), only the new SST and the small
// files (MANIFEST, OPTIONS, markers) are uploaded. The filled state is
// compacted to its last level before the first checkpoint: a background
// compaction of the fill's flushes that ended between the two checkpoints
// (timing, on a loaded machine) would rewrite files the first uploaded,
// and the second would upload them again (it failed, rarely, on a loaded
// machine).
func TestTheSecondNativeCheckpointOfAMostlyUnchangedStateUploadsASmallFraction(t *testing.T) {
	const maxPar, keys = 128, 20000
	st, _ := memStores(t)
	mem := testStateMemory(t)
	s := openSubtask(t, mem, st, maxPar, 0, 1, nil)
	fillNative(s, keys, 0, 1, 0)
	if err := s.b.pebble.flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.b.pebble.db.Compact(t.Context(), kgKey(0), kgKey(maxPar), false); err != nil {
		t.Fatal(err)
	}
	first, base, w1 := nativeCheckpoint(t, st, s, "op#0", 1, nil)
	for i := range 20 {
		k, _ := nativeKey(i, 0, maxPar, 1)
		s.scope(k)
		s.n.Update(-1)
	}
	second, _, w2 := nativeCheckpoint(t, st, s, "op#0", 2, base)
	t.Logf("first checkpoint uploaded %d bytes (%d files), the second %d bytes (%d files)", w1, len(first.Files), w2, len(second.Files))
	if w1 < 200<<10 || w2*20 > w1 {
		t.Fatalf("uploaded %d bytes, then %d: want the second under 5%% of the first", w1, w2)
	}
	reused := 0
	for _, f := range second.Files {
		if strings.HasSuffix(f.Name, ".sst") && f.Ref.Checkpoint == 1 {
			reused++
			if !slices.ContainsFunc(first.Files, func(g checkpoint.NativeFile) bool { return g.Ref == f.Ref }) {
				t.Errorf("%s references %s, not an object of the first checkpoint", f.Name, f.Ref.Key)
			}
		}
	}
	if reused == 0 {
		t.Fatal("the second checkpoint references no SST of the first")
	}
}

// Native checkpoints of two subtasks, their instances then dropped (the
// task manager is gone), restored at the same parallelism (each subtask's
// files opened as they are), at three (base instance excised, the other
// overlapping one's key groups ingested) and at one: every restored
// subtask holds exactly the key groups it owns, value for value (its
// canonical snapshot equals the original's there), its lists go on
// appending after the restored elements, and the native snapshot decoded
// (a savepoint, a heap restore) is the canonical snapshot.
func TestNativeCheckpointsRestoreAtTheSameAndAnotherParallelism(t *testing.T) {
	const maxPar, keys = 128, 3000
	st, _ := memStores(t)
	mem := testStateMemory(t)
	var handles []*checkpoint.NativeState
	want := map[int][]byte{}
	for sub := range 2 {
		s := openSubtask(t, mem, st, maxPar, sub, 2, nil)
		for round := range 3 {
			fillNative(s, keys, sub, 2, round)
			if err := s.b.pebble.flush(); err != nil { // several SSTs, some overlapping
				t.Fatal(err)
			}
		}
		own := KeyGroupRange(sub, maxPar, 2)
		maps.Copy(want, canonical(t, s, own[0], own[len(own)-1]+1))
		n, _, _ := nativeCheckpoint(t, st, s, fmt.Sprintf("op#%d", sub), 1, nil)
		handles = append(handles, n)
		decoded, err := DecodeNativeState(t.Context(), st, n)
		if err != nil {
			t.Fatal(err)
		}
		if got := canonical(t, s, 0, maxPar); !maps.EqualFunc(decoded, got, slices.Equal) {
			t.Fatalf("subtask %d: the decoded native snapshot differs from the canonical snapshot (%d key groups, %d)", sub, len(decoded), len(got))
		}
		if err := s.b.pebble.close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, par := range []int{2, 3, 1} {
		t.Run(fmt.Sprint(par), func(t *testing.T) {
			got := map[int][]byte{}
			for sub := range par {
				s := openSubtask(t, mem, st, maxPar, sub, par, handles)
				own := KeyGroupRange(sub, maxPar, par)
				restored := encoded(t, s.b.snapshot())
				for kg := range restored {
					if kg < own[0] || kg > own[len(own)-1] {
						t.Fatalf("subtask %d of %d holds key group %d, which it does not own", sub, par, kg)
					}
				}
				maps.Copy(got, restored)
				for i := range keys {
					k, ok := nativeKey(i, sub, maxPar, par)
					if !ok {
						continue
					}
					s.scope(k)
					if n, _ := s.n.Value(); n != int64(i*10+2) {
						t.Fatalf("%s: n = %d, want %d", k, n, i*10+2)
					}
					s.l.Add("after")
					var l []string
					for v := range s.l.Get() {
						l = append(l, v)
					}
					if w := []string{fmt.Sprintf("%d/0", i), fmt.Sprintf("%d/1", i), fmt.Sprintf("%d/2", i), "after"}; !slices.Equal(l, w) {
						t.Fatalf("%s: list %v, want %v", k, l, w)
					}
				}
			}
			if !maps.EqualFunc(got, want, slices.Equal) {
				t.Fatalf("restored at parallelism %d: %d key groups differ from the checkpoint's %d", par, len(got), len(want))
			}
		})
	}
}

// A job on the pebble backend with checkpoint storage checkpoints
// natively; stopped mid-way (its instances gone with the run), it restores
// from its native checkpoint at another parallelism on pebble, then on the
// heap (which decodes the native files), and finishes with exactly the
// output of a run without failure, record by record. Checkpoint storage
// then holds only objects the retained checkpoints reference (the shared
// registry deleted the SSTs no checkpoint uses any more).
func TestAPebbleJobRestoresFromItsNativeCheckpointsAtAnotherParallelismAndOnTheHeap(t *testing.T) {
	cs := clicks(2000, 23)
	want := sortedByKey(cs)
	ref := newMemTxns()
	if _, err := NewMiniCluster(CheckpointInterval(10*time.Millisecond)).Run(t.Context(), sortJob(cs, 2, 2, ref, nil)); err != nil {
		t.Fatal(err)
	}
	st, store := memStores(t)
	withStorage := []ClusterOpt{StateStorage(st, "mem://"), StateInlineLimit(-1)}
	txns := newMemTxns()
	for i, s := range []struct {
		kind StateBackendKind
		par  int
	}{{PebbleState, 2}, {PebbleState, 3}} {
		before := len(txns.output())
		stopMidStream(t, store, len(cs)/8, func(stall stallFn) *Job {
			return sortJob(cs, 2, s.par, txns, stall, StateBackend(s.kind))
		}, withStorage...)
		if got := len(txns.output()); got == before || got >= len(cs) {
			t.Fatalf("run %d (%v) committed %d records after %d of %d: want a run stopped mid-way", i, s, got, before, len(cs))
		}
		c, err := store.Latest(t.Context(), "sort")
		if err != nil {
			t.Fatal(err)
		}
		native := 0
		for _, ts := range c.Tasks {
			for _, op := range ts.Operators {
				if op.Native != nil {
					native++
				}
			}
		}
		if native != s.par {
			t.Fatalf("run %d: the latest checkpoint holds %d native snapshots, want one per subtask (%d)", i, native, s.par)
		}
	}
	mc := NewMiniCluster(append(withStorage, CheckpointStore(store), CheckpointInterval(5*time.Millisecond))...)
	if _, err := mc.Run(t.Context(), sortJob(cs, 2, 1, txns, nil, StateBackend(HeapState))); err != nil {
		t.Fatal(err)
	}
	checkSorted(t, txns.output(), want)
	if !slices.Equal(perKey(txns.output()), perKey(ref.output())) {
		t.Error("the restored runs' output differs from the run without failure")
	}
	objs := listObjects(t, st, "sort")
	refs, _ := referenced(t, store, "sort")
	for k := range objs {
		if !refs[k] {
			t.Errorf("object %s is referenced by no retained checkpoint", k)
		}
	}
	for k := range refs {
		if !objs[k] {
			t.Errorf("retained checkpoints reference %s, which is gone", k)
		}
	}
}

// Reads of the staged SSTs failing while a native checkpoint uploads them:
// the write fails with the I/O error (the checkpoint is declined) and
// releases the staging directory; the next checkpoint uploads and
// restores every value. An SST missing from checkpoint storage fails the
// restore with ErrStateUnreadable naming the object, before any state is
// opened.
func TestANativeCheckpointFailsOnAFailedUploadAndARestoreOnAMissingSST(t *testing.T) {
	const maxPar, keys = 32, 2000
	var failReads atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failReads.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsRead && strings.Contains(op.Path, ".cp-") && strings.HasSuffix(op.Path, ".sst") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	st, _ := memStores(t)
	mem := testStateMemory(t, stateFS(fs), StateDir("/tm/state"))
	s := openSubtask(t, mem, st, maxPar, 0, 1, nil)
	fillNative(s, keys, 0, 1, 0)
	want := canonical(t, s, 0, maxPar)

	n, err := s.b.pebble.nativeSnapshot(1)
	if err != nil {
		t.Fatal(err)
	}
	failReads.Store(true)
	snap := checkpoint.TaskSnapshot{Task: "op#0", Operators: []checkpoint.OperatorSnapshot{{UID: "op", Native: n}}}
	_, _, _, err = checkpoint.NewSegmentWriter(st, "job", 0).Write(t.Context(), 1, snap, nil)
	failReads.Store(false)
	if !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("upload while reads fail: %v; want the injected error", err)
	}
	if left, _ := fs.List("/tm/state"); slices.ContainsFunc(left, func(n string) bool { return strings.Contains(n, ".cp-") }) {
		t.Fatalf("the failed checkpoint's staging directory is left: %v", left)
	}

	h, _, _ := nativeCheckpoint(t, st, s, "op#0", 2, nil)
	if got := canonical(t, openSubtask(t, testStateMemory(t), st, maxPar, 0, 1, []*checkpoint.NativeState{h}), 0, maxPar); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatal("the checkpoint after the failed one restores other state")
	}

	i := slices.IndexFunc(h.Files, func(f checkpoint.NativeFile) bool { return strings.HasSuffix(f.Name, ".sst") })
	if err := st.Delete(t.Context(), h.Files[i].Ref.Key); err != nil {
		t.Fatal(err)
	}
	_, err = testStateMemory(t).openInstanceFrom(t.Context(), "op", maxPar, 0, maxPar, 1, st, []*checkpoint.NativeState{h})
	if !errors.Is(err, checkpoint.ErrStateUnreadable) || !strings.Contains(err.Error(), h.Files[i].Ref.Key) {
		t.Fatalf("restore without %s: %v; want ErrStateUnreadable naming it", h.Files[i].Ref.Key, err)
	}
}

// A task manager killed after a native checkpoint (a crash-clone of its
// filesystem, with the checkpoint's staging directory and writes after
// it): its state directory is emptied when it starts again, and the
// restore from checkpoint storage holds exactly the checkpoint's state.
func TestANativeRestoreAfterACrashIsTheCheckpointNotTheLeftovers(t *testing.T) {
	const maxPar, keys = 32, 2000
	for seed := range uint64(3) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			st, _ := memStores(t)
			mem, err := NewStateMemory(stateFS(fs), StateDir("/tm/state"), StateMemoryBudget(minStateMemory))
			if err != nil {
				t.Fatal(err)
			}
			s := openSubtask(t, mem, st, maxPar, 0, 1, nil)
			fillNative(s, keys, 0, 1, 0)
			want := canonical(t, s, 0, maxPar)
			h, _, _ := nativeCheckpoint(t, st, s, "op#0", 1, nil)
			if _, err := s.b.pebble.nativeSnapshot(2); err != nil { // staged, never uploaded
				t.Fatal(err)
			}
			fillNative(s, keys, 0, 1, 1) // after the checkpoint
			if err := s.b.pebble.flush(); err != nil {
				t.Fatal(err)
			}
			crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(seed, 1))})
			_ = s.b.pebble.close()
			_ = mem.Close()

			again := testStateMemory(t, stateFS(crashed), StateDir("/tm/state"))
			if left, err := crashed.List("/tm/state"); err != nil || len(left) != 0 {
				t.Fatalf("state directory after the restart: %v, %v; want it empty", left, err)
			}
			got := canonical(t, openSubtask(t, again, st, maxPar, 0, 1, []*checkpoint.NativeState{h}), 0, maxPar)
			if !maps.EqualFunc(got, want, slices.Equal) {
				t.Fatal("the restore after the crash differs from the checkpoint")
			}
		})
	}
}

// The first native checkpoint after a restore references the files the
// restored instance opened on instead of uploading them again (Flink's
// incremental restore keeps its shared files the same way): at the same
// parallelism it uploads a small fraction of the restored checkpoint, at
// another the base instance's files are referenced and only the ingested
// ranges are new. Restored again from those checkpoints, every subtask
// holds exactly its state.
func TestTheFirstNativeCheckpointAfterARestoreReferencesTheFilesItOpenedOn(t *testing.T) {
	const maxPar, keys = 128, 6000
	st, _ := memStores(t)
	mem := testStateMemory(t)
	var handles []*checkpoint.NativeState
	var first int64
	for sub := range 2 {
		s := openSubtask(t, mem, st, maxPar, sub, 2, nil)
		for round := range 3 {
			fillNative(s, keys, sub, 2, round)
			if err := s.b.pebble.flush(); err != nil {
				t.Fatal(err)
			}
		}
		n, _, w := nativeCheckpoint(t, st, s, fmt.Sprintf("op#%d", sub), 1, nil)
		handles, first = append(handles, n), first+w
		if err := s.b.pebble.close(); err != nil {
			t.Fatal(err)
		}
	}
	uploaded := map[string]bool{}
	for _, h := range handles {
		for _, f := range h.Files {
			uploaded[f.Ref.Key] = true
		}
	}
	for _, par := range []int{2, 3} {
		t.Run(fmt.Sprint(par), func(t *testing.T) {
			var second []*checkpoint.NativeState
			var written int64
			want := map[int][]byte{}
			for sub := range par {
				s := openSubtask(t, mem, st, maxPar, sub, par, handles)
				lo, hi := KeyGroupSpan(sub, maxPar, par)
				var mine []*checkpoint.NativeState
				for _, h := range handles {
					if h.Overlaps(lo, hi) {
						mine = append(mine, h)
					}
				}
				for i := range 10 {
					if k, ok := nativeKey(i, sub, maxPar, par); ok {
						s.scope(k)
						s.n.Update(-1)
					}
				}
				maps.Copy(want, canonical(t, s, lo, hi))
				n, _, w := nativeCheckpoint(t, st, s, fmt.Sprintf("op#%d", sub), 2, nativeRestoreBase("op", mine, lo, hi, nil))
				second, written = append(second, n), written+w
				reused := 0
				for _, f := range n.Files {
					if f.Ref.Checkpoint == 1 {
						reused++
						if !uploaded[f.Ref.Key] {
							t.Fatalf("subtask %d of %d: %s references %s, not an object of the restored checkpoint", sub, par, f.Name, f.Ref.Key)
						}
					}
				}
				if reused == 0 {
					t.Fatalf("subtask %d of %d: the first checkpoint after the restore references no file of the restored one", sub, par)
				}
				if err := s.b.pebble.close(); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("parallelism %d: the restored checkpoint uploaded %d bytes, the first after the restore %d", par, first, written)
			if par == 2 && written*10 > first {
				t.Fatalf("the first checkpoint after a restore at the same parallelism uploaded %d bytes of the restored %d: want under 10%%", written, first)
			}
			got := map[int][]byte{}
			for sub := range par {
				maps.Copy(got, canonical(t, openSubtask(t, mem, st, maxPar, sub, par, second), 0, maxPar))
			}
			if !maps.EqualFunc(got, want, slices.Equal) {
				t.Fatalf("restored from the checkpoints after the restore: %d key groups, want %d, or values differ", len(got), len(want))
			}
		})
	}
}

// A deployment restoring a pebble job from its native checkpoint starts
// each keyed task's incremental base with the immutable files of the
// snapshot its instance opens on, and with nothing of the others: the
// first checkpoint after the restore references those objects
// (nativeRestoreBase), and only those.
func TestARestoredDeploymentStartsItsBaseWithTheNativeFilesItOpensOn(t *testing.T) {
	cs := clicks(2000, 23)
	st, store := memStores(t)
	txns := newMemTxns()
	stopMidStream(t, store, len(cs)/8, func(stall stallFn) *Job {
		return sortJob(cs, 2, 2, txns, stall, StateBackend(PebbleState))
	}, StateStorage(st, "mem://"), StateInlineLimit(-1))
	c, err := store.Latest(t.Context(), "sort")
	if err != nil {
		t.Fatal(err)
	}
	for _, par := range []int{2, 3} {
		p, err := compile(sortJob(cs, 2, par, txns, nil, StateBackend(PebbleState)))
		if err != nil {
			t.Fatal(err)
		}
		as, err := AssignState(p.layout(), RestoreInput{Checkpoint: c})
		if err != nil {
			t.Fatal(err)
		}
		_, bases, err := resolveRestore(t.Context(), p, DeploySpec{Restore: as, Storage: st}, func(checkpoint.TaskID) bool { return true })
		if err != nil {
			t.Fatal(err)
		}
		keyed := 0
		for k, sub := range as.Subtasks {
			if len(sub.Native) == 0 {
				continue
			}
			keyed++
			lo, hi := KeyGroupSpan(k.Subtask, p.job.maxParallelism, par)
			b, _, err := nativeBase(sub.Native, lo, hi)
			if err != nil {
				t.Fatal(err)
			}
			var task checkpoint.TaskID
			for _, v := range p.vertices {
				for _, n := range v.nodes {
					if n.uid == k.UID {
						task = v.taskID(k.Subtask)
					}
				}
			}
			var want []string
			for _, f := range sub.Native[b].Files {
				if strings.HasSuffix(f.Name, ".sst") {
					want = append(want, f.Ref.Key)
				}
			}
			var got []string
			for _, r := range bases[task].Refs() {
				got = append(got, r.Key)
			}
			slices.Sort(want)
			slices.Sort(got)
			if len(want) == 0 || !slices.Equal(got, want) {
				t.Fatalf("parallelism %d, %s: the base holds %v, want the SSTs of the snapshot it opens on %v", par, task, got, want)
			}
		}
		if keyed != par {
			t.Fatalf("parallelism %d: %d keyed subtasks restore native snapshots, want %d", par, keyed, par)
		}
	}
}
