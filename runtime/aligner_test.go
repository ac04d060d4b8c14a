package runtime

import (
	"reflect"
	"testing"

	"github.com/weirstream/weir/checkpoint"
)

func TestAlignerEvents(t *testing.T) {
	type ev struct {
		end     bool
		input   int
		id      checkpoint.ID
		want    []alignAction
		blocked []bool // after the event
	}
	snap := func(id checkpoint.ID) alignAction { return alignAction{Kind: alignSnapshot, ID: id} }
	block := func(i int, id checkpoint.ID) alignAction { return alignAction{Kind: alignBlock, Input: i, ID: id} }
	abort := func(id checkpoint.ID) alignAction { return alignAction{Kind: alignAbort, ID: id} }
	cases := []struct {
		name   string
		inputs int
		events []ev
	}{
		{"single input snapshots at once", 1, []ev{
			{input: 0, id: 1, want: []alignAction{snap(1)}, blocked: []bool{false}},
			{input: 0, id: 2, want: []alignAction{snap(2)}, blocked: []bool{false}},
		}},
		{"two inputs block the first until the second arrives", 2, []ev{
			{input: 1, id: 1, want: []alignAction{block(1, 1)}, blocked: []bool{false, true}},
			{input: 0, id: 1, want: []alignAction{snap(1)}, blocked: []bool{false, false}},
		}},
		{"three inputs", 3, []ev{
			{input: 0, id: 4, want: []alignAction{block(0, 4)}, blocked: []bool{true, false, false}},
			{input: 2, id: 4, want: []alignAction{block(2, 4)}, blocked: []bool{true, false, true}},
			{input: 1, id: 4, want: []alignAction{snap(4)}, blocked: []bool{false, false, false}},
		}},
		{"newer barrier aborts the older alignment", 2, []ev{
			{input: 0, id: 1, want: []alignAction{block(0, 1)}, blocked: []bool{true, false}},
			{input: 1, id: 2, want: []alignAction{abort(1), block(1, 2)}, blocked: []bool{false, true}},
			{input: 0, id: 2, want: []alignAction{snap(2)}, blocked: []bool{false, false}},
			{input: 1, id: 1, want: nil, blocked: []bool{false, false}},
		}},
		{"stale barrier is ignored", 2, []ev{
			{input: 0, id: 3, want: []alignAction{block(0, 3)}},
			{input: 1, id: 3, want: []alignAction{snap(3)}},
			{input: 0, id: 2, want: nil, blocked: []bool{false, false}},
			{input: 1, id: 3, want: nil, blocked: []bool{false, false}},
		}},
		{"older barrier during an alignment is declined once", 3, []ev{
			{input: 0, id: 5, want: []alignAction{block(0, 5)}, blocked: []bool{true, false, false}},
			{input: 1, id: 4, want: []alignAction{{Kind: alignDecline, ID: 4}}, blocked: []bool{true, false, false}},
			{input: 2, id: 4, want: nil, blocked: []bool{true, false, false}},
			{input: 1, id: 5, want: []alignAction{block(1, 5)}, blocked: []bool{true, true, false}},
			{input: 2, id: 5, want: []alignAction{snap(5)}, blocked: []bool{false, false, false}},
			{input: 0, id: 4, want: nil, blocked: []bool{false, false, false}},
		}},
		{"ended input completes a waiting alignment", 2, []ev{
			{input: 0, id: 1, want: []alignAction{block(0, 1)}},
			{end: true, input: 1, want: []alignAction{snap(1)}, blocked: []bool{false, false}},
			{input: 0, id: 2, want: []alignAction{snap(2)}},
		}},
		{"end while idle does nothing", 2, []ev{
			{end: true, input: 0, want: nil},
			{input: 1, id: 1, want: []alignAction{snap(1)}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newAligner(tc.inputs)
			for i, e := range tc.events {
				var got []alignAction
				if e.end {
					got = a.onEnd(e.input)
				} else {
					got = a.onBarrier(e.input, e.id)
				}
				if !reflect.DeepEqual(got, e.want) {
					t.Fatalf("event %d: got %+v, want %+v", i, got, e.want)
				}
				for in, b := range e.blocked {
					if a.blocked(in) != b {
						t.Fatalf("event %d: input %d blocked=%v, want %v", i, in, a.blocked(in), b)
					}
				}
			}
		})
	}
}

// TestAlignerNeverSnapshotsTwice feeds random interleavings of per-input FIFO
// barrier streams and checks each id is snapshotted at most once, in
// increasing order, and only once every live input delivered it.
func TestAlignerNeverSnapshotsTwice(t *testing.T) {
	for seed := int64(0); seed < 200; seed++ {
		r := newRand(seed)
		inputs := 1 + r.Intn(4)
		a := newAligner(inputs)
		next := make([]checkpoint.ID, inputs) // next barrier each input delivers
		for i := range next {
			next[i] = 1
		}
		var last checkpoint.ID
		for step := 0; step < 100; step++ {
			in := r.Intn(inputs)
			if a.blocked(in) {
				continue
			}
			id := next[in]
			next[in]++
			if r.Intn(5) == 0 {
				next[in]++ // this input skips a checkpoint (its source declined)
			}
			for _, act := range a.onBarrier(in, id) {
				if act.Kind == alignSnapshot {
					if act.ID <= last {
						t.Fatalf("seed %d: snapshot %d after %d", seed, act.ID, last)
					}
					last = act.ID
				}
			}
		}
	}
}
