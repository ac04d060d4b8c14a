package runtime

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/weirstream/weir/checkpoint"
)

// TestSequencerTranscripts replays testdata/sequencer: a task's checkpoint
// events in, what the task must do out (docs/architecture.md,
// "Checkpoints"). Commands:
//
//	new                          a fresh sequencer
//	trigger id=n [final]         a source's trigger (final: after every source ended)
//	aligned id=n                 barrier n aligned on every input
//	complete id=n / abort id=n   the checkpoint's notification
//	end-source                   the source ran out of input
//	end-inputs                   every input of the task ended
//
// Each event prints its actions, one per line ("-" for none), and "ended"
// once the task may end its stream.
func TestSequencerTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/sequencer", func(t *testing.T, path string) {
		var s *sequencer
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				s = &sequencer{}
				return "ok"
			}
			if s == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			id := func() checkpoint.ID {
				var n uint64
				d.ScanArgs(t, "id", &n)
				return checkpoint.ID(n)
			}
			var acts []seqAction
			switch d.Cmd {
			case "trigger":
				acts = s.trigger(id(), d.HasArg("final"))
			case "aligned":
				acts = s.aligned(id())
			case "complete":
				acts = s.notify(id(), true)
			case "abort":
				acts = s.notify(id(), false)
			case "end-source":
				acts = s.endOfSource()
			case "end-inputs":
				acts = s.endOfInputs()
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			return formatSequence(s, acts)
		})
	})
}

func formatSequence(s *sequencer, acts []seqAction) string {
	var b strings.Builder
	if len(acts) == 0 {
		b.WriteString("-\n")
	}
	for _, a := range acts {
		switch {
		case a.kind == seqSnapshot:
			fmt.Fprintf(&b, "snapshot id=%d\n", a.id)
		case a.kind == seqNotify && a.complete:
			fmt.Fprintf(&b, "notify-complete id=%d\n", a.id)
		case a.kind == seqNotify:
			fmt.Fprintf(&b, "notify-abort id=%d\n", a.id)
		case a.kind == seqEnd:
			b.WriteString("end-stream\n")
		default:
			fmt.Fprintf(&b, "unknown %+v\n", a)
		}
	}
	if s.ended {
		b.WriteString("ended\n")
	}
	return b.String()
}
