package runtime

import "github.com/weirstream/weir/checkpoint"

// seqAction is what the task must do after feeding the sequencer an event.
type seqAction struct {
	kind     seqKind
	id       checkpoint.ID
	complete bool // for seqNotify
}

type seqKind int

const (
	// seqSnapshot: snapshot every operator for checkpoint id, forward the
	// barrier, acknowledge (or decline).
	seqSnapshot seqKind = iota + 1
	// seqNotify: deliver completion (complete) or abort of id to every
	// operator, tail first.
	seqNotify
	// seqEnd: end the output streams; the task is done.
	seqEnd
)

// sequencer is the per-task checkpoint logic as a pure state machine,
// beside the aligner: it orders snapshots, drops stale and duplicate
// barriers and notifications, and decides when a finished task may end its
// stream. It holds no channels and no operators; the task loop executes its
// actions.
//
// Ending is what keeps exactly-once at the end of a bounded job: a source
// that ran out of input ends its stream only once a checkpoint triggered
// after every source ended (final) has completed; a task whose inputs all
// ended ends its stream only once its last snapshot was resolved (completed
// or aborted), so a sink never closes with its last transaction
// uncommitted.
type sequencer struct {
	lastSnapshot  checkpoint.ID
	lastCompleted checkpoint.ID // highest id notified complete
	lastResolved  checkpoint.ID // highest id notified complete or aborted
	finalID       checkpoint.ID // a source's final checkpoint
	sourceEnded   bool
	inputsEnded   bool
	ended         bool
}

// trigger feeds a source's checkpoint trigger; final marks a trigger sent
// after every source of the job ended.
func (s *sequencer) trigger(id checkpoint.ID, final bool) []seqAction {
	if final && s.sourceEnded && s.finalID == 0 && id > s.lastSnapshot {
		s.finalID = id
	}
	return s.aligned(id)
}

// aligned feeds barrier id, aligned on every input (or injected at a source).
func (s *sequencer) aligned(id checkpoint.ID) []seqAction {
	if s.ended || id <= s.lastSnapshot {
		return nil
	}
	s.lastSnapshot = id
	return []seqAction{{kind: seqSnapshot, id: id}}
}

// notify feeds a completion or abort of checkpoint id.
func (s *sequencer) notify(id checkpoint.ID, complete bool) []seqAction {
	if s.ended || (complete && id <= s.lastCompleted) {
		return nil
	}
	acts := []seqAction{{kind: seqNotify, id: id, complete: complete}}
	if complete {
		s.lastCompleted = id
	}
	s.lastResolved = max(s.lastResolved, id)
	return append(acts, s.maybeEnd()...)
}

// endOfSource feeds a source running out of input.
func (s *sequencer) endOfSource() []seqAction {
	s.sourceEnded = true
	return nil
}

// endOfInputs feeds the end of every input of a non-source task.
func (s *sequencer) endOfInputs() []seqAction {
	s.inputsEnded = true
	return s.maybeEnd()
}

func (s *sequencer) maybeEnd() []seqAction {
	switch {
	case s.ended:
		return nil
	case s.finalID != 0 && s.lastCompleted >= s.finalID,
		s.inputsEnded && s.lastResolved >= s.lastSnapshot:
		s.ended = true
		return []seqAction{{kind: seqEnd}}
	}
	return nil
}
