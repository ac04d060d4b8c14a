package bench

import (
	"context"
	"fmt"
	goruntime "runtime"

	"github.com/weirstream/weir/runtime"
)

// stateMemoryMapWidth is how many entries each key's MapState holds in
// state-memory.
const stateMemoryMapWidth = 100

// StateMemory measures the Go heap the heap state backend keeps per
// ValueState[int64] entry, per MapState[int64, int64] entry and per
// event-time timer, against the encoded size of the same data (the bytes of
// a snapshot of it): for each, one keyed operator driven by an
// OperatorHarness in this process is given n entries (1M; 200k with
// --quick), then the heap in use after a garbage collection is compared
// with the heap in use before the operator was made, and the operator's
// snapshot is taken. The int64 keys are distinct for the value state and
// the timers (one timer per key, at distinct timestamps); the map state has
// 100 entries per key.
func StateMemory(ctx context.Context, cfg Config) ([]Line, error) {
	n := cfg.sizeOf(1_000_000, 200_000, 20_000)
	kinds := []struct {
		metric string
		proc   func() runtime.KeyedProcessor[int64, int64, int64]
		key    func(int64) int64
		what   string
	}{
		{"heap_bytes_per_value_entry", func() runtime.KeyedProcessor[int64, int64, int64] { return &valueFiller{} },
			func(v int64) int64 { return v }, "ValueState[int64] entries, one per int64 key"},
		{"heap_bytes_per_map_entry", func() runtime.KeyedProcessor[int64, int64, int64] { return &mapFiller{} },
			func(v int64) int64 { return v / stateMemoryMapWidth }, fmt.Sprintf("MapState[int64, int64] entries, %d per int64 key", stateMemoryMapWidth)},
		{"heap_bytes_per_timer", func() runtime.KeyedProcessor[int64, int64, int64] { return &timerFiller{} },
			func(v int64) int64 { return v }, "event-time timers, one per int64 key"},
	}
	var out []Line
	for _, k := range kinds {
		cfg.progress("%s: %d entries", k.metric, n)
		heap, encoded, err := stateMemoryOf(ctx, n, k.proc, k.key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k.metric, err)
		}
		perHeap, perEnc := float64(heap)/float64(n), float64(encoded)/float64(n)
		out = append(out, Line{Bench: "state-memory", Metric: k.metric, Value: perHeap, Baseline: "encoded-snapshot-bytes",
			BaselineValue: perEnc, Ratio: perHeap / perEnc,
			Note: fmt.Sprintf("%d %s: %d bytes of heap in use after a GC, %d bytes in the operator's snapshot; ratio is heap/encoded (lower is leaner)",
				n, k.what, heap, encoded)})
	}
	return out, nil
}

// stateMemoryOf gives a fresh keyed operator running proc n records (0 to
// n-1, keyed by key) and returns the heap it retains and the bytes of its
// snapshot.
func stateMemoryOf(ctx context.Context, n int, proc func() runtime.KeyedProcessor[int64, int64, int64], key func(int64) int64) (heap, encoded int64, err error) {
	j := runtime.NewJob("bench-state-memory")
	in := runtime.FromSource(j, "in", runtime.SliceSource[int64](nil, 1))
	s := runtime.ProcessKeyed(runtime.KeyBy(in, key, runtime.Int64Codec()), "fill", proc)
	before := heapInUse()
	h, err := runtime.NewOperatorHarness(ctx, s, runtime.HarnessConfig{})
	if err != nil {
		return 0, 0, err
	}
	defer h.Close()
	for i := range int64(n) {
		if err := runtime.PushInput(h, 0, i, i); err != nil {
			return 0, 0, err
		}
	}
	heap = int64(heapInUse()) - int64(before)
	snap, err := h.Snapshot(ctx, 1)
	if err != nil {
		return 0, 0, err
	}
	for _, b := range snap.KeyGroups {
		encoded += int64(len(b))
	}
	goruntime.KeepAlive(h)
	return heap, encoded, nil
}

// heapInUse is the heap's live bytes after a full collection.
func heapInUse() uint64 {
	var ms goruntime.MemStats
	goruntime.GC()
	goruntime.GC()
	goruntime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// valueFiller keeps each record as its key's ValueState[int64].
type valueFiller struct{ v *runtime.ValueState[int64] }

func (f *valueFiller) Open(_ context.Context, st *runtime.StateRegistry[int64]) (err error) {
	f.v, err = runtime.NewValueState[int64](st, "v", runtime.Int64Codec())
	return err
}

func (f *valueFiller) ProcessElement(_ *runtime.KeyedContext[int64], v int64, _ runtime.Collector[int64]) error {
	f.v.Update(v)
	return nil
}

func (f *valueFiller) OnTimer(*runtime.KeyedContext[int64], int64, runtime.Collector[int64]) error {
	return nil
}

// mapFiller puts each record into its key's MapState, under itself.
type mapFiller struct {
	m *runtime.MapState[int64, int64]
}

func (f *mapFiller) Open(_ context.Context, st *runtime.StateRegistry[int64]) (err error) {
	f.m, err = runtime.NewMapState[int64, int64](st, "m", runtime.Int64Codec(), runtime.Int64Codec())
	return err
}

func (f *mapFiller) ProcessElement(_ *runtime.KeyedContext[int64], v int64, _ runtime.Collector[int64]) error {
	f.m.Put(v, v)
	return nil
}

func (f *mapFiller) OnTimer(*runtime.KeyedContext[int64], int64, runtime.Collector[int64]) error {
	return nil
}

// timerFiller registers an event-time timer at each record's value.
type timerFiller struct{}

func (timerFiller) Open(context.Context, *runtime.StateRegistry[int64]) error { return nil }

func (timerFiller) ProcessElement(ctx *runtime.KeyedContext[int64], v int64, _ runtime.Collector[int64]) error {
	ctx.TimerService().RegisterEventTimeTimer(v)
	return nil
}

func (timerFiller) OnTimer(*runtime.KeyedContext[int64], int64, runtime.Collector[int64]) error {
	return nil
}
