package runtime

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestSplitFrontierTranscripts replays testdata/frontier: readings of a
// share group's split frontiers and the clock in, the subtask's watermark
// and the splits to pause out (docs/internals/event-time.md, "Watermarks
// from a share group"). Records are their own event time (ms); the
// generator is bounded out-of-orderness. Commands:
//
//	new bound=ms idleness=dur drift=dur   a fresh rule
//	read at=dur                           a reading, one split a line:
//	                                      "p0 pending 12 1000" (earliest unfinished record: offset, ts),
//	                                      "p0 pending ?" (one exists, unreadable),
//	                                      "p0 done 39 2100 40 2000" (all finished; its last records), "p0 done"
//	tick at=dur                           the clock alone
//
// Each prints the watermark and its state, then the splits ahead (paused)
// when the set changed.
func TestSplitFrontierTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/frontier", func(t *testing.T, path string) {
		var m *splitWatermarks[int64]
		var version int64
		t0 := time.Unix(1_000_000, 0)
		at := func(d *datadriven.TestData) time.Time {
			var s string
			d.ScanArgs(t, "at", &s)
			dur, err := time.ParseDuration(s)
			if err != nil {
				d.Fatalf(t, "at: %v", err)
			}
			return t0.Add(dur)
		}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "new":
				var bound int
				var idle, drift string
				d.ScanArgs(t, "bound", &bound)
				d.ScanArgs(t, "idleness", &idle)
				d.ScanArgs(t, "drift", &drift)
				id, err1 := time.ParseDuration(idle)
				dr, err2 := time.ParseDuration(drift)
				if err1 != nil || err2 != nil {
					d.Fatalf(t, "durations: %v %v", err1, err2)
				}
				ws := ForBoundedOutOfOrderness[int64](time.Duration(bound) * time.Millisecond)
				m = newSplitWatermarks(ws.newGen, func(v, _ int64) int64 { return v }, id, dr)
				version = 0
				return "ok"
			case "read":
				now := at(d)
				var fs []Frontier[int64]
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					f := strings.Fields(line)
					if len(f) < 2 {
						d.Fatalf(t, "bad split line %q", line)
					}
					fr := Frontier[int64]{Split: f[0], Pending: f[1] == "pending"}
					for i := 2; i+1 < len(f); i += 2 {
						off, _ := strconv.ParseInt(f[i], 10, 64)
						ts, _ := strconv.ParseInt(f[i+1], 10, 64)
						fr.Records = append(fr.Records, FrontierRecord[int64]{Offset: off, Value: ts, Timestamp: ts})
					}
					fs = append(fs, fr)
				}
				version++
				m.read(now, version, fs)
				return formatFrontier(m, now)
			case "tick":
				return formatFrontier(m, at(d))
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func formatFrontier(m *splitWatermarks[int64], now time.Time) string {
	wm, st := m.watermark(now)
	var b strings.Builder
	switch wm {
	case MinWatermark:
		fmt.Fprintf(&b, "watermark min (%s)\n", st)
	default:
		fmt.Fprintf(&b, "watermark %d (%s)\n", wm, st)
	}
	if ahead, changed := m.alignment(now, wm); changed {
		if len(ahead) == 0 {
			ahead = []string{"none"}
		}
		fmt.Fprintf(&b, "pause %s\n", strings.Join(ahead, ","))
	}
	return b.String()
}
