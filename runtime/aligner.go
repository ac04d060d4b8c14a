package runtime

import "github.com/weirstream/weir/checkpoint"

// alignKind says what the task must do after feeding the aligner an event.
type alignKind int

const (
	// alignBlock: stop reading Input until the alignment ends.
	alignBlock alignKind = iota + 1
	// alignSnapshot: every live input delivered barrier ID: unblock all
	// inputs, snapshot, forward the barrier, acknowledge.
	alignSnapshot
	// alignAbort: the alignment of ID was overtaken by a newer barrier:
	// unblock all inputs and decline ID.
	alignAbort
	// alignDecline: barrier ID is older than the one being aligned (its
	// checkpoint can no longer complete here): decline ID, keep aligning.
	alignDecline
)

type alignAction struct {
	Kind  alignKind
	Input int
	ID    checkpoint.ID
}

// aligner is the barrier alignment of one task with n inputs, as a pure state
// machine: events in (a barrier or the end of an input), actions out. It holds
// no channels and no clock; the task loop executes the actions.
//
// After barrier n arrives on input i, i is blocked until barrier n has arrived
// on every input that has not ended. A barrier newer than the one being
// aligned aborts the older alignment (its checkpoint can no longer complete
// consistently) and starts the new one; a barrier older than the one being
// aligned is declined once (so its checkpoint aborts at once instead of
// waiting for its timeout); barriers at or below the last snapshotted id are
// stale and ignored.
type aligner struct {
	ended    []bool
	arrived  []bool
	pending  checkpoint.ID // being aligned; 0 = none
	last     checkpoint.ID // last snapshotted or aborted
	declined map[checkpoint.ID]bool
}

func newAligner(inputs int) *aligner {
	return &aligner{ended: make([]bool, inputs), arrived: make([]bool, inputs), declined: map[checkpoint.ID]bool{}}
}

// blocked reports whether input i is held back.
func (a *aligner) blocked(i int) bool { return a.pending != 0 && a.arrived[i] }

// onBarrier feeds barrier id arriving on input.
func (a *aligner) onBarrier(input int, id checkpoint.ID) []alignAction {
	if id <= a.last || a.declined[id] {
		return nil
	}
	if a.pending != 0 && id < a.pending {
		a.declined[id] = true
		return []alignAction{{Kind: alignDecline, ID: id}}
	}
	var acts []alignAction
	if a.pending != 0 && id > a.pending {
		acts = append(acts, alignAction{Kind: alignAbort, ID: a.pending})
		a.last = a.pending
		a.reset()
	}
	a.pending = id
	a.arrived[input] = true
	if done := a.maybeComplete(); done != nil {
		return append(acts, *done)
	}
	return append(acts, alignAction{Kind: alignBlock, Input: input, ID: id})
}

// onEnd feeds the end of input: it no longer takes part in alignment.
func (a *aligner) onEnd(input int) []alignAction {
	a.ended[input] = true
	if a.pending == 0 {
		return nil
	}
	if done := a.maybeComplete(); done != nil {
		return []alignAction{*done}
	}
	return nil
}

// live reports how many inputs have not ended.
func (a *aligner) live() int {
	n := 0
	for _, e := range a.ended {
		if !e {
			n++
		}
	}
	return n
}

func (a *aligner) maybeComplete() *alignAction {
	for i := range a.arrived {
		if !a.arrived[i] && !a.ended[i] {
			return nil
		}
	}
	act := &alignAction{Kind: alignSnapshot, ID: a.pending}
	a.last = a.pending
	a.reset()
	return act
}

func (a *aligner) reset() {
	for id := range a.declined {
		if id <= a.last {
			delete(a.declined, id)
		}
	}
	a.pending = 0
	for i := range a.arrived {
		a.arrived[i] = false
	}
}
