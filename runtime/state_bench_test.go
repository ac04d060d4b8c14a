package runtime

import (
	"fmt"
	"testing"
)

// benchKeys are the keys of the state benchmarks, with their key groups.
func benchKeys(n, maxPar int) ([]string, []int) {
	keys := make([]string, n)
	kgs := make([]int, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
		kgs[i] = int(hashString(keys[i]) % uint32(maxPar))
	}
	return keys, kgs
}

// benchBackend is a keyed backend of the kind for a benchmark.
func benchBackend(b *testing.B, kind StateBackendKind) *keyedBackend[string] {
	kb := newKeyedBackend[string](StringCodec(), 128)
	if kind == PebbleState {
		kb.usePebble(testPebbleState(b, 128))
	}
	return kb
}

// eachBackend runs the benchmark on both state backends.
func eachBackend(b *testing.B, fn func(b *testing.B, kind StateBackendKind)) {
	for _, kind := range []StateBackendKind{HeapState, PebbleState} {
		b.Run(string(kind), func(b *testing.B) { fn(b, kind) })
	}
}

// A read-modify-write of a ValueState[int64] per record over 10000 keys
// (a running count). ns/op is one record.
func BenchmarkValueStateUpdate(b *testing.B) { eachBackend(b, benchValueStateUpdate) }

func benchValueStateUpdate(b *testing.B, kind StateBackendKind) {
	kb := benchBackend(b, kind)
	v, err := NewValueState[int64](&StateRegistry[string]{b: kb}, "count", Int64Codec())
	if err != nil {
		b.Fatal(err)
	}
	keys, kgs := benchKeys(10000, 128)
	i := 0
	for b.Loop() {
		k := i % len(keys)
		kb.scope.setKey(keys[k], kgs[k])
		n, _ := v.Value()
		v.Update(n + 1)
		i++
	}
}

// A MapState Put and Get per record: 1000 keys of 16 entries each. ns/op
// is one record.
func BenchmarkMapStatePut(b *testing.B) { eachBackend(b, benchMapStatePut) }

func benchMapStatePut(b *testing.B, kind StateBackendKind) {
	kb := benchBackend(b, kind)
	m, err := NewMapState[int64, int64](&StateRegistry[string]{b: kb}, "m", Int64Codec(), Int64Codec())
	if err != nil {
		b.Fatal(err)
	}
	keys, kgs := benchKeys(1000, 128)
	i := 0
	for b.Loop() {
		k := i % len(keys)
		kb.scope.setKey(keys[k], kgs[k])
		uk := int64(i/len(keys)) % 16
		n, _ := m.Get(uk)
		m.Put(uk, n+1)
		i++
	}
}

// Event-time timers: each record registers a timer of its key, and every
// 1000 records the watermark fires what is due. ns/op is one record.
func BenchmarkEventTimers(b *testing.B) { eachBackend(b, benchEventTimers) }

func benchEventTimers(b *testing.B, kind StateBackendKind) {
	kb := benchBackend(b, kind)
	t, err := NewTimers[struct{}](&StateRegistry[string]{b: kb}, "", Codec[struct{}](voidCodec{}))
	if err != nil {
		b.Fatal(err)
	}
	kb.timers.onTimer = func(*firingTimer) error { return nil }
	keys, kgs := benchKeys(10000, 128)
	i := 0
	for b.Loop() {
		k := i % len(keys)
		kb.scope.setKey(keys[k], kgs[k])
		t.RegisterEventTimeTimer(struct{}{}, int64(i/100))
		i++
		if i%1000 == 0 {
			if err := kb.timers.advanceWatermark(int64(i/100) - 5); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// encoded runs the asynchronous part of a keyed snapshot.
func encoded(t testing.TB, enc func() (map[int][]byte, error)) map[int][]byte {
	t.Helper()
	blobs, err := enc()
	if err != nil {
		t.Fatal(err)
	}
	return blobs
}
