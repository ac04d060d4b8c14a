package runtime

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestTimerQueueTranscripts runs the timer queue's transcripts
// (testdata/timers): register/delete/advance in, firings out, and the
// queue's content by key group after a snapshot and restore.
//
//	new
//	register kg=G owner=O ts=T   -> added | exists
//	delete owner=O ts=T          -> deleted | none
//	advance to=T                 -> the timers fired, in order
//	snapshot                     -> the encoded key groups, restored into a new queue
func TestTimerQueueTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/timers", func(t *testing.T, path string) {
		var q *timerQueue[string]
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var owner string
			var ts int64
			switch d.Cmd {
			case "new":
				q = newTimerQueue(appendStringOwner)
				return "ok"
			case "register":
				var kg int
				d.ScanArgs(t, "kg", &kg)
				d.ScanArgs(t, "owner", &owner)
				d.ScanArgs(t, "ts", &ts)
				if q.register(kg, owner, ts) {
					return "added"
				}
				return "exists"
			case "delete":
				d.ScanArgs(t, "owner", &owner)
				d.ScanArgs(t, "ts", &ts)
				if q.remove(owner, ts) {
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
						q.register(kg, "then-"+strings.TrimPrefix(id.owner, "again-"), id.ts+1)
					}
					// Or another at its own timestamp ("same-N" registers
					// "also-N"), or one earlier ("back-N" registers "prev-N" at ts-1).
					if strings.HasPrefix(id.owner, "same-") {
						q.register(kg, "also-"+strings.TrimPrefix(id.owner, "same-"), id.ts)
					}
					if strings.HasPrefix(id.owner, "back-") {
						q.register(kg, "prev-"+strings.TrimPrefix(id.owner, "back-"), id.ts-1)
					}
				}
				if b.Len() == 0 {
					return "."
				}
				return strings.TrimSuffix(b.String(), "\n")
			case "snapshot":
				byKG := q.byKeyGroup()
				restored := newTimerQueue(appendStringOwner)
				var b strings.Builder
				for kg := 0; kg < 128; kg++ {
					ids, ok := byKG[kg]
					if !ok {
						continue
					}
					blob := appendTimers(nil, appendStringOwner, ids, nil)
					if err := decodeTimers(blob, func(dom TimeDomain, owner string, ts int64) {
						restored.register(kg, owner, ts)
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

// appendStringOwner encodes a transcript's owner as its bytes.
func appendStringOwner(dst []byte, o string) []byte { return append(dst, o...) }
