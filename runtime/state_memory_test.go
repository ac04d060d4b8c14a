package runtime

import (
	goruntime "runtime"
	"testing"
)

// heapLive is the heap's live bytes after a full collection.
func heapLive() int64 {
	var ms goruntime.MemStats
	goruntime.GC()
	goruntime.GC()
	goruntime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// A timer of an int64 key takes its typed key and timestamp twice (the set
// and the heap) and little else: at most 72 bytes of heap at 200k timers
// (53 measured), where a timer whose key was encoded into a string owner
// took 95.
func TestTimersHoldNoEncodedOwnerPerTimer(t *testing.T) {
	const n = 200_000
	b := newKeyedBackend[int64](Int64Codec(), 128)
	before := heapLive()
	tm, err := NewTimers[struct{}](&StateRegistry[int64]{b: b}, "t", voidCodec{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(n) {
		b.scope.setKey(i, int(i%128))
		tm.RegisterEventTimeTimer(struct{}{}, i)
	}
	per := float64(heapLive()-before) / n
	goruntime.KeepAlive(tm)
	if tm.Len(EventTime) != n {
		t.Fatalf("%d timers, want %d", tm.Len(EventTime), n)
	}
	t.Logf("%.1f bytes of heap per timer", per)
	if per > 72 {
		t.Errorf("%.1f bytes of heap per timer, want at most 72", per)
	}
}
