package runtime

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestTimerQueueTranscripts runs the timer queue's transcripts
// (testdata/timers): register/delete/advance in, firings out, and the
// queue's content by key group after a snapshot and restore; on every
// backend's timer store (the heap's timerQueue, pebble), with the same
// transcripts.
//
//	new
//	register kg=G owner=O ts=T   -> added | exists
//	delete owner=O ts=T          -> deleted | none
//	advance to=T                 -> the timers fired, in order
//	snapshot                     -> the encoded key groups, restored into a new queue
func TestTimerQueueTranscripts(t *testing.T) {
	for _, kind := range []StateBackendKind{HeapState, PebbleState} {
		t.Run(string(kind), func(t *testing.T) { testTimerStoreTranscripts(t, kind) })
	}
}

func testTimerStoreTranscripts(t *testing.T, kind StateBackendKind) {
	newStore := func(t *testing.T) timerStore {
		if kind == PebbleState {
			return newPebbleTimers(testPebbleState(t, 128), "t")
		}
		return heapTimers{newTimerQueue()}
	}
	datadriven.Walk(t, "testdata/timers", func(t *testing.T, path string) {
		var q timerStore
		kgOf := map[timerID]int{} // the transcripts delete without a key group
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var owner string
			var ts int64
			switch d.Cmd {
			case "new":
				q = newStore(t)
				clear(kgOf)
				return "ok"
			case "register":
				var kg int
				d.ScanArgs(t, "kg", &kg)
				d.ScanArgs(t, "owner", &owner)
				d.ScanArgs(t, "ts", &ts)
				if q.register(kg, owner, ts) {
					kgOf[timerID{ts, owner}] = kg
					return "added"
				}
				return "exists"
			case "delete":
				d.ScanArgs(t, "owner", &owner)
				d.ScanArgs(t, "ts", &ts)
				if q.remove(kgOf[timerID{ts, owner}], owner, ts) {
					return "deleted"
				}
				return "none"
			case "advance":
				var to string
				d.ScanArgs(t, "to", &to)
				upTo := parseTS(t, d, to)
				var b strings.Builder
				for {
					id, kg, ok := q.next(upTo)
					if !ok {
						break
					}
					fmt.Fprintf(&b, "fire kg=%d owner=%s ts=%d\n", kg, id.owner, id.ts)
					// A timer may register another at or before upTo: it fires in
					// the same advance (owner "again-N" registers "then-N" at ts+1).
					if strings.HasPrefix(id.owner, "again-") {
						then := "then-" + strings.TrimPrefix(id.owner, "again-")
						q.register(kg, then, id.ts+1)
						kgOf[timerID{id.ts + 1, then}] = kg
					}
				}
				if b.Len() == 0 {
					return "."
				}
				return strings.TrimSuffix(b.String(), "\n")
			case "snapshot":
				byKG, err := q.snapshot()()
				if err != nil {
					d.Fatalf(t, "snapshot: %v", err)
				}
				restored := newStore(t)
				var b strings.Builder
				for kg := 0; kg < 128; kg++ {
					ids, ok := byKG[kg]
					if !ok {
						continue
					}
					blob := appendTimers(nil, ids, nil)
					if err := decodeTimers(blob, func(dom TimeDomain, owner string, ts int64) {
						if err := restored.restored(kg, owner, ts); err != nil {
							d.Fatalf(t, "restore: %v", err)
						}
					}); err != nil {
						d.Fatalf(t, "decode: %v", err)
					}
					fmt.Fprintf(&b, "kg=%d:", kg)
					for _, id := range ids {
						fmt.Fprintf(&b, " %s@%d", id.owner, id.ts)
					}
					b.WriteByte('\n')
				}
				q = restored
				if b.Len() == 0 {
					return "empty"
				}
				return strings.TrimSuffix(b.String(), "\n")
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}
