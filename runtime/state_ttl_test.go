package runtime

import (
	"fmt"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// ttlOpts are the kinds test's states with a TTL of 100 ms.
func ttlOpts(update TTLUpdate, per int) []StateOpt {
	return []StateOpt{WithTTL(StateTTLConfig{TTL: 100 * time.Millisecond, Update: update, CleanupPerAccess: per})}
}

// readKey pushes a read of key into h and returns what it saw.
func readKey(t *testing.T, h *OperatorHarness, out *[]stateObs, key string) stateObs {
	t.Helper()
	*out = (*out)[:0]
	pushOps(t, []*OperatorHarness{h}, stateOp{key, "read", 0})
	if len(*out) != 1 {
		t.Fatalf("%d reads out", len(*out))
	}
	return (*out)[0]
}

func (o stateObs) empty() bool {
	return len(o.List) == 0 && !o.HasSum && !o.HasAvg && !o.HasValue && o.MapLen == 0
}

func (o stateObs) full() bool {
	return len(o.List) == 1 && o.HasSum && o.HasAvg && o.HasValue && o.MapLen == 1
}

// A state with TTL never returns a value older than its TTL, of any kind
// (value, map entry, list element, reducing, aggregating), with the
// processing time read from the operator's clock; with TTLOnReadAndWrite a
// read refreshes it, with TTLOnCreateAndWrite it does not.
func TestTTLStateNeverReturnsAnExpiredValue(t *testing.T) {
	for _, tc := range []struct {
		name   string
		update TTLUpdate
		// reads at 60 ms; then what a read at 130 ms sees
		fullAt130 bool
	}{
		{"on create and write", TTLOnCreateAndWrite, false},
		{"on read and write", TTLOnReadAndWrite, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := int64(1_000)
			var out []stateObs
			h := kindsHarness(t, ttlOpts(tc.update, 0), 0, 1, nil, func() int64 { return now }, &out)
			pushOps(t, []*OperatorHarness{h}, stateOp{"a", "add", 7})
			now += 60
			if o := readKey(t, h, &out, "a"); !o.full() {
				t.Fatalf("at 60 ms: %+v, want every state set", o)
			}
			now += 70 // 130 ms after the write, 70 after the read
			if o := readKey(t, h, &out, "a"); o.full() != tc.fullAt130 || (!tc.fullAt130 && !o.empty()) {
				t.Fatalf("at 130 ms: %+v, want full=%v", o, tc.fullAt130)
			}
			now += 100
			if o := readKey(t, h, &out, "a"); !o.empty() {
				t.Fatalf("at 230 ms: %+v, want nothing", o)
			}
		})
	}
}

// heapEntries counts the entries the heap stores of h's kindsProc hold,
// expired or not.
func heapEntries(t *testing.T, h *OperatorHarness) int {
	t.Helper()
	k, ok := h.inst.(*keyedInstance[string, stateOp, stateObs])
	if !ok {
		t.Fatalf("instance %T", h.inst)
	}
	n := 0
	for _, s := range k.backend.states {
		switch x := s.(type) {
		case *keyedStore[string, ttlValue[int64]]:
			n += x.countEntries()
		case *keyedStore[string, ttlValue[[2]int64]]:
			n += x.countEntries()
		case *keyedStore[string, map[int64]ttlValue[int64]]:
			n += x.countEntries()
		case *keyedStore[string, []ttlValue[int64]]:
			n += x.countEntries()
		}
	}
	return n
}

func (s *keyedStore[K, V]) countEntries() int {
	n := 0
	for _, g := range s.groups {
		if g != nil {
			n += len(g.ents)
		}
	}
	return n
}

func snapshotBytes(s checkpoint.OperatorSnapshot) int {
	n := 0
	for _, b := range s.KeyGroups {
		n += len(b)
	}
	return n
}

// Expired state is freed without being read: a snapshot taken after the
// TTL writes none of it, and on the heap the incremental cleanup drops it
// as other keys are accessed. Measured: entries held and snapshot bytes,
// before and after.
func TestTTLStateIsFreedWithoutBeingRead(t *testing.T) {
	const keys = 500
	now := int64(1_000)
	var out []stateObs
	h := kindsHarness(t, ttlOpts(TTLOnCreateAndWrite, 0), 0, 1, nil, func() int64 { return now }, &out)
	for i := range keys {
		pushOps(t, []*OperatorHarness{h}, stateOp{fmt.Sprint("k", i), "add", int64(i)})
	}
	before, err := h.Snapshot(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	entriesBefore := heapEntries(t, h)
	if entriesBefore != 5*keys {
		t.Fatalf("%d entries held, want %d", entriesBefore, 5*keys)
	}
	now += 100
	after, err := h.Snapshot(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot bytes: %d before the TTL, %d after", snapshotBytes(before), snapshotBytes(after))
	if len(after.KeyGroups) != 0 {
		t.Fatalf("the snapshot after the TTL holds %d bytes in %d key groups, want none", snapshotBytes(after), len(after.KeyGroups))
	}
	// Each access of a state checks 5 more of its entries: write one
	// other key (5 states, a few accesses each) until all are freed.
	var writes int
	for writes = 1; writes <= keys; writes++ {
		pushOps(t, []*OperatorHarness{h}, stateOp{"other", "add", 1})
		if heapEntries(t, h) == 5 { // "other"'s own
			break
		}
	}
	t.Logf("entries held: %d before the TTL, %d after %d writes of another key", entriesBefore, heapEntries(t, h), writes)
	if n := heapEntries(t, h); n != 5 {
		t.Fatalf("%d entries held after %d writes of another key, want 5", n, writes-1)
	}
}

// Across a restore the TTL goes on from each value's last write: restored
// before the TTL a value is there, restored after it nothing is (the
// snapshot was taken while the values were live).
func TestTTLStateRestoredAfterTheTTLReturnsNothing(t *testing.T) {
	now := int64(1_000)
	var out []stateObs
	h := kindsHarness(t, ttlOpts(TTLOnCreateAndWrite, 0), 0, 1, nil, func() int64 { return now }, &out)
	pushOps(t, []*OperatorHarness{h}, stateOp{"a", "add", 7}, stateOp{"b", "add", 8})
	snap, err := h.Snapshot(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		at   int64
		full bool
	}{{1_050, true}, {1_100, false}, {5_000, false}} {
		t.Run(fmt.Sprint("restored at +", tc.at-1_000, "ms"), func(t *testing.T) {
			now := tc.at
			var out []stateObs
			hs := []*OperatorHarness{
				kindsHarness(t, ttlOpts(TTLOnCreateAndWrite, 0), 0, 2, []checkpoint.OperatorSnapshot{snap}, func() int64 { return now }, &out),
				kindsHarness(t, ttlOpts(TTLOnCreateAndWrite, 0), 1, 2, []checkpoint.OperatorSnapshot{snap}, func() int64 { return now }, &out),
			}
			pushOps(t, hs, stateOp{"a", "read", 0}, stateOp{"b", "read", 0})
			for _, o := range out {
				if tc.full && !o.full() || !tc.full && !o.empty() {
					t.Fatalf("key %s: %+v, want full=%v", o.Key, o, tc.full)
				}
			}
		})
	}
}

// On the pebble backend too a state with TTL never returns an expired
// value, of any kind.
func TestTTLStateOnPebbleNeverReturnsAnExpiredValue(t *testing.T) {
	const maxPar = 8
	now := int64(1_000)
	b := newKeyedBackend[string](DefaultCodec[string](), maxPar)
	b.usePebble(testPebbleState(t, maxPar))
	b.timers.clock = func() time.Time { return time.UnixMilli(now) }
	p := &kindsProc{opts: ttlOpts(TTLOnCreateAndWrite, 0)}
	if err := p.Open(t.Context(), &StateRegistry[string]{b: b}); err != nil {
		t.Fatal(err)
	}
	read := func(o stateOp) stateObs {
		t.Helper()
		b.scope.setKey(o.Key, int(keyHasher(b.keyCodec)(o.Key)%maxPar))
		out := &obsCollector{}
		if err := p.ProcessElement(nil, o, out); err != nil {
			t.Fatal(err)
		}
		if o.Op != "read" {
			return stateObs{}
		}
		return out.got[0]
	}
	read(stateOp{"a", "add", 7})
	now += 99
	if o := read(stateOp{"a", "read", 0}); !o.full() {
		t.Fatalf("at 99 ms: %+v, want every state set", o)
	}
	now++
	if o := read(stateOp{"a", "read", 0}); !o.empty() {
		t.Fatalf("at 100 ms: %+v, want nothing", o)
	}
}

// On pebble, expired state is swept without being read: accesses of the
// states (here reads of a key that has none) run the sweep every
// pebbleTTLSweepEvery accesses, and it deletes every expired entry of
// every kind from pebble, and nothing live. Measured: pebble keys held
// before and after.
func TestTTLStateOnPebbleIsSweptWithoutBeingRead(t *testing.T) {
	const maxPar, keys = 8, 500
	now := int64(1_000)
	b := newKeyedBackend[string](DefaultCodec[string](), maxPar)
	b.usePebble(testPebbleState(t, maxPar))
	b.timers.clock = func() time.Time { return time.UnixMilli(now) }
	p := &kindsProc{opts: ttlOpts(TTLOnCreateAndWrite, 0)}
	if err := p.Open(t.Context(), &StateRegistry[string]{b: b}); err != nil {
		t.Fatal(err)
	}
	do := func(o stateOp) {
		t.Helper()
		b.scope.setKey(o.Key, int(keyHasher(b.keyCodec)(o.Key)%maxPar))
		if err := p.ProcessElement(nil, o, &obsCollector{}); err != nil {
			t.Fatal(err)
		}
	}
	held := func() int {
		t.Helper()
		it, err := b.pebble.db.NewIter(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		n := 0
		for ok := it.First(); ok; ok = it.Next() {
			n++
		}
		return n
	}
	for i := range keys {
		do(stateOp{fmt.Sprint("k", i), "add", int64(i)})
	}
	do(stateOp{"live", "add", 1})
	before := held()
	if before != 5*(keys+1) {
		t.Fatalf("%d pebble keys held, want %d", before, 5*(keys+1))
	}
	now += 99
	do(stateOp{"live", "add", 2}) // rewritten at +99 ms: live until +199
	now++
	reads := 0
	for ; reads < 4*pebbleTTLSweepEvery && held() > 5; reads++ {
		do(stateOp{"none", "read", 0})
	}
	after := held()
	t.Logf("pebble keys held: %d before the TTL, %d after %d reads of a key without state", before, after, reads)
	// "live": its value, reducing, aggregating and map entry rewritten,
	// its list's second element; its first element expired.
	if after != 5 {
		t.Fatalf("%d pebble keys held after %d reads, want the live key's 5", after, reads)
	}
	now += 98 // +198: "live" still within its TTL
	b.scope.setKey("live", int(keyHasher(b.keyCodec)("live")%maxPar))
	out := &obsCollector{}
	if err := p.ProcessElement(nil, stateOp{"live", "read", 0}, out); err != nil {
		t.Fatal(err)
	}
	if o := out.got[0]; !o.HasValue || o.MapLen != 1 || len(o.List) != 1 {
		t.Fatalf("the live key after the sweep: %+v, want its value, map entry and one list element", o)
	}
}
