package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/weirstream/weir/checkpoint"
)

// stateOp is a record of the state-kind test operators: op on key.
type stateOp struct {
	Key string
	Op  string // "add", "addall", "update", "clear", "read"
	N   int64
}

// stateObs is what a "read" sees of each state of the key.
type stateObs struct {
	Key      string
	List     []int64
	Sum      int64 // the reducing state (sum), 0 when unset
	HasSum   bool
	Avg      float64 // the aggregating state (mean)
	HasAvg   bool
	Value    int64
	HasValue bool
	MapLen   int
}

// meanAgg is an AggregateFunction: the mean of what was added.
type meanAgg struct{}

func (meanAgg) CreateAccumulator() [2]int64                                          { return [2]int64{} }
func (meanAgg) Add(v int64, acc [2]int64) [2]int64                                   { return [2]int64{acc[0] + v, acc[1] + 1} }
func (meanAgg) GetResult(acc [2]int64) float64                                       { return float64(acc[0]) / float64(acc[1]) }
func (meanAgg) Merge(a, b [2]int64) [2]int64                                         { return [2]int64{a[0] + b[0], a[1] + b[1]} }
func sum(acc, v int64) (int64, error)                                                { return acc + v, nil }
func (p *kindsProc) OnTimer(*KeyedContext[string], int64, Collector[stateObs]) error { return nil }

// kindsProc keeps a list, a reducing (sum), an aggregating (mean), a value
// (the last N) and a map (N -> N) state per key, every one with opts.
type kindsProc struct {
	opts []StateOpt
	l    *ListState[int64]
	r    *ReducingState[int64]
	a    *AggregatingState[int64, [2]int64, float64]
	v    *ValueState[int64]
	m    *MapState[int64, int64]
}

func (p *kindsProc) Open(_ context.Context, st *StateRegistry[string]) error {
	var err error
	if p.l, err = NewListState[int64](st, "list", nil, p.opts...); err != nil {
		return err
	}
	if p.r, err = NewReducingState[int64](st, "sum", sum, nil, p.opts...); err != nil {
		return err
	}
	if p.a, err = NewAggregatingState[int64, [2]int64, float64](st, "mean", meanAgg{}, nil, p.opts...); err != nil {
		return err
	}
	if p.v, err = NewValueState[int64](st, "last", nil, p.opts...); err != nil {
		return err
	}
	p.m, err = NewMapState[int64, int64](st, "seen", nil, nil, p.opts...)
	return err
}

func (p *kindsProc) ProcessElement(ctx *KeyedContext[string], o stateOp, out Collector[stateObs]) error {
	switch o.Op {
	case "add":
		p.l.Add(o.N)
		if err := p.r.Add(o.N); err != nil {
			return err
		}
		p.a.Add(o.N)
		p.v.Update(o.N)
		p.m.Put(o.N, o.N)
	case "addall":
		p.l.AddAll([]int64{o.N, o.N + 1})
	case "update":
		p.l.Update([]int64{o.N})
	case "clear":
		p.l.Clear()
		p.r.Clear()
		p.a.Clear()
		p.v.Clear()
		p.m.Clear()
	case "read":
		obs := stateObs{Key: o.Key, List: slices.Collect(p.l.Get()), MapLen: p.m.Len()}
		obs.Sum, obs.HasSum = p.r.Get()
		obs.Avg, obs.HasAvg = p.a.Get()
		obs.Value, obs.HasValue = p.v.Value()
		out.Collect(obs)
	default:
		return fmt.Errorf("unknown op %q", o.Op)
	}
	return nil
}

// kindsHarness runs kindsProc (with opts) in a harness of subtask sub of
// par, restored from restore, its processing time read from clock.
func kindsHarness(t *testing.T, opts []StateOpt, sub, par int, restore []checkpoint.OperatorSnapshot, clock func() int64, out *[]stateObs) *OperatorHarness {
	t.Helper()
	j := NewJob("kinds", MaxParallelism(8))
	src := FromSource(j, "ops", SliceSource([]stateOp{}, 1))
	obs := ProcessKeyed(KeyBy(src, func(o stateOp) string { return o.Key }, nil), "kinds",
		func() KeyedProcessor[string, stateOp, stateObs] { return &kindsProc{opts: opts} })
	h, err := NewOperatorHarness(t.Context(), obs, HarnessConfig{Subtask: sub, Parallelism: par, Restore: restore, Clock: clock,
		Output: func(v any, _ int64) { *out = append(*out, v.(stateObs)) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// pushOps pushes ops into whichever of hs owns their key.
func pushOps(t *testing.T, hs []*OperatorHarness, ops ...stateOp) {
	t.Helper()
	for _, o := range ops {
		_, sub, _ := HarnessKeyGroup(hs[0], 0, o)
		if err := PushInput(hs[sub], 0, o, NoTimestamp); err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
	}
}

// ListState, ReducingState and AggregatingState keep every key's state
// through Add, AddAll, Update and Clear, and through a snapshot restored
// at another parallelism (1 -> 3), key group by key group.
func TestListReducingAndAggregatingStatesKeepEveryKeyAcrossARescale(t *testing.T) {
	var out []stateObs
	h := kindsHarness(t, nil, 0, 1, nil, nil, &out)
	keys := []string{"a", "b", "c", "d", "e", "f"}
	for _, k := range keys {
		pushOps(t, []*OperatorHarness{h}, stateOp{k, "add", 1}, stateOp{k, "add", 2}, stateOp{k, "add", 6})
	}
	pushOps(t, []*OperatorHarness{h}, stateOp{"e", "addall", 10}, stateOp{"f", "update", 9}, stateOp{"d", "clear", 0})
	snap, err := h.Snapshot(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	out = nil
	hs := make([]*OperatorHarness, 3)
	for i := range hs {
		hs[i] = kindsHarness(t, nil, i, 3, []checkpoint.OperatorSnapshot{snap}, nil, &out)
	}
	for _, k := range keys {
		pushOps(t, hs, stateOp{k, "add", 3}, stateOp{k, "read", 0})
	}
	want := map[string]stateObs{
		"a": {List: []int64{1, 2, 6, 3}, Sum: 12, HasSum: true, Avg: 3, HasAvg: true, Value: 3, HasValue: true, MapLen: 4},
		"d": {List: []int64{3}, Sum: 3, HasSum: true, Avg: 3, HasAvg: true, Value: 3, HasValue: true, MapLen: 1},
		"e": {List: []int64{1, 2, 6, 10, 11, 3}, Sum: 12, HasSum: true, Avg: 3, HasAvg: true, Value: 3, HasValue: true, MapLen: 4},
		"f": {List: []int64{9, 3}, Sum: 12, HasSum: true, Avg: 3, HasAvg: true, Value: 3, HasValue: true, MapLen: 4},
	}
	want["b"], want["c"] = want["a"], want["a"]
	if len(out) != len(keys) {
		t.Fatalf("%d reads out, want %d", len(out), len(keys))
	}
	for _, o := range out {
		w := want[o.Key]
		w.Key = o.Key
		if !slices.Equal(o.List, w.List) || o.Sum != w.Sum || o.HasSum != w.HasSum || o.Avg != w.Avg || o.HasAvg != w.HasAvg ||
			o.Value != w.Value || o.HasValue != w.HasValue || o.MapLen != w.MapLen {
			t.Errorf("key %s: got %+v, want %+v", o.Key, o, w)
		}
	}
}

// A state restored as one kind and declared as another (or with TTL and
// without) is refused when the function declares it, naming both kinds:
// its bytes would be misread otherwise.
func TestStateRestoredAsAnotherKindIsRefused(t *testing.T) {
	snapOf := func(open func(st *StateRegistry[string]) error) checkpoint.OperatorSnapshot {
		t.Helper()
		j := NewJob("k", MaxParallelism(8))
		src := FromSource(j, "ops", SliceSource([]stateOp{}, 1))
		obs := ProcessKeyed(KeyBy(src, func(o stateOp) string { return o.Key }, nil), "kinds",
			func() KeyedProcessor[string, stateOp, stateObs] { return &declOnly{open: open} })
		h, err := NewOperatorHarness(t.Context(), obs, HarnessConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if err := PushInput(h, 0, stateOp{Key: "a", Op: "write"}, NoTimestamp); err != nil {
			t.Fatal(err)
		}
		s, err := h.Snapshot(t.Context(), 1)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	value := func(st *StateRegistry[string]) error { _, err := NewValueState[int64](st, "x", nil); return err }
	valueTTL := func(st *StateRegistry[string]) error {
		_, err := NewValueState[int64](st, "x", nil, WithTTL(StateTTLConfig{TTL: 1e9}))
		return err
	}
	list := func(st *StateRegistry[string]) error { _, err := NewListState[int64](st, "x", nil); return err }
	reducing := func(st *StateRegistry[string]) error {
		_, err := NewReducingState[int64](st, "x", sum, nil)
		return err
	}
	for _, tc := range []struct {
		name     string
		from, to func(st *StateRegistry[string]) error
		want     string
	}{
		{"value as list", value, list, `state "x" restored as value or map state, declared as list state`},
		{"list as reducing", list, reducing, `state "x" restored as list state, declared as reducing state`},
		{"value as value with TTL", value, valueTTL, `state "x" restored as value or map state, declared as value state with TTL`},
		{"value with TTL as value", valueTTL, value, `state "x" restored as value state with TTL, declared as value or map state`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := snapOf(tc.from)
			j := NewJob("k", MaxParallelism(8))
			src := FromSource(j, "ops", SliceSource([]stateOp{}, 1))
			obs := ProcessKeyed(KeyBy(src, func(o stateOp) string { return o.Key }, nil), "kinds",
				func() KeyedProcessor[string, stateOp, stateObs] { return &declOnly{open: tc.to} })
			_, err := NewOperatorHarness(t.Context(), obs, HarnessConfig{Restore: []checkpoint.OperatorSnapshot{snap}})
			if !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrIncompatibleState saying %s", err, tc.want)
			}
		})
	}
}

// declOnly declares what open declares and writes 1 to a ValueState,
// ListState or ReducingState named x on "write".
type declOnly struct {
	open func(st *StateRegistry[string]) error
	st   *StateRegistry[string]
}

func (d *declOnly) Open(_ context.Context, st *StateRegistry[string]) error {
	d.st = st
	return d.open(st)
}

func (d *declOnly) ProcessElement(*KeyedContext[string], stateOp, Collector[stateObs]) error {
	for _, s := range d.st.b.states {
		switch x := s.(type) {
		case *keyedStore[string, int64]:
			x.put(1)
		case *keyedStore[string, []int64]:
			x.put([]int64{1})
		case *keyedStore[string, ttlValue[int64]]:
			x.put(ttlValue[int64]{v: 1, ts: 1 << 62}) // never expired by the wall clock
		}
	}
	return nil
}

func (d *declOnly) OnTimer(*KeyedContext[string], int64, Collector[stateObs]) error { return nil }

// A state dump (the harness's KeyedState, as streamctl state dump) shows a
// list state as one record per element under its declared name, and a
// reducing and an aggregating state as their value.
func TestStateDumpShowsListElementsAndReducedValues(t *testing.T) {
	var out []stateObs
	h := kindsHarness(t, nil, 0, 1, nil, nil, &out)
	pushOps(t, []*OperatorHarness{h}, stateOp{"a", "add", 4}, stateOp{"a", "add", 5})
	got := map[string][]any{}
	if err := h.KeyedState(func(r StateRecord) error {
		got[r.State] = append(got[r.State], r.Value)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got["list"], []any{int64(4), int64(5)}) {
		t.Errorf("list dumped as %v, want [4 5]", got["list"])
	}
	if !slices.Equal(got["sum"], []any{int64(9)}) {
		t.Errorf("reducing state dumped as %v, want [9]", got["sum"])
	}
	if len(got["mean"]) != 1 || got["mean"][0] != [2]int64{9, 2} {
		t.Errorf("aggregating state dumped as %v, want its accumulator [9 2]", got["mean"])
	}
}

// obsCollector collects what kindsProc emits.
type obsCollector struct{ got []stateObs }

func (c *obsCollector) Collect(o stateObs) { c.got = append(c.got, o) }

// The list, reducing and aggregating states work on the pebble backend as
// on the heap, their snapshots are the canonical format (a pebble
// snapshot restores into the heap backend at another parallelism and
// reads the same), and a list keeps one pebble key per element: Add
// writes one key and reads nothing.
func TestStateKindsOnPebbleMatchTheHeapAndRestoreIntoIt(t *testing.T) {
	const maxPar = 8
	kc := DefaultCodec[string]()
	hash := keyHasher(kc)
	run := func(b *keyedBackend[string], ops []stateOp) []stateObs {
		t.Helper()
		p := &kindsProc{}
		if err := p.Open(t.Context(), &StateRegistry[string]{b: b}); err != nil {
			t.Fatal(err)
		}
		out := &obsCollector{}
		for _, o := range ops {
			b.scope.setKey(o.Key, int(hash(o.Key)%maxPar))
			if err := p.ProcessElement(nil, o, out); err != nil {
				t.Fatal(err)
			}
		}
		return out.got
	}
	var ops, reads []stateOp
	for i := range 40 {
		k := fmt.Sprint("k", i%10)
		ops = append(ops, stateOp{k, "add", int64(i)})
		if i%7 == 0 {
			ops = append(ops, stateOp{k, "addall", int64(i)})
		}
	}
	ops = append(ops, stateOp{"k3", "update", 5}, stateOp{"k4", "clear", 0})
	for i := range 10 {
		reads = append(reads, stateOp{fmt.Sprint("k", i), "read", 0})
	}
	heap := newKeyedBackend[string](kc, maxPar)
	want := run(heap, append(slices.Clone(ops), reads...))
	peb := newKeyedBackend[string](kc, maxPar)
	peb.usePebble(testPebbleState(t, maxPar))
	got := run(peb, append(slices.Clone(ops), reads...))
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pebble reads\n%v\nheap reads\n%v", got, want)
	}
	// One pebble key per list element.
	var elems int
	for _, o := range want {
		elems += len(o.List)
	}
	var list *pebbleList[string, int64]
	for _, s := range peb.states {
		if l, ok := s.(*pebbleList[string, int64]); ok {
			list = l
		}
	}
	keys := 0
	for kg := range maxPar {
		p := appendStatePrefix(nil, kg, list.m.sid)
		it, err := list.m.st.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
		if err != nil {
			t.Fatal(err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			keys++
		}
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if keys != elems {
		t.Fatalf("the pebble list holds %d pebble keys for %d elements", keys, elems)
	}
	// The pebble snapshot restores into heap backends at parallelism 3.
	blobs, err := peb.snapshot()()
	if err != nil {
		t.Fatal(err)
	}
	var restored []stateObs
	for sub := range 3 {
		b := newKeyedBackend[string](kc, maxPar)
		for _, kg := range KeyGroupRange(sub, maxPar, 3) {
			if blob, ok := blobs[kg]; ok {
				if err := b.restoreKeyGroup(kg, blob); err != nil {
					t.Fatal(err)
				}
			}
		}
		var mine []stateOp
		for _, r := range reads {
			if SubtaskOf(int(hash(r.Key)%maxPar), maxPar, 3) == sub {
				mine = append(mine, r)
			}
		}
		restored = append(restored, run(b, mine)...)
	}
	sortObs := func(os []stateObs) string {
		s := make([]string, len(os))
		for i, o := range os {
			s[i] = fmt.Sprint(o)
		}
		slices.Sort(s)
		return strings.Join(s, "\n")
	}
	if sortObs(restored) != sortObs(want) {
		t.Fatalf("restored on the heap\n%s\nwant\n%s", sortObs(restored), sortObs(want))
	}
}
