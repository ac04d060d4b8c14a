package runtime

import (
	"context"
	"fmt"
)

// Two-input operators. A node with several inputs is one task vertex whose
// head receives the channels of every input: the task aligns barriers over
// all of them (an input that delivered its barrier is blocked until every
// other channel, of either input, delivered it too), its watermark is the
// minimum over the channels of both inputs (an idle channel aside), and its
// input ends when every channel ended. Each input edge carries its own
// record type (so records cross the data plane with their own codec) and
// adapts it into the head's input: Connect tags each record with the
// input it came from, Union passes it as is.

// Union merges s and others, streams of the same type, into one stream
// (Flink's union): the result holds every record of every input, each
// input's records in their order. It runs as a pass-through operator named
// name, at the parallelism of the job unless opts set it; its watermark is
// the minimum of its inputs'. A stream may appear more than once (its
// records then do too).
func Union[T any](s *Stream[T], name string, others []*Stream[T], opts ...OpOpt) *Stream[T] {
	j := s.job
	n := j.addNode(name, opts)
	addInput(s, n)
	for _, o := range others {
		if o.job != j {
			j.fail(fmt.Errorf("%w: union %q: a stream of another job", ErrInvalidJob, name))
			continue
		}
		addInput(o, n)
	}
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		return &funcInstance{in: withFailpoint(oc.Failpoints, out.(pushFn[T]))}, nil
	}
	setOutputType[T](n)
	return &Stream[T]{job: j, node: n}
}

// ConnectedStreams are two keyed streams with the same key type, connected
// into one two-input keyed operator (ProcessConnected, IntervalJoin,
// WindowJoin, CoGroupWindow): the records of both with the same key reach
// the same subtask, and see the same keyed state and timers.
type ConnectedStreams[K comparable, A, B any] struct {
	left  *KeyedStream[K, A]
	right *KeyedStream[K, B]
}

// Connect connects two keyed streams of one job. Keys of both sides are
// hashed into key groups and stored in state with the left stream's key
// codec (both sides must key by the same key domain: equal keys are the
// same key).
func Connect[K comparable, A, B any](left *KeyedStream[K, A], right *KeyedStream[K, B]) *ConnectedStreams[K, A, B] {
	if left.s.job != right.s.job {
		left.s.job.fail(fmt.Errorf("%w: connect: the streams belong to different jobs", ErrInvalidJob))
	}
	return &ConnectedStreams[K, A, B]{left: left, right: right}
}

// KeyedCoProcessor processes two connected keyed streams with shared keyed
// state and timers (Flink's KeyedCoProcessFunction): ProcessElement1 sees
// a record of the left (first) stream, ProcessElement2 one of the right,
// each with its key in scope; OnTimer runs when a timer of either fires.
// The KeyedContext, the state declared in Open and the timers are one set
// for both inputs. Records emitted carry the input record's timestamp (the
// timer's in an event-time OnTimer), as with a KeyedProcessor.
type KeyedCoProcessor[K comparable, A, B, U any] interface {
	Open(ctx context.Context, st *StateRegistry[K]) error
	ProcessElement1(ctx *KeyedContext[K], v A, out Collector[U]) error
	ProcessElement2(ctx *KeyedContext[K], v B, out Collector[U]) error
	OnTimer(ctx *KeyedContext[K], ts int64, out Collector[U]) error
}

// ProcessConnected runs a KeyedCoProcessor on connected streams. newFn is
// called once per subtask and attempt. The operator is keyed: its state
// and timers are checkpointed by key group and restored at any
// parallelism.
func ProcessConnected[K comparable, A, B, U any](cs *ConnectedStreams[K, A, B], name string, newFn func() KeyedCoProcessor[K, A, B, U], opts ...OpOpt) *Stream[U] {
	return coProcess(cs, name, func() KeyedProcessor[K, tagged[A, B], U] { return coProcessor[K, A, B, U]{fn: newFn()} }, opts)
}

// tagged is a record of one of a two-input operator's inputs: a (the
// left) unless second, then b.
type tagged[A, B any] struct {
	second bool
	a      A
	b      B
}

// coProcessor runs a KeyedCoProcessor as the KeyedProcessor of the tagged
// union of its inputs.
type coProcessor[K comparable, A, B, U any] struct {
	fn KeyedCoProcessor[K, A, B, U]
}

func (p coProcessor[K, A, B, U]) Open(ctx context.Context, st *StateRegistry[K]) error {
	return p.fn.Open(ctx, st)
}

func (p coProcessor[K, A, B, U]) ProcessElement(ctx *KeyedContext[K], v tagged[A, B], out Collector[U]) error {
	if v.second {
		return p.fn.ProcessElement2(ctx, v.b, out)
	}
	return p.fn.ProcessElement1(ctx, v.a, out)
}

func (p coProcessor[K, A, B, U]) OnTimer(ctx *KeyedContext[K], ts int64, out Collector[U]) error {
	return p.fn.OnTimer(ctx, ts, out)
}

// userFunction is the user's function (for checkpoint notifications).
func (p coProcessor[K, A, B, U]) userFunction() any { return p.fn }

// coProcess adds the keyed two-input operator of cs running the processors
// newProc makes over the tagged union of both inputs.
func coProcess[K comparable, A, B, U any](cs *ConnectedStreams[K, A, B], name string, newProc func() KeyedProcessor[K, tagged[A, B], U], opts []OpOpt) *Stream[U] {
	j := cs.left.s.job
	n := j.addNode(name, opts)
	n.keyed = true
	hash := keyHasher(cs.left.codec)
	maxPar := uint32(j.maxParallelism)
	lkey, rkey := cs.left.key, cs.right.key
	le := taggedInput(&Stream[A]{job: j, node: cs.left.s.node, part: edgeHash, side: cs.left.s.side}, n,
		func(v A) tagged[A, B] { return tagged[A, B]{a: v} })
	le.keyGroup = func(v A) int { return int(hash(lkey(v)) % maxPar) }
	re := taggedInput(&Stream[B]{job: j, node: cs.right.s.node, part: edgeHash, side: cs.right.s.side}, n,
		func(v B) tagged[A, B] { return tagged[A, B]{second: true, b: v} })
	re.keyGroup = func(v B) int { return int(hash(rkey(v)) % maxPar) }
	ks := &KeyedStream[K, tagged[A, B]]{codec: cs.left.codec, key: func(v tagged[A, B]) K {
		if v.second {
			return rkey(v.b)
		}
		return lkey(v.a)
	}}
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		return newKeyedInstance[K, tagged[A, B], U](name, ks, keyedFunction[K, tagged[A, B], U]{proc: newProc()},
			hash, int(maxPar), oc, out.(pushFn[U])), nil
	}
	setOutputType[U](n)
	return &Stream[U]{job: j, node: n}
}

// taggedInput adds the edge from s into n, whose head takes records of
// type U: each record of s goes in as wrap(v).
func taggedInput[T, U any](s *Stream[T], n *node, wrap func(T) U) *edge {
	e := addInput(s, n)
	e.adapt = func(head, keyed any) (any, any) {
		push := head.(pushFn[U])
		in := pushFn[T](func(v T) error { return push(wrap(v)) })
		pushKG, ok := keyed.(func(U, int) error)
		if !ok {
			return in, nil
		}
		return in, func(v T, kg int) error { return pushKG(wrap(v), kg) }
	}
	return e
}
