package runtime

import (
	"strings"
	"testing"
	"unsafe"
)

// within reports whether s's bytes lie in those of outer.
func within(s, outer string) bool {
	p, lo := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.StringData(outer)))
	return p >= lo && p < lo+uintptr(len(outer))
}

func sameBytes(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// A string key's state keeps a copy of the key, not the record's string
// (a word sliced out of its line would keep the line alive as long as the
// word has state), and the key's timers and later records share that copy.
func TestHeapStateKeepsItsOwnCopyOfAStringKeyAndTimersShareIt(t *testing.T) {
	const maxPar = 8
	kb := newKeyedBackend[string](StringCodec(), maxPar)
	r := &StateRegistry[string]{b: kb}
	v, err := NewValueState[int64](r, "count", Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	tm, err := NewTimers[struct{}](r, "", Codec[struct{}](voidCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Repeat("x", 100) + " beta gamma"
	word := line[101:105]
	kg := int(hashString(word) % maxPar)

	kb.scope.setKey(word, kg)
	v.Update(1)
	stored := kb.scope.key
	if stored != word {
		t.Fatalf("the scope's key is %q after the first update, want %q", stored, word)
	}
	if within(stored, line) {
		t.Fatalf("the state keeps the key %q in its record's line", stored)
	}
	tm.RegisterEventTimeTimer(struct{}{}, 10)

	// The same word from another record: found, and the scope takes the
	// stored copy.
	again := strings.Clone(word)
	kb.scope.setKey(again, kg)
	if n, ok := v.Value(); !ok || n != 1 {
		t.Fatalf("Value() = %d, %v; want 1, true", n, ok)
	}
	if !sameBytes(kb.scope.key, stored) || kb.scope.key != again {
		t.Fatalf("after a lookup the scope's key is not the stored copy")
	}
	tm.RegisterEventTimeTimer(struct{}{}, 20)

	live := tm.q[EventTime-1].(heapTimers[timerOwner[string, struct{}]]).q.live()
	if len(live) != 2 {
		t.Fatalf("%d timers, want 2", len(live))
	}
	for _, e := range live {
		if !sameBytes(e.id.owner.key, stored) {
			t.Errorf("the timer at %d keeps its own copy of the key, not the state's", e.id.ts)
		}
	}
}
