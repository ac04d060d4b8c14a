package runtime

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/weirstream/weir/checkpoint"
)

// Broadcast state (Flink's broadcast state pattern): a second stream, of
// rules or configuration, is broadcast to every subtask of a data stream
// (keyed or not). The function's broadcast side (ProcessBroadcastElement)
// sees every record of that stream in every subtask and may write the
// broadcast state, maps declared through a BroadcastRegistry; the data side
// only reads them. So that every subtask holds the same state, the broadcast
// side must change it the same way in every subtask (from the broadcast
// record alone, never from keyed state or the subtask's index).
//
// Broadcast state is operator state checkpointed by every subtask (one full
// copy each) and restored at any parallelism: every new subtask restores
// the copy of one old subtask (subtask i that of old subtask i modulo the
// old parallelism), so that scaling up or down keeps every entry.

// ErrBroadcastStateReadOnly is returned by a BroadcastState's Put, Delete and
// Clear outside ProcessBroadcastElement: the data side only reads broadcast
// state.
var ErrBroadcastStateReadOnly = errors.New("broadcast state is read-only on the data side")

// BroadcastRegistry declares the broadcast state of a broadcast process
// function. It is handed to Open.
type BroadcastRegistry struct {
	states   []broadcastStore
	restored map[string][]byte // state name -> encoded map, for states not declared yet
	writable bool              // ProcessBroadcastElement is running
}

// broadcastStore is the untyped face of one broadcast state.
type broadcastStore interface {
	name() string
	encode() []byte
	restore(b []byte) error
	// decodeEntry decodes one encoded entry with the state's codecs
	// (ReadBroadcastState).
	decodeEntry(kb, vb []byte) (k, v any, err error)
}

// BroadcastState is a map shared by every key of a broadcast operator
// subtask (Flink's BroadcastState / ReadOnlyBroadcastState): read anywhere,
// written only from ProcessBroadcastElement. Values are stored by value, as
// in ValueState.
type BroadcastState[UK comparable, UV any] struct {
	stateName string
	m         map[UK]UV
	codec     mapCodec[UK, UV]
	reg       *BroadcastRegistry
}

// NewBroadcastState declares the broadcast state named name, with codecs for
// its keys and values (nil: DefaultCodec). Declaring a name twice is an
// error. A restored state with that name is its initial content.
func NewBroadcastState[UK comparable, UV any](r *BroadcastRegistry, name string, kc Codec[UK], vc Codec[UV]) (*BroadcastState[UK, UV], error) {
	if kc == nil {
		if err := CheckDefaultCodec[UK](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("broadcast state %q keys: %w", name, err))
		}
		kc = DefaultCodec[UK]()
	}
	if vc == nil {
		if err := CheckDefaultCodec[UV](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("broadcast state %q values: %w", name, err))
		}
		vc = DefaultCodec[UV]()
	}
	for _, s := range r.states {
		if s.name() == name {
			return nil, fmt.Errorf("broadcast state %q declared twice", name)
		}
	}
	s := &BroadcastState[UK, UV]{stateName: name, m: map[UK]UV{}, codec: mapCodec[UK, UV]{kc, vc}, reg: r}
	if b, ok := r.restored[name]; ok {
		if err := s.restore(b); err != nil {
			return nil, err
		}
		delete(r.restored, name)
	}
	r.states = append(r.states, s)
	return s, nil
}

func (s *BroadcastState[UK, UV]) name() string   { return s.stateName }
func (s *BroadcastState[UK, UV]) encode() []byte { return s.codec.Append(nil, s.m) }
func (s *BroadcastState[UK, UV]) restore(b []byte) error {
	m, err := s.codec.Decode(b)
	if err != nil {
		return fmt.Errorf("broadcast state %q: %w", s.stateName, err)
	}
	s.m = m
	return nil
}

func (s *BroadcastState[UK, UV]) decodeEntry(kb, vb []byte) (any, any, error) {
	k, err := s.codec.kc.Decode(kb)
	if err != nil {
		return nil, nil, fmt.Errorf("key codec: %w", err)
	}
	v, err := s.codec.vc.Decode(vb)
	if err != nil {
		return k, nil, fmt.Errorf("value codec: %w", err)
	}
	return k, v, nil
}

// Get returns the value of uk.
func (s *BroadcastState[UK, UV]) Get(uk UK) (UV, bool) {
	v, ok := s.m[uk]
	return v, ok
}

// Range calls fn for each entry until it returns false. The state must not
// change from fn.
func (s *BroadcastState[UK, UV]) Range(fn func(UK, UV) bool) {
	for k, v := range s.m {
		if !fn(k, v) {
			return
		}
	}
}

// Len is the number of entries.
func (s *BroadcastState[UK, UV]) Len() int { return len(s.m) }

// Put sets the value of uk; only from ProcessBroadcastElement
// (ErrBroadcastStateReadOnly otherwise).
func (s *BroadcastState[UK, UV]) Put(uk UK, uv UV) error {
	if !s.reg.writable {
		return fmt.Errorf("put into %q: %w", s.stateName, ErrBroadcastStateReadOnly)
	}
	s.m[uk] = uv
	return nil
}

// Delete removes uk; only from ProcessBroadcastElement.
func (s *BroadcastState[UK, UV]) Delete(uk UK) error {
	if !s.reg.writable {
		return fmt.Errorf("delete from %q: %w", s.stateName, ErrBroadcastStateReadOnly)
	}
	delete(s.m, uk)
	return nil
}

// Clear removes every entry; only from ProcessBroadcastElement.
func (s *BroadcastState[UK, UV]) Clear() error {
	if !s.reg.writable {
		return fmt.Errorf("clear %q: %w", s.stateName, ErrBroadcastStateReadOnly)
	}
	clear(s.m)
	return nil
}

// snapshot encodes every broadcast state (declared, or restored and not
// declared again) as operator state entries: one entry per state, its name
// and its map, in name order. Broadcast state is small and changes rarely,
// so it is encoded in the synchronous part.
func (r *BroadcastRegistry) snapshot() [][]byte {
	type named struct {
		name string
		b    []byte
	}
	var all []named
	for _, s := range r.states {
		all = append(all, named{s.name(), s.encode()})
	}
	for n, b := range r.restored {
		all = append(all, named{n, b})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	out := make([][]byte, len(all))
	for i, e := range all {
		out[i] = appendFrame(appendFrame(nil, []byte(e.name)), e.b)
	}
	return out
}

// restore keeps the entries of one copy of the broadcast state until the
// states are declared.
func (r *BroadcastRegistry) restore(entries [][]byte) error {
	r.restored = map[string][]byte{}
	for _, e := range entries {
		name, b, err := splitBroadcastEntry(e)
		if err != nil {
			return err
		}
		r.restored[name] = b
	}
	return nil
}

// splitBroadcastEntry splits one operator state entry of broadcast state
// (as snapshot writes it) into the state's name and its encoded map.
func splitBroadcastEntry(e []byte) (string, []byte, error) {
	name, rest, err := readFrame(e)
	if err != nil {
		return "", nil, fmt.Errorf("broadcast state: %w", err)
	}
	b, rest, err := readFrame(rest)
	if err != nil {
		return "", nil, fmt.Errorf("broadcast state %q: %w", name, err)
	}
	if len(rest) != 0 {
		return "", nil, fmt.Errorf("broadcast state %q: %w: %d trailing bytes", name, ErrDecode, len(rest))
	}
	return string(name), b, nil
}

// BroadcastContext is what both sides of a broadcast process function see.
// It is valid only during the call.
type BroadcastContext struct {
	now  *recordTime
	side sideOutputs
}

// Timestamp is the record's event timestamp (NoTimestamp if it has none).
func (c *BroadcastContext) Timestamp() int64 { return c.now.ts }

// OutputBroadcast emits v to the side output tag from a broadcast process
// function (either side).
func OutputBroadcast[T any](ctx *BroadcastContext, tag OutputTag[T], v T) {
	emitSide(&ctx.side, tag, v)
}

// BroadcastProcessor processes a non-keyed stream connected with a
// broadcast stream (Flink's BroadcastProcessFunction): ProcessElement sees
// a record of the data stream and may only read the broadcast state;
// ProcessBroadcastElement sees every record of the broadcast stream, in
// every subtask, and may write it. Open declares the broadcast state
// (NewBroadcastState).
type BroadcastProcessor[T, B, U any] interface {
	Open(ctx context.Context, bs *BroadcastRegistry) error
	ProcessElement(ctx *BroadcastContext, v T, out Collector[U]) error
	ProcessBroadcastElement(ctx *BroadcastContext, v B, out Collector[U]) error
}

// KeyedBroadcastProcessor processes a keyed stream connected with a
// broadcast stream (Flink's KeyedBroadcastProcessFunction): ProcessElement
// and OnTimer are those of a KeyedProcessor (keyed state, timers, the
// broadcast state read-only); ProcessBroadcastElement sees every record of
// the broadcast stream, in every subtask, without a key in scope, and may
// write the broadcast state (not keyed state). Open declares both.
type KeyedBroadcastProcessor[K comparable, T, B, U any] interface {
	Open(ctx context.Context, st *StateRegistry[K], bs *BroadcastRegistry) error
	ProcessElement(ctx *KeyedContext[K], v T, out Collector[U]) error
	ProcessBroadcastElement(ctx *BroadcastContext, v B, out Collector[U]) error
	OnTimer(ctx *KeyedContext[K], ts int64, out Collector[U]) error
}

// ProcessBroadcast connects s with rules, broadcast to every subtask, and
// runs a BroadcastProcessor on them. s reaches the operator as it would a
// Map (forward, or rebalanced at another parallelism). newFn is called once
// per subtask and attempt.
func ProcessBroadcast[T, B, U any](s *Stream[T], rules *Stream[B], name string, newFn func() BroadcastProcessor[T, B, U], opts ...OpOpt) *Stream[U] {
	j := s.job
	n := j.addNode(name, opts)
	n.broadcastState = true
	taggedInput(s, n, func(v T) tagged[T, B] { return tagged[T, B]{a: v} })
	addBroadcastInput[T](j, rules, n, name)
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		bi := &broadcastInstance[T, B, U]{name: name, fn: newFn(), oc: oc, c: &collector[U]{push: out.(pushFn[U])}, reg: &BroadcastRegistry{}}
		bi.ctx = &BroadcastContext{now: oc.recordTime(), side: sideOutputs{pushes: oc.sides, catchAll: oc.sideAny}}
		return bi, nil
	}
	n.broadcastReader = func(ctx context.Context) (*BroadcastRegistry, error) {
		reg := &BroadcastRegistry{}
		return reg, newFn().Open(ctx, reg)
	}
	setOutputType[U](n)
	return &Stream[U]{job: j, node: n}
}

// ProcessKeyedBroadcast connects the keyed stream ks with rules, broadcast
// to every subtask, and runs a KeyedBroadcastProcessor on them. Its keyed
// state and timers are checkpointed by key group, its broadcast state once
// per subtask; both restore at any parallelism.
func ProcessKeyedBroadcast[K comparable, T, B, U any](ks *KeyedStream[K, T], rules *Stream[B], name string, newFn func() KeyedBroadcastProcessor[K, T, B, U], opts ...OpOpt) *Stream[U] {
	j := ks.s.job
	n := j.addNode(name, opts)
	n.keyed, n.broadcastState = true, true
	hash := keyHasher(ks.codec)
	maxPar := j.maxParallelism
	de := taggedInput(&Stream[T]{job: j, node: ks.s.node, part: edgeHash, side: ks.s.side}, n,
		func(v T) tagged[T, B] { return tagged[T, B]{a: v} })
	de.keyGroup = func(v T) int { return int(hash(ks.key(v)) % uint32(maxPar)) }
	addBroadcastInput[T](j, rules, n, name)
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		fn := newFn()
		reg := &BroadcastRegistry{}
		ki := newKeyedInstance[K, T, U](name, ks, keyedFunction[K, T, U]{proc: keyedBroadcastAdapter[K, T, B, U]{fn: fn, reg: reg}},
			hash, maxPar, oc, out.(pushFn[U]))
		bctx := &BroadcastContext{now: ki.now, side: ki.kctx.side}
		return &keyedBroadcastInstance[K, T, B, U]{keyedInstance: ki, fn: fn, reg: reg, ctx: bctx}, nil
	}
	n.stateReader = func(ctx context.Context) (keyedStateReader, error) {
		return newStateReader[K, T, U](ctx, ks.codec, maxPar, keyedFunction[K, T, U]{proc: keyedBroadcastAdapter[K, T, B, U]{fn: newFn(), reg: &BroadcastRegistry{}}})
	}
	n.broadcastReader = func(ctx context.Context) (*BroadcastRegistry, error) {
		reg := &BroadcastRegistry{}
		_, err := newStateReader[K, T, U](ctx, ks.codec, maxPar, keyedFunction[K, T, U]{proc: keyedBroadcastAdapter[K, T, B, U]{fn: newFn(), reg: reg}})
		return reg, err
	}
	setOutputType[U](n)
	return &Stream[U]{job: j, node: n}
}

// addBroadcastInput adds rules, broadcast, as the second input of n.
func addBroadcastInput[T, B any](j *Job, rules *Stream[B], n *node, name string) {
	if rules.job != j {
		rules.job.fail(fmt.Errorf("%w: broadcast operator %q: a broadcast stream of another job", ErrInvalidJob, name))
	}
	taggedInput(&Stream[B]{job: rules.job, node: rules.node, part: edgeBroadcast, side: rules.side}, n,
		func(v B) tagged[T, B] { return tagged[T, B]{second: true, b: v} })
}

// broadcastInstance runs a BroadcastProcessor.
type broadcastInstance[T, B, U any] struct {
	name string
	fn   BroadcastProcessor[T, B, U]
	oc   *OperatorContext
	c    *collector[U]
	reg  *BroadcastRegistry
	ctx  *BroadcastContext
}

func (b *broadcastInstance[T, B, U]) input() any {
	return withFailpoint(b.oc.Failpoints, pushFn[tagged[T, B]](func(v tagged[T, B]) error {
		var err error
		if v.second {
			b.reg.writable = true
			err = b.fn.ProcessBroadcastElement(b.ctx, v.b, b.c)
			b.reg.writable = false
		} else {
			err = b.fn.ProcessElement(b.ctx, v.a, b.c)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		if err := b.ctx.side.take(); err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		return b.c.take()
	}))
}

func (b *broadcastInstance[T, B, U]) snapshot(context.Context, checkpoint.ID) (checkpoint.OperatorSnapshot, func() (map[int][]byte, error), error) {
	return checkpoint.OperatorSnapshot{State: b.reg.snapshot()}, nil, nil
}

func (b *broadcastInstance[T, B, U]) restore(r *SubtaskState) error {
	if err := b.reg.restore(r.Entries); err != nil {
		return fmt.Errorf("%s: restore: %w", b.name, err)
	}
	return nil
}

func (b *broadcastInstance[T, B, U]) open(ctx context.Context) error { return b.fn.Open(ctx, b.reg) }
func (b *broadcastInstance[T, B, U]) notify(ctx context.Context, id checkpoint.ID, complete bool) error {
	return notifyListener(ctx, b.fn, id, complete)
}
func (b *broadcastInstance[T, B, U]) close() error { return nil }
func (b *broadcastInstance[T, B, U]) user() any    { return b.fn }

// keyedBroadcastAdapter runs a KeyedBroadcastProcessor's data side as the
// KeyedProcessor of a keyed instance.
type keyedBroadcastAdapter[K comparable, T, B, U any] struct {
	fn  KeyedBroadcastProcessor[K, T, B, U]
	reg *BroadcastRegistry
}

func (a keyedBroadcastAdapter[K, T, B, U]) Open(ctx context.Context, st *StateRegistry[K]) error {
	return a.fn.Open(ctx, st, a.reg)
}

func (a keyedBroadcastAdapter[K, T, B, U]) ProcessElement(ctx *KeyedContext[K], v T, out Collector[U]) error {
	return a.fn.ProcessElement(ctx, v, out)
}

func (a keyedBroadcastAdapter[K, T, B, U]) OnTimer(ctx *KeyedContext[K], ts int64, out Collector[U]) error {
	return a.fn.OnTimer(ctx, ts, out)
}

// userFunction is the user's function (for checkpoint notifications).
func (a keyedBroadcastAdapter[K, T, B, U]) userFunction() any { return a.fn }

// keyedBroadcastInstance is a keyed instance over the data stream whose
// input also takes the broadcast stream's records, outside any key.
type keyedBroadcastInstance[K comparable, T, B, U any] struct {
	*keyedInstance[K, T, U]
	fn  KeyedBroadcastProcessor[K, T, B, U]
	reg *BroadcastRegistry
	ctx *BroadcastContext
}

func (k *keyedBroadcastInstance[K, T, B, U]) processBroadcast(v B) error {
	k.reg.writable = true
	err := k.fn.ProcessBroadcastElement(k.ctx, v, k.c)
	k.reg.writable = false
	if err != nil {
		return fmt.Errorf("%s: %w", k.name, err)
	}
	if err := k.ctx.side.take(); err != nil {
		return fmt.Errorf("%s: %w", k.name, err)
	}
	return k.c.take()
}

func (k *keyedBroadcastInstance[K, T, B, U]) input() any {
	data := k.keyedInstance.input().(pushFn[T])
	return pushFn[tagged[T, B]](func(v tagged[T, B]) error {
		if v.second {
			if fp := k.oc.Failpoints; fp != nil {
				if err := fp.Inject(failpointProcess); err != nil {
					return err
				}
			}
			return k.processBroadcast(v.b)
		}
		return data(v.a)
	})
}

func (k *keyedBroadcastInstance[K, T, B, U]) inputWithKeyGroup() any {
	data := k.keyedInstance.inputWithKeyGroup().(func(T, int) error)
	return func(v tagged[T, B], kg int) error {
		if v.second { // a broadcast edge carries no key groups; never here
			return k.processBroadcast(v.b)
		}
		return data(v.a, kg)
	}
}

func (k *keyedBroadcastInstance[K, T, B, U]) snapshot(ctx context.Context, id checkpoint.ID) (checkpoint.OperatorSnapshot, func() (map[int][]byte, error), error) {
	snap, enc, err := k.keyedInstance.snapshot(ctx, id)
	snap.State = k.reg.snapshot()
	return snap, enc, err
}

func (k *keyedBroadcastInstance[K, T, B, U]) restore(r *SubtaskState) error {
	if err := k.reg.restore(r.Entries); err != nil {
		return fmt.Errorf("%s: restore: %w", k.name, err)
	}
	return k.keyedInstance.restore(r)
}
