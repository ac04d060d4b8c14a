package runtime

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// A snapshot's timers are grouped by key group and sorted by timestamp and
// then by the owner's encoding, encoding each owner once: not twice per
// comparison (16 encodings per timer of 4000 before: 8% of
// window-wordcount's CPU, in its checkpoints every 100 ms), nor once to
// sort and again to write (2 per timer before: the sort was two thirds
// of Nexmark q5's snapshot encoding).
func TestTimerSnapshotEncodesEachOwnerOnce(t *testing.T) {
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
	f := &frozenHeapTimers[int64]{live: ts, enc: enc}
	kgs, err := f.keyGroups()
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, kg := range kgs {
		b, k, err := f.appendKeyGroup(nil, kg, EventTime)
		if err != nil {
			t.Fatal(err)
		}
		var prev []byte
		var prevTS int64
		err = decodeTimers(append(binary.AppendUvarint(nil, uint64(k)), b...), func(d TimeDomain, owner string, ts int64) {
			if d != EventTime {
				t.Fatalf("key group %d: timer of domain %v", kg, d)
			}
			if prev != nil && (prevTS > ts || prevTS == ts && bytes.Compare(prev, []byte(owner)) >= 0) {
				t.Fatalf("key group %d: timer (%d, %x) after (%d, %x)", kg, ts, owner, prevTS, prev)
			}
			prev, prevTS = []byte(owner), ts
			got++
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if calls != n {
		t.Errorf("%d owner encodings for %d timers, want %d", calls, n, n)
	}
	if got != n {
		t.Fatalf("%d timers encoded, want %d", got, n)
	}
}
