package runtime

import (
	"encoding/binary"
	"fmt"
	"slices"
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
	newStore := func(t *testing.T) timerStore[string] {
		if kind == PebbleState {
			return newEncodedTimers(newPebbleTimers(testPebbleState(t, 128), "t", pebbleKindEventTimers), appendStringOwner, decodeStringOwner)
		}
		return heapTimers[string]{newTimerQueue(appendStringOwner)}
	}
	datadriven.Walk(t, "testdata/timers", func(t *testing.T, path string) {
		var q timerStore[string]
		kgOf := map[timerID[string]]int{} // the transcripts delete without a key group
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
					kgOf[timerID[string]{ts, owner}] = kg
					return "added"
				}
				return "exists"
			case "delete":
				d.ScanArgs(t, "owner", &owner)
				d.ScanArgs(t, "ts", &ts)
				if q.remove(kgOf[timerID[string]{ts, owner}], owner, ts) {
					return "deleted"
				}
				return "none"
			case "advance":
				var to string
				d.ScanArgs(t, "to", &to)
				upTo := parseTS(t, d, to)
				var b strings.Builder
				for {
					id, kg, ok, err := q.next(upTo)
					if err != nil {
						d.Fatalf(t, "next: %v", err)
					}
					if !ok {
						break
					}
					fmt.Fprintf(&b, "fire kg=%d owner=%s ts=%d\n", kg, id.owner, id.ts)
					// A timer may register another at or before upTo: it fires in
					// the same advance (owner "again-N" registers "then-N" at ts+1).
					if strings.HasPrefix(id.owner, "again-") {
						then := "then-" + strings.TrimPrefix(id.owner, "again-")
						q.register(kg, then, id.ts+1)
						kgOf[timerID[string]{id.ts + 1, then}] = kg
					}
					// Or another at its own timestamp ("same-N" registers
					// "also-N"), or one earlier ("back-N" registers "prev-N" at ts-1).
					if strings.HasPrefix(id.owner, "same-") {
						also := "also-" + strings.TrimPrefix(id.owner, "same-")
						q.register(kg, also, id.ts)
						kgOf[timerID[string]{id.ts, also}] = kg
					}
					if strings.HasPrefix(id.owner, "back-") {
						prev := "prev-" + strings.TrimPrefix(id.owner, "back-")
						q.register(kg, prev, id.ts-1)
						kgOf[timerID[string]{id.ts - 1, prev}] = kg
					}
				}
				if b.Len() == 0 {
					return "."
				}
				return strings.TrimSuffix(b.String(), "\n")
			case "snapshot":
				frozen := q.snapshot(appendStringOwner)
				kgs, err := frozen.keyGroups()
				if err != nil {
					d.Fatalf(t, "snapshot: %v", err)
				}
				slices.Sort(kgs)
				restored := newStore(t)
				var b strings.Builder
				for _, kg := range kgs {
					entries, n, err := frozen.appendKeyGroup(nil, kg, EventTime)
					if err != nil {
						d.Fatalf(t, "snapshot key group %d: %v", kg, err)
					}
					blob := append(binary.AppendUvarint(nil, uint64(n)), entries...)
					fmt.Fprintf(&b, "kg=%d:", kg)
					if err := decodeTimers(blob, func(dom TimeDomain, owner string, ts int64) {
						if err := restored.restored(kg, owner, ts); err != nil {
							d.Fatalf(t, "restore: %v", err)
						}
						fmt.Fprintf(&b, " %s@%d", owner, ts)
					}); err != nil {
						d.Fatalf(t, "decode: %v", err)
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

// appendStringOwner encodes a transcript's owner as its bytes.
func appendStringOwner(dst []byte, o string) []byte { return append(dst, o...) }

// decodeStringOwner decodes what appendStringOwner encoded.
func decodeStringOwner(b []byte) (string, error) { return string(b), nil }

// frozenTimerBlobs encodes every key group of f (event-time timers).
func frozenTimerBlobs(f frozenTimers) (map[int][]byte, error) {
	kgs, err := f.keyGroups()
	if err != nil {
		return nil, err
	}
	out := make(map[int][]byte, len(kgs))
	for _, kg := range kgs {
		if out[kg], _, err = f.appendKeyGroup(nil, kg, EventTime); err != nil {
			return nil, err
		}
	}
	return out, nil
}
