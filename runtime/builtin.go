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
func SliceSource[T any](items []T, perPoll int) func() Source[T] {
	if perPoll <= 0 {
		perPoll = 256
	}
	return func() Source[T] { return &sliceSource[T]{items: items, perPoll: perPoll} }
}

type sliceSource[T any] struct {
	items      []T
	perPoll    int
	next, step int
}

func (s *sliceSource[T]) Open(_ context.Context, oc *OperatorContext) error {
	s.next, s.step = oc.Subtask, oc.Parallelism
	if len(oc.Restored) > 1 {
		return fmt.Errorf("slice source: restored %d positions, want at most 1 (the parallelism of a slice source cannot change)", len(oc.Restored))
	}
	if len(oc.Restored) == 1 {
		pos, k := binary.Uvarint(oc.Restored[0])
		if k <= 0 {
			return fmt.Errorf("slice source: %w: position", ErrDecode)
		}
		s.next = int(pos)
	}
	return nil
}

func (s *sliceSource[T]) Poll(_ context.Context, out Collector[T]) error {
	if s.next >= len(s.items) {
		return ErrEndOfInput
	}
	for i := 0; i < s.perPoll && s.next < len(s.items); i++ {
		out.Collect(s.items[s.next])
		s.next += s.step
	}
	return nil
}

func (s *sliceSource[T]) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{Entries: [][]byte{binary.AppendUvarint(nil, uint64(s.next))}}, nil
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
