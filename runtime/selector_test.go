package runtime

import (
	"testing"

	"github.com/weirstream/weir/checkpoint"
)

// newSelectorTask is a task with n inputs and nothing else, for the
// selector alone.
func newSelectorTask(n int) *task {
	t := &task{ctrl: make(chan control, 1), aligner: newAligner(n)}
	for range n {
		t.inputs = append(t.inputs, inputChan{ch: make(chan envelope, 4)})
	}
	return t
}

// A task's selector receives a batch or mark without allocating (it used
// reflect.Select, which boxed every envelope), whatever its number of
// inputs up to staticInputs.
func TestSelectorReceivesWithoutAllocating(t *testing.T) {
	for _, n := range []int{2, 3, staticInputs} {
		tk := newSelectorTask(n)
		sel := newSelector(tk)
		last := n - 1
		allocs := testing.AllocsPerRun(200, func() {
			tk.inputs[last].ch <- envelope{mark: markWatermark, wm: 7}
			idx, e, _, err := sel.next(t.Context())
			if err != nil || idx != last || e.wm != 7 {
				t.Fatalf("%d inputs: next = %d, %+v, %v; want input %d's watermark 7", n, idx, e, err, last)
			}
		})
		if allocs != 0 {
			t.Errorf("%d inputs: %.1f allocations per envelope received, want 0", n, allocs)
		}
	}
}

// The selector does not read an input blocked for alignment or ended, and
// reads it again once released, with any number of inputs (the reflective
// select above staticInputs).
func TestSelectorSkipsBlockedAndEndedInputs(t *testing.T) {
	for _, n := range []int{3, staticInputs, staticInputs + 2} {
		tk := newSelectorTask(n)
		sel := newSelector(tk)
		tk.aligner.onBarrier(0, checkpoint.ID(1)) // input 0 blocked until every input brought barrier 1
		tk.aligner.onEnd(n - 1)                   // the last input ended
		sel.update()
		tk.inputs[0].ch <- envelope{mark: markWatermark, wm: 1}
		tk.inputs[n-1].ch <- envelope{mark: markWatermark, wm: 2}
		tk.inputs[1].ch <- envelope{mark: markWatermark, wm: 3}
		if idx, e, _, err := sel.next(t.Context()); err != nil || idx != 1 || e.wm != 3 {
			t.Fatalf("%d inputs: next = %d, %+v, %v; want input 1 (0 is blocked, %d ended)", n, idx, e, err, n-1)
		}
		tk.ctrl <- control{kind: ctrlComplete, id: 1}
		if idx, _, c, err := sel.next(t.Context()); err != nil || idx != -1 || c.id != 1 {
			t.Fatalf("%d inputs: next = %d, %+v, %v; want the control message (0 blocked, %d ended, 1 empty)", n, idx, c, err, n-1)
		}
		for i := 1; i < n-1; i++ {
			tk.aligner.onBarrier(i, checkpoint.ID(1))
		}
		sel.update()
		if idx, e, _, err := sel.next(t.Context()); err != nil || idx != 0 || e.wm != 1 {
			t.Fatalf("%d inputs: next = %d, %+v, %v; want input 0 once aligned", n, idx, e, err)
		}
	}
}
