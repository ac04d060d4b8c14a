package runtime

import (
	"errors"
	"fmt"
	"regexp"
)

// OutputTag names a side output of records of type T (Flink's OutputTag): a
// process function emits to it with Output, and SideOutput reads it as a
// stream. Its id is unique per operator.
type OutputTag[T any] struct{ id string }

var tagPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// NewOutputTag makes the tag id (1-128 of [A-Za-z0-9._-]).
func NewOutputTag[T any](id string) OutputTag[T] { return OutputTag[T]{id: id} }

// ID is the tag's id.
func (t OutputTag[T]) ID() string { return t.id }

// sideOutput is one side output of a node that something reads: how to
// fan its records out to several edges.
type sideOutput struct {
	fanout func(pushes []any) any
	typ    string
}

// SideOutput reads the side output tag of the operator that produced s, as
// a stream (connect operators to it as to any stream). Records emitted to a
// side output nothing reads are not sent anywhere.
func SideOutput[T, U any](s *Stream[U], tag OutputTag[T]) *Stream[T] {
	j := s.job
	if !tagPattern.MatchString(tag.id) {
		j.fail(fmt.Errorf("%w: side output of %q: tag id %q must be 1-128 of [A-Za-z0-9._-]", ErrInvalidJob, s.node.name, tag.id))
	}
	typ := fmt.Sprintf("%T", *new(T))
	if so, ok := s.node.sides[tag.id]; ok && so.typ != typ {
		j.fail(fmt.Errorf("%w: side output %q of %q read as %s and %s", ErrInvalidJob, tag.id, s.node.name, so.typ, typ))
	}
	if s.node.sides == nil {
		s.node.sides = map[string]*sideOutput{}
	}
	s.node.sides[tag.id] = &sideOutput{typ: typ, fanout: func(pushes []any) any {
		if len(pushes) == 1 {
			return pushes[0]
		}
		ps := make([]pushFn[T], len(pushes))
		for i, p := range pushes {
			ps[i] = p.(pushFn[T])
		}
		return pushFn[T](func(v T) error {
			for _, p := range ps {
				if err := p(v); err != nil {
					return err
				}
			}
			return nil
		})
	}}
	return &Stream[T]{job: j, node: s.node, side: tag.id}
}

// errSideOutputType is wrapped when a record is emitted to a side output
// read as another type.
var errSideOutputType = errors.New("side output read as another type")

// sideOutputs are an operator subtask's side outputs: the pushes by tag
// id, and the first error a push returned (taken after each call into user
// code).
type sideOutputs struct {
	pushes map[string]any
	// catchAll receives a record of a tag without a push (nil: it is
	// dropped).
	catchAll func(tag string, v any) error
	err      error
}

func (s *sideOutputs) take() error {
	err := s.err
	s.err = nil
	return err
}

// Output emits v to the side output tag, from a KeyedProcessor's
// ProcessElement or OnTimer. It carries the timestamp a main-output record
// emitted at this point would carry.
func Output[T any, K comparable](ctx *KeyedContext[K], tag OutputTag[T], v T) {
	emitSide(&ctx.side, tag, v)
}

func emitSide[T any](s *sideOutputs, tag OutputTag[T], v T) {
	if s.err != nil {
		return
	}
	p, ok := s.pushes[tag.id]
	if !ok {
		if s.catchAll != nil {
			s.err = s.catchAll(tag.id, v)
		}
		return
	}
	push, ok := p.(pushFn[T])
	if !ok {
		s.err = fmt.Errorf("%w: %q emitted as %T", errSideOutputType, tag.id, v)
		return
	}
	s.err = push(v)
}
