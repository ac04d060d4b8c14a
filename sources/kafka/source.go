package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// New returns a source factory reading Kafka partitions and decoding each
// record with decode (an error sends the record to the dead-letter topic).
// Options are validated here, so a bad job is refused when it is built.
func New[T any](decode func(*kgo.Record) (T, error), opts ...Opt) (func() runtime.Source[T], error) {
	c := defaults()
	for _, o := range opts {
		o.apply(&c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if decode == nil {
		return nil, fmt.Errorf("%w: kafka source: no decode function", ErrInvalidConfig)
	}
	return func() runtime.Source[T] { return &Source[T]{cfg: c, decode: decode} }, nil
}

// Source is one subtask of a Kafka partition source. Build it with New.
type Source[T any] struct {
	cfg    cfg
	decode func(*kgo.Record) (T, error)
}

// UnionState implements runtime.UnionState: every subtask restores every
// partition's offset and keeps those of the partitions it owns (Owner).
func (s *Source[T]) UnionState() {}

// Open implements runtime.Source.
func (s *Source[T]) Open(ctx context.Context, oc *runtime.OperatorContext) error {
	return errors.New("kafka source: not implemented yet")
}

// Poll implements runtime.Source.
func (s *Source[T]) Poll(ctx context.Context, out runtime.Collector[T]) error { return nil }

// Snapshot implements runtime.Source.
func (s *Source[T]) Snapshot(ctx context.Context, id checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{}, nil
}

// Close implements runtime.Source.
func (s *Source[T]) Close() error { return nil }

var _ runtime.UnionState = (*Source[int])(nil)
