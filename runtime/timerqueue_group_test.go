package runtime

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// A snapshot's timers are grouped by key group and sorted by timestamp and
// then by the owner's encoding, encoding each owner once: not twice per
// comparison (16 encodings per timer of 4000 before: 8% of
// window-wordcount's CPU, in its checkpoints every 100 ms).
func TestGroupTimersEncodesEachOwnerOnce(t *testing.T) {
	const n = 4000
	var ts []kgTimer[int64]
	for i := range int64(n) {
		// Owners in reverse order, four timestamps, two key groups.
		ts = append(ts, kgTimer[int64]{id: timerID[int64]{ts: i % 4, owner: n - i}, kg: int32(i % 2)})
	}
	calls := 0
	enc := func(dst []byte, o int64) []byte {
		calls++
		return binary.BigEndian.AppendUint64(dst, uint64(o))
	}
	groups := groupTimers(ts, enc)
	if calls != n {
		t.Errorf("%d owner encodings for %d timers, want %d", calls, n, n)
	}
	got := 0
	for kg, ids := range groups {
		for i, id := range ids {
			if i == 0 {
				continue
			}
			p := ids[i-1]
			a, b := enc(nil, p.owner), enc(nil, id.owner)
			if p.ts > id.ts || p.ts == id.ts && bytes.Compare(a, b) >= 0 {
				t.Fatalf("key group %d: timer %v after %v", kg, id, p)
			}
		}
		got += len(ids)
	}
	if got != n {
		t.Fatalf("%d timers grouped, want %d", got, n)
	}
}
