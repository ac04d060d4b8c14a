package runtime

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestWatermarkValveTranscripts runs the valve's transcripts
// (testdata/valve): events in, the actions the task must forward out.
//
//	new channels=N
//	watermark ch=I ts=T | idle ch=I | active ch=I | ended ch=I
func TestWatermarkValveTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/valve", func(t *testing.T, path string) {
		var v *watermarkValve
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				var n int
				d.ScanArgs(t, "channels", &n)
				v = newWatermarkValve(n)
				return "ok"
			}
			var ch int
			d.ScanArgs(t, "ch", &ch)
			var acts []valveAction
			switch d.Cmd {
			case "watermark":
				var ts string
				d.ScanArgs(t, "ts", &ts)
				acts = v.watermark(ch, parseTS(t, d, ts))
			case "idle":
				acts = v.idleChannel(ch)
			case "active":
				acts = v.active(ch)
			case "ended":
				acts = v.ended(ch)
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			return formatValveActions(acts)
		})
	})
}

func formatValveActions(acts []valveAction) string {
	if len(acts) == 0 {
		return "."
	}
	var b strings.Builder
	for _, a := range acts {
		switch a.Kind {
		case markWatermark:
			fmt.Fprintf(&b, "emit watermark %s\n", formatTS(a.TS))
		default:
			fmt.Fprintf(&b, "emit %s\n", a.Kind)
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func parseTS(t *testing.T, d *datadriven.TestData, s string) int64 {
	switch s {
	case "max":
		return MaxWatermark
	case "min":
		return MinWatermark
	}
	var ts int64
	if _, err := fmt.Sscan(s, &ts); err != nil {
		d.Fatalf(t, "timestamp %q: %v", s, err)
	}
	return ts
}

func formatTS(ts int64) string {
	switch ts {
	case MaxWatermark:
		return "max"
	case MinWatermark:
		return "min"
	}
	return fmt.Sprint(ts)
}
