package runtime

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/weirstream/weir/checkpoint"
)

// SliceSource is a bounded, replayable source over items, like Flink's
// fromElements: subtask i of p emits items i, i+p, i+2p, ... and snapshots
// its position, so a restored job resumes exactly where its checkpoint was
// taken. perPoll records are emitted per Poll (0: 256).
//
// Its state is one entry per arithmetic progression of items still to emit
// (next index and step), so it can be restored at any parallelism: the
// progressions are dealt to the new subtasks, and each subtask emits its
// progressions one after another.
func SliceSource[T any](items []T, perPoll int) func() Source[T] {
	if perPoll <= 0 {
		perPoll = 256
	}
	return func() Source[T] { return &sliceSource[T]{items: items, perPoll: perPoll} }
}

type sliceSource[T any] struct {
	items   []T
	perPoll int
	splits  []sliceSplit // progressions still to emit, in order
}

// sliceSplit is the progression next, next+step, ... of item indexes.
type sliceSplit struct{ next, step int }

func (s *sliceSource[T]) Open(_ context.Context, oc *OperatorContext) error {
	s.splits = nil
	if oc.RestoredFrom == 0 && len(oc.Restored) == 0 {
		s.splits = []sliceSplit{{next: oc.Subtask, step: oc.Parallelism}}
		return nil
	}
	for _, e := range oc.Restored {
		next, k := binary.Uvarint(e)
		if k <= 0 {
			return fmt.Errorf("slice source: %w: position", ErrDecode)
		}
		step, k2 := binary.Uvarint(e[k:])
		switch {
		case k2 == 0 && k == len(e):
			// Written before the step was recorded: only valid at the same
			// parallelism, where every subtask gets its own entry back.
			if len(oc.Restored) != 1 {
				return fmt.Errorf("slice source: %w: a position without its step cannot be restored at another parallelism", ErrIncompatibleState)
			}
			step = uint64(oc.Parallelism)
		case k2 <= 0 || k+k2 != len(e) || step == 0:
			return fmt.Errorf("slice source: %w: progression", ErrDecode)
		}
		s.splits = append(s.splits, sliceSplit{next: int(next), step: int(step)})
	}
	return nil
}

func (s *sliceSource[T]) Poll(_ context.Context, out Collector[T]) error {
	for i := 0; i < s.perPoll; i++ {
		for len(s.splits) > 0 && s.splits[0].next >= len(s.items) {
			s.splits = s.splits[1:]
		}
		if len(s.splits) == 0 {
			if i == 0 {
				return ErrEndOfInput
			}
			return nil
		}
		sp := &s.splits[0]
		out.Collect(s.items[sp.next])
		sp.next += sp.step
	}
	return nil
}

func (s *sliceSource[T]) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	var st OperatorState
	for _, sp := range s.splits {
		if sp.next < len(s.items) {
			e := binary.AppendUvarint(nil, uint64(sp.next))
			st.Entries = append(st.Entries, binary.AppendUvarint(e, uint64(sp.step)))
		}
	}
	return st, nil
}

func (s *sliceSource[T]) Close() error { return nil }

// SinkFunc makes a stateless sink from fn: at-least-once, since records
// replayed after a failure reach fn again.
func SinkFunc[T any](fn func(ctx context.Context, v T) error) func() Sink[T] {
	return func() Sink[T] { return sinkFunc[T](fn) }
}

type sinkFunc[T any] func(ctx context.Context, v T) error

func (f sinkFunc[T]) Open(context.Context, *OperatorContext) error { return nil }
func (f sinkFunc[T]) Write(ctx context.Context, v T) error         { return f(ctx, v) }
func (f sinkFunc[T]) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (f sinkFunc[T]) Close() error { return nil }
