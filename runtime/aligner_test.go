package runtime

import (
	"testing"

	"github.com/weirstream/weir/checkpoint"
)

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
