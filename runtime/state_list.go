package runtime

import (
	"fmt"
	"iter"
	"strings"
)

// The rest of Flink's keyed-state kinds: ListState, ReducingState and
// AggregatingState. Each is stored under a name that carries its kind
// (kindPrefix), so that a state restored as one kind and declared as
// another is refused with a clear error instead of being misread; value
// and map states keep their plain names (the format of every earlier
// checkpoint).

// Kinds of keyed state, as stored names carry them ("" for a plain name: a
// value or a map state).
const (
	kindList        = "list"
	kindReducing    = "reducing"
	kindAggregating = "aggregating"
	kindTimers      = "timers"
)

// storedStateName is the name a state of kind is stored under.
func storedStateName(kind, name string) string {
	if kind == "" {
		return name
	}
	return "\x00" + kind + "/" + name
}

// stateKind splits a stored name into its kind and the declared name.
func stateKind(stored string) (kind, name string) {
	rest, ok := strings.CutPrefix(stored, "\x00")
	if !ok {
		return "", stored
	}
	kind, name, _ = strings.Cut(rest, "/")
	return kind, name
}

// describeKind names a kind in errors.
func describeKind(kind string) string {
	if kind == "" {
		return "value or map state"
	}
	k, ttl := strings.CutSuffix(kind, ttlKindSuffix)
	if k == "" {
		k = "value or map"
	}
	if ttl {
		return k + " state with TTL"
	}
	return k + " state"
}

// checkKind refuses a state declared under stored when the backend has a
// state of the same declared name of another kind, declared or restored.
func (b *keyedBackend[K]) checkKind(stored string) error {
	kind, name := stateKind(stored)
	if kind == kindTimers {
		return nil
	}
	check := func(other string, what string) error {
		ok, on := stateKind(other)
		if on != name || ok == kind || ok == kindTimers {
			return nil
		}
		return Unrecoverable(fmt.Errorf("%w: state %q %s as %s, declared as %s", ErrIncompatibleState, name, what, describeKind(ok), describeKind(kind)))
	}
	for other := range b.restored {
		if err := check(other, "restored"); err != nil {
			return err
		}
	}
	for _, s := range b.states {
		if err := check(s.name(), "already declared"); err != nil {
			return err
		}
	}
	return nil
}

// ListState is a list per key, scoped to the key of the record being
// processed (Flink's ListState). Elements are stored by value.
type ListState[T any] struct {
	s listStore[T]
}

// listStore is the current key's list of one list state.
type listStore[T any] interface {
	// each calls fn for each element in order until it returns false.
	each(fn func(T) bool)
	add(vs ...T)
	update(vs []T)
	clear()
}

// Get iterates over the current key's elements, in the order they were
// added (none when the list is empty). The list must not change during
// the iteration.
func (l *ListState[T]) Get() iter.Seq[T] {
	return func(yield func(T) bool) { l.s.each(yield) }
}

// Add appends v to the current key's list.
func (l *ListState[T]) Add(v T) { l.s.add(v) }

// AddAll appends vs to the current key's list.
func (l *ListState[T]) AddAll(vs []T) {
	if len(vs) > 0 {
		l.s.add(vs...)
	}
}

// Update replaces the current key's list by vs (an empty vs clears it).
func (l *ListState[T]) Update(vs []T) { l.s.update(vs) }

// Clear removes the current key's list.
func (l *ListState[T]) Clear() { l.s.clear() }

// NewListState declares a ListState named name with codec c for its
// elements (nil: DefaultCodec). Options: WithTTL.
func NewListState[T any, K comparable](r *StateRegistry[K], name string, c Codec[T], opts ...StateOpt) (*ListState[T], error) {
	if c == nil {
		if err := CheckDefaultCodec[T](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("list state %q: %w", name, err))
		}
		c = DefaultCodec[T]()
	}
	cfg := stateCfgOf(opts)
	if cfg.ttl != nil {
		return newTTLListState[T](r, name, c, *cfg.ttl)
	}
	s, _, err := newListStore[T](r, storedStateName(kindList, name), c)
	if err != nil {
		return nil, err
	}
	return &ListState[T]{s: s}, nil
}

// newListStore declares the list store of the backend under stored, and
// returns the heap's keyedStore too (nil on pebble).
func newListStore[T any, K comparable](r *StateRegistry[K], stored string, c Codec[T]) (listStore[T], *keyedStore[K, []T], error) {
	if r.b.pebble != nil {
		s := newPebbleList[K, T](r, stored, c)
		if err := r.b.register(s); err != nil {
			return nil, nil, err
		}
		return s, nil, nil
	}
	h, err := newHeapList[T](r, stored, c)
	if err != nil {
		return nil, nil, err
	}
	return h, h.s, nil
}

// listEntries calls fn for each element of l (keyedStore.entries: a state
// dump has one record per element).
func listEntries[T any](l []T, fn func(k, v any) error) error {
	for _, v := range l {
		if err := fn(nil, v); err != nil {
			return err
		}
	}
	return nil
}

// heapList is the heap backend's list store: a slice per key in a
// keyedStore, copied on write while a snapshot holds it.
type heapList[K comparable, T any] struct {
	s *keyedStore[K, []T]
}

func newHeapList[T any, K comparable](r *StateRegistry[K], stored string, c Codec[T]) (heapList[K, T], error) {
	s := &keyedStore[K, []T]{
		stateName: stored, scope: &r.b.scope, groups: make([]*keyGroupMap[K, []T], r.b.maxPar),
		keyCodec: r.b.keyCodec, valCodec: listCodec[T]{c},
		clone:   func(l []T) []T { return append([]T(nil), l...) },
		entries: listEntries[T],
	}
	if err := r.b.register(s); err != nil {
		return heapList[K, T]{}, err
	}
	return heapList[K, T]{s}, nil
}

func (l heapList[K, T]) each(fn func(T) bool) {
	vs, _ := l.s.get()
	for _, v := range vs {
		if !fn(v) {
			return
		}
	}
}

func (l heapList[K, T]) add(vs ...T) {
	cur, _ := l.s.getForWrite()
	l.s.put(append(cur, vs...))
}

func (l heapList[K, T]) update(vs []T) {
	if len(vs) == 0 {
		l.s.del()
		return
	}
	l.s.put(append([]T(nil), vs...))
}

func (l heapList[K, T]) clear() { l.s.del() }

// The list codec is the window contents' (listCodec): framed elements,
// so that appending an element appends its frame.

// ReducingState keeps one value per key, the reduction of every value
// added (Flink's ReducingState): the first value added is the first
// accumulator, each next one is reduce(acc, v).
type ReducingState[T any] struct {
	v      *ValueState[T]
	reduce func(acc, v T) (T, error)
}

// Get returns the current key's reduced value and whether it has one.
func (s *ReducingState[T]) Get() (T, bool) { return s.v.Value() }

// Add reduces v into the current key's value; an error of the reduce
// function leaves the value as it was.
func (s *ReducingState[T]) Add(v T) error {
	if acc, ok := s.v.Value(); ok {
		var err error
		if v, err = s.reduce(acc, v); err != nil {
			return err
		}
	}
	s.v.Update(v)
	return nil
}

// Clear removes the current key's value.
func (s *ReducingState[T]) Clear() { s.v.Clear() }

// NewReducingState declares a ReducingState named name reducing with
// reduce, its values encoded with c (nil: DefaultCodec). Options: WithTTL.
func NewReducingState[T any, K comparable](r *StateRegistry[K], name string, reduce func(acc, v T) (T, error), c Codec[T], opts ...StateOpt) (*ReducingState[T], error) {
	v, err := newKindValueState[T](r, kindReducing, name, c, opts)
	if err != nil {
		return nil, err
	}
	return &ReducingState[T]{v: v, reduce: reduce}, nil
}

// AggregatingState keeps one accumulator per key, aggregating every value
// added with an AggregateFunction (Flink's AggregatingState; the
// AggregateFunction of windows: CreateAccumulator, Add and GetResult; Merge
// is not used). Get returns the result of the accumulator.
type AggregatingState[IN, ACC, OUT any] struct {
	v   *ValueState[ACC]
	agg AggregateFunction[IN, ACC, OUT]
}

// Get returns the result of the current key's accumulator, and whether
// anything was added since it was last cleared.
func (s *AggregatingState[IN, ACC, OUT]) Get() (OUT, bool) {
	acc, ok := s.v.Value()
	if !ok {
		var zero OUT
		return zero, false
	}
	return s.agg.GetResult(acc), true
}

// Add adds v to the current key's accumulator (a new one if it has none).
func (s *AggregatingState[IN, ACC, OUT]) Add(v IN) {
	acc, ok := s.v.Value()
	if !ok {
		acc = s.agg.CreateAccumulator()
	}
	s.v.Update(s.agg.Add(v, acc))
}

// Clear removes the current key's accumulator.
func (s *AggregatingState[IN, ACC, OUT]) Clear() { s.v.Clear() }

// NewAggregatingState declares an AggregatingState named name aggregating
// with agg, its accumulators encoded with c (nil: DefaultCodec). Options:
// WithTTL.
func NewAggregatingState[IN, ACC, OUT any, K comparable](r *StateRegistry[K], name string, agg AggregateFunction[IN, ACC, OUT], c Codec[ACC], opts ...StateOpt) (*AggregatingState[IN, ACC, OUT], error) {
	v, err := newKindValueState[ACC](r, kindAggregating, name, c, opts)
	if err != nil {
		return nil, err
	}
	return &AggregatingState[IN, ACC, OUT]{v: v, agg: agg}, nil
}

// newKindValueState is the value state behind a reducing or aggregating
// state, stored under its kind's name.
func newKindValueState[T any, K comparable](r *StateRegistry[K], kind, name string, c Codec[T], opts []StateOpt) (*ValueState[T], error) {
	if c == nil {
		if err := CheckDefaultCodec[T](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("%s state %q: %w", kind, name, err))
		}
		c = DefaultCodec[T]()
	}
	cfg := stateCfgOf(opts)
	if cfg.ttl != nil {
		return newTTLValueState[T](r, kind, name, c, *cfg.ttl)
	}
	return NewValueState[T](r, storedStateName(kind, name), c)
}
