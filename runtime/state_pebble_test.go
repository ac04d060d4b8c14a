package runtime

import (
	"fmt"
	"slices"
	"testing"
	"time"

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
