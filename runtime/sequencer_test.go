package runtime

import (
	"reflect"
	"testing"

	"github.com/weirstream/weir/checkpoint"
)

func TestSequencerEvents(t *testing.T) {
	type ev struct {
		kind     string // trigger, aligned, complete, abort, endSource, endInputs
		id       checkpoint.ID
		final    bool
		want     []seqAction
		ended    bool // sequencer ended after the event
		describe string
	}
	snap := func(id checkpoint.ID) seqAction { return seqAction{kind: seqSnapshot, id: id} }
	done := func(id checkpoint.ID) seqAction { return seqAction{kind: seqNotify, id: id, complete: true} }
	abort := func(id checkpoint.ID) seqAction { return seqAction{kind: seqNotify, id: id} }
	end := seqAction{kind: seqEnd}
	cases := []struct {
		name   string
		events []ev
	}{
		{"snapshots in order, stale and duplicate barriers dropped", []ev{
			{kind: "aligned", id: 2, want: []seqAction{snap(2)}},
			{kind: "aligned", id: 2},
			{kind: "aligned", id: 1},
			{kind: "aligned", id: 3, want: []seqAction{snap(3)}},
		}},
		{"a completion is delivered once; one for n covers those below", []ev{
			{kind: "complete", id: 3, want: []seqAction{done(3)}},
			{kind: "complete", id: 3},
			{kind: "complete", id: 2},
			{kind: "abort", id: 4, want: []seqAction{abort(4)}},
		}},
		{"a source ends only after the final checkpoint completed", []ev{
			{kind: "trigger", id: 1, want: []seqAction{snap(1)}},
			{kind: "endSource"},
			{kind: "trigger", id: 2, want: []seqAction{snap(2)}, describe: "not final: another source still runs"},
			{kind: "complete", id: 2, want: []seqAction{done(2)}},
			{kind: "trigger", id: 3, final: true, want: []seqAction{snap(3)}},
			{kind: "abort", id: 3, want: []seqAction{abort(3)}, describe: "final checkpoint aborted: keep going"},
			{kind: "trigger", id: 4, final: true, want: []seqAction{snap(4)}},
			{kind: "complete", id: 4, want: []seqAction{done(4), end}, ended: true},
			{kind: "complete", id: 5, ended: true},
		}},
		{"a final trigger before the source ended is an ordinary one", []ev{
			{kind: "trigger", id: 1, final: true, want: []seqAction{snap(1)}},
			{kind: "endSource"},
			{kind: "complete", id: 1, want: []seqAction{done(1)}},
		}},
		{"ended inputs wait for the last snapshot to be resolved", []ev{
			{kind: "aligned", id: 5, want: []seqAction{snap(5)}},
			{kind: "endInputs"},
			{kind: "complete", id: 4, want: []seqAction{done(4)}},
			{kind: "complete", id: 5, want: []seqAction{done(5), end}, ended: true},
		}},
		{"an abort resolves the last snapshot too", []ev{
			{kind: "aligned", id: 5, want: []seqAction{snap(5)}},
			{kind: "endInputs"},
			{kind: "abort", id: 5, want: []seqAction{abort(5), end}, ended: true},
		}},
		{"no snapshot yet: ended inputs end at once", []ev{
			{kind: "endInputs", want: []seqAction{end}, ended: true},
			{kind: "aligned", id: 1, ended: true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s sequencer
			for i, e := range tc.events {
				var got []seqAction
				switch e.kind {
				case "trigger":
					got = s.trigger(e.id, e.final)
				case "aligned":
					got = s.aligned(e.id)
				case "complete":
					got = s.notify(e.id, true)
				case "abort":
					got = s.notify(e.id, false)
				case "endSource":
					got = s.endOfSource()
				case "endInputs":
					got = s.endOfInputs()
				}
				if !reflect.DeepEqual(got, e.want) {
					t.Fatalf("event %d (%s %d %s): got %+v, want %+v", i, e.kind, e.id, e.describe, got, e.want)
				}
				if s.ended != e.ended {
					t.Fatalf("event %d (%s %d): ended=%v, want %v", i, e.kind, e.id, s.ended, e.ended)
				}
			}
		})
	}
}
