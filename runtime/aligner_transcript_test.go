package runtime

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/weirstream/weir/checkpoint"
)

// TestAlignerTranscripts replays testdata/aligner: barrier and end-of-input
// events in, alignment actions out (docs/architecture.md, "Checkpoints").
// Commands:
//
//	new inputs=n           a fresh aligner of n inputs
//	barrier in=i id=n      barrier n arrives on input i
//	end in=i               input i ended
//
// Each event prints its actions, one per line ("-" for none), then the
// inputs held back ("blocked: 0,2" or "blocked: none").
func TestAlignerTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/aligner", func(t *testing.T, path string) {
		var a *aligner
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				var n int
				d.ScanArgs(t, "inputs", &n)
				a = newAligner(n)
				return "ok"
			}
			if a == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			var in int
			d.ScanArgs(t, "in", &in)
			var acts []alignAction
			switch d.Cmd {
			case "barrier":
				var id uint64
				d.ScanArgs(t, "id", &id)
				acts = a.onBarrier(in, checkpoint.ID(id))
			case "end":
				acts = a.onEnd(in)
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			return formatAlignment(a, acts)
		})
	})
}

func formatAlignment(a *aligner, acts []alignAction) string {
	var b strings.Builder
	if len(acts) == 0 {
		b.WriteString("-\n")
	}
	for _, act := range acts {
		switch act.Kind {
		case alignBlock:
			fmt.Fprintf(&b, "block in=%d id=%d\n", act.Input, act.ID)
		case alignSnapshot:
			fmt.Fprintf(&b, "snapshot id=%d\n", act.ID)
		case alignAbort:
			fmt.Fprintf(&b, "abort id=%d\n", act.ID)
		case alignDecline:
			fmt.Fprintf(&b, "decline id=%d\n", act.ID)
		default:
			fmt.Fprintf(&b, "unknown %+v\n", act)
		}
	}
	var blocked []string
	for i := range a.arrived {
		if a.blocked(i) {
			blocked = append(blocked, fmt.Sprint(i))
		}
	}
	if len(blocked) == 0 {
		blocked = []string{"none"}
	}
	fmt.Fprintf(&b, "blocked: %s\n", strings.Join(blocked, ","))
	return b.String()
}
