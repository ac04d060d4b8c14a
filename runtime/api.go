package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// ErrEndOfInput is returned by Source.Poll when a bounded source has emitted
// everything. The job finishes once every source ended and a final
// checkpoint taken after that completed (so transactional sinks commit).
var ErrEndOfInput = io.EOF

// ErrInvalidJob is wrapped by every error about a job graph that cannot run.
var ErrInvalidJob = errors.New("invalid job")

// Collector receives the records an operator emits.
type Collector[T any] interface {
	Collect(v T)
}

// OperatorState is the non-keyed state an operator snapshots at a barrier:
// a list of opaque entries (redistributed over subtasks when the parallelism
// changes) and the transactions it pre-committed for the checkpoint.
type OperatorState struct {
	Entries [][]byte
	Handles []checkpoint.TxnHandle
}

// Failpointer injects faults by name (see internal/failpoint). A nil
// Failpointer injects nothing.
type Failpointer interface {
	Inject(name string) error
}

// OperatorContext is what an operator subtask learns when it opens.
type OperatorContext struct {
	Job         string
	Name        string
	UID         string
	Subtask     int
	Parallelism int
	// Attempt counts restarts of the job in this executor, from 0.
	Attempt int
	// RestoredFrom is the checkpoint this subtask was restored from (0: none).
	RestoredFrom checkpoint.ID
	// Restored are the operator state entries assigned to this subtask.
	Restored [][]byte
	// CommitHandles are the transactions of the restored checkpoint that
	// this operator (all its subtasks, not only this one: commit is
	// idempotent) pre-committed; commit them before producing anything.
	CommitHandles []checkpoint.TxnHandle
	// AbortHandles are transactions of later, incomplete checkpoints known to
	// the executor, which this subtask should abort.
	AbortHandles []checkpoint.TxnHandle
	// OrphanHandles (subtask 0 of a RestoreCommitter only) are completed
	// transactions of operators the job no longer has (allowed with
	// AllowNonRestoredState), or of skipped checkpoints that did not record
	// their operator: CommitRestored commits them too.
	OrphanHandles []checkpoint.TxnHandle
	Logger        *zap.Logger
	Failpoints    Failpointer
	// RequestCheckpoint asks the coordinator for a checkpoint now (e.g. a
	// source nearing its in-flight limit). It never blocks.
	RequestCheckpoint func(reason string)
	// RestartCause is the failure that restarted the job ("" on the first
	// attempt), e.g. for dead-letter headers.
	RestartCause string
	// Checkpointing is the checkpoint timing the job runs with. A
	// transactional operator checks its transaction timeout against
	// Checkpointing.MaxTransactionLifetime() in Open (before any record is
	// read) and fails with an Unrecoverable error if it is too short. The
	// mini cluster's restart budget is its restart delay plus one
	// checkpoint timeout for the recovery.
	Checkpointing checkpoint.Timing

	// metrics registers the operator's own metrics (OperatorContext.Metrics).
	metrics Metrics

	// stateBackend is where a keyed operator keeps its state; stateMem
	// is the task manager's memory for the pebble backend.
	stateBackend StateBackendKind
	stateMem     *StateMemory
	// stateShare is how many keyed operator subtasks of the deployment
	// share the slot of this one (subtask s of every vertex), and so the
	// slot's share of stateMem.
	stateShare int
	// stateStorage is the deployment's checkpoint storage (nil: none):
	// where native snapshots of pebble state go and come from.
	stateStorage storage.Storage

	// records counts what a source emitted or a sink wrote (Deployed.Counts);
	// in a deployment it is the task's records in (source) or out (sink).
	records *atomic.Int64
	// firstRecord is when a source first emitted (Unix nanoseconds; 0: not
	// yet), its task's TaskStats.FirstRecord; nil outside a deployment.
	firstRecord *atomic.Int64

	// sides are the pushes (pushFn[T]) of the operator's side outputs
	// that something reads, by tag id.
	sides map[string]any

	// now is the task's current record timestamp (recordTime); nil
	// outside a deployment (recordTime gives a private one).
	now *recordTime

	// interrupt is the task's signal of a waiting control message
	// (Interrupt); nil outside a deployment.
	interrupt chan struct{}

	// sideAny receives what the operator emits to a side output that has
	// no push in sides (an OperatorHarness collects every side output);
	// nil: such records go nowhere.
	sideAny func(tag string, v any) error

	// clock is the processing time of a keyed operator's timer service
	// (an OperatorHarness's clock); nil: the wall clock.
	clock func() time.Time
}

// Interrupt returns a channel that receives when the operator's task has a
// control message waiting: a barrier to inject or a checkpoint
// notification. A Source whose Poll waits for data selects on it as well
// and returns when it fires, so that the wait never holds up a checkpoint
// (as Flink's source readers report availability instead of blocking). It
// may fire with nothing left to do (the task handled the message first);
// outside a deployment it never fires.
func (oc *OperatorContext) Interrupt() <-chan struct{} {
	if oc == nil {
		return nil
	}
	return oc.interrupt
}

// recordTime returns the task's current record timestamp.
func (oc *OperatorContext) recordTime() *recordTime {
	if oc.now == nil {
		oc.now = &recordTime{ts: NoTimestamp}
	}
	return oc.now
}

// RecordTimestamp is the event timestamp (epoch ms) of the record being
// processed by the operator's task, NoTimestamp if it has none: a Sink
// reads it in Write (as Flink's SinkWriter.Context.timestamp).
func (oc *OperatorContext) RecordTimestamp() int64 { return oc.recordTime().ts }

// countRecords returns the operator's record counter (a discarded one when
// the operator was made outside a deployment).
func (oc *OperatorContext) countRecords() *atomic.Int64 {
	if oc.records == nil {
		oc.records = new(atomic.Int64)
	}
	return oc.records
}

// Metrics is where the operator registers its own metrics (a share-group
// source's held records, a transactional sink's pending transactions); a
// task manager exposes them on its /metrics. Registrations of an operator
// opened outside a deployment go nowhere (nil-safe).
func (oc *OperatorContext) Metrics() Metrics {
	if oc == nil || oc.metrics == nil {
		return discardMetrics{}
	}
	return oc.metrics
}

// Inject fires the named failpoint (nil-safe).
func (oc *OperatorContext) Inject(name string) error {
	if oc == nil || oc.Failpoints == nil {
		return nil
	}
	return oc.Failpoints.Inject(name)
}

// Source produces records. Poll is called repeatedly from the task goroutine;
// between two calls the task injects barriers, so Poll must return within a
// bounded time (tens of milliseconds) even when no data arrives.
//
// A Source may implement checkpoint.Listener.
type Source[T any] interface {
	Open(ctx context.Context, oc *OperatorContext) error
	// Poll emits zero or more records into out. It returns ErrEndOfInput
	// when a bounded source is exhausted.
	Poll(ctx context.Context, out Collector[T]) error
	// Snapshot is called at barrier id, between two Polls. An error wrapping
	// checkpoint.ErrDeclined declines the checkpoint; any other fails the
	// task.
	Snapshot(ctx context.Context, id checkpoint.ID) (OperatorState, error)
	Close() error
}

// RestoreCommitter is implemented by a Source or Sink whose snapshots carry
// transaction handles, to commit them before the job restarts. On restore,
// before any subtask of the job opens, the runtime calls CommitRestored on
// subtask 0 of every such operator that has something to commit
// (oc.CommitHandles: the operator's transactions of the restored checkpoint
// and of newer checkpoints skipped as corrupt; oc.OrphanHandles), all at
// once, and opens subtasks only once every call returned nil. So no Open
// fences or reuses a transactional id whose completed transaction is not yet
// committed. Commits must be idempotent: Open still receives CommitHandles.
// Close is called as usual, also when Open never ran. An error fails the
// attempt (wrap it with Unrecoverable when a restart cannot help).
type RestoreCommitter interface {
	CommitRestored(ctx context.Context, oc *OperatorContext) error
}

// Sink consumes records. A Sink may implement checkpoint.Listener, which is
// how transactional sinks commit on checkpoint completion.
type Sink[T any] interface {
	Open(ctx context.Context, oc *OperatorContext) error
	Write(ctx context.Context, v T) error
	// Snapshot is called at barrier id after every record before it was
	// written: flush and pre-commit here.
	Snapshot(ctx context.Context, id checkpoint.ID) (OperatorState, error)
	Close() error
}

// KeyedProcessFunction processes a keyed stream with keyed state. Open
// declares state with NewValueState / NewMapState; Process sees one record
// and its key, with every state scoped to that key.
type KeyedProcessFunction[K comparable, T, U any] interface {
	Open(ctx context.Context, st *StateRegistry[K]) error
	Process(key K, v T, out Collector[U]) error
}

// Job is a job graph under construction. Build it with FromSource, the
// operator functions and SinkTo; run it with an Executor.
type Job struct {
	name           string
	parallelism    int
	maxParallelism int
	stateBackend   StateBackendKind
	nodes          []*node
	err            error
}

// JobOpt configures a Job.
type JobOpt interface{ apply(*Job) }

// jobOpt is a JobOpt from a function.
type jobOpt func(*Job)

func (o jobOpt) apply(c *Job) { o(c) }

// DefaultParallelism sets the parallelism of operators that set none (default 1).
func DefaultParallelism(n int) JobOpt { return jobOpt(func(j *Job) { j.parallelism = n }) }

// MaxParallelism sets the number of key groups (default 128): the highest
// parallelism a keyed operator may ever run at, fixed for the life of the
// job's state.
func MaxParallelism(n int) JobOpt { return jobOpt(func(j *Job) { j.maxParallelism = n }) }

// NewJob starts a job graph.
func NewJob(name string, opts ...JobOpt) *Job {
	j := &Job{name: name, parallelism: 1, maxParallelism: DefaultMaxParallelism}
	for _, o := range opts {
		o.apply(j)
	}
	return j
}

// Name is the job's name.
func (j *Job) Name() string { return j.name }

// Parallelism is the job's default parallelism.
func (j *Job) Parallelism() int { return j.parallelism }

func (j *Job) fail(err error) {
	if j.err == nil {
		j.err = err
	}
}

// OpOpt configures one operator.
type OpOpt interface{ apply(*node) }

// opOpt is a OpOpt from a function.
type opOpt func(*node)

func (o opOpt) apply(c *node) { o(c) }

// UID sets the operator's stable id, by which its state is matched on
// restore. Defaults to the operator's name; set it explicitly before renaming.
func UID(uid string) OpOpt { return opOpt(func(n *node) { n.uid = uid }) }

// Parallelism sets the operator's parallelism.
func Parallelism(p int) OpOpt { return opOpt(func(n *node) { n.parallelism = p }) }

// Stream is a typed stream of records of T.
type Stream[T any] struct {
	job  *Job
	node *node
	part edgeKind // how the next operator connects
	side string   // the side output's tag id read from node ("": its main output)
}

// Rebalance distributes the stream's records round-robin over the next
// operator's subtasks.
func Rebalance[T any](s *Stream[T]) *Stream[T] {
	return &Stream[T]{job: s.job, node: s.node, part: edgeRebalance, side: s.side}
}

// Broadcast sends every record to every subtask of the next operator.
func Broadcast[T any](s *Stream[T]) *Stream[T] {
	return &Stream[T]{job: s.job, node: s.node, part: edgeBroadcast, side: s.side}
}

// KeyedStream is a stream partitioned by key: all records of one key reach
// the same subtask, and keyed state is scoped to the key.
type KeyedStream[K comparable, T any] struct {
	s     *Stream[T]
	key   func(T) K
	codec Codec[K]
}

// KeyBy partitions s by key. kc encodes keys for hashing into key groups and
// for state snapshots (nil: DefaultCodec).
func KeyBy[T any, K comparable](s *Stream[T], key func(T) K, kc Codec[K]) *KeyedStream[K, T] {
	if kc == nil {
		if err := CheckDefaultCodec[K](); err != nil {
			s.job.fail(fmt.Errorf("KeyBy: key codec: %w", err))
		}
		kc = DefaultCodec[K]()
	}
	return &KeyedStream[K, T]{s: s, key: key, codec: kc}
}

// FromSource adds a source to the job. newSource is called once per subtask
// and attempt: every subtask owns its Source; and once here, to record what
// the source declares (UnionState). With the Watermarks option
// the source assigns event timestamps and emits watermarks; without it its
// records keep the timestamps it emitted them with and it emits only the
// final watermark, when a bounded source ends.
func FromSource[T any](j *Job, name string, newSource func() Source[T], opts ...OpOpt) *Stream[T] {
	n := j.addNode(name, opts)
	n.kind = kindSource
	var ws *WatermarkStrategy[T]
	if n.watermarks != nil {
		s, ok := n.watermarks.(WatermarkStrategy[T])
		switch {
		case !ok:
			j.fail(fmt.Errorf("%w: source %q: watermark strategy %T is not a WatermarkStrategy[%T]", ErrInvalidJob, name, n.watermarks, *new(T)))
		case s.err != nil:
			j.fail(fmt.Errorf("%w: source %q: %w", ErrInvalidJob, name, s.err))
		}
		ws = &s
	}
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		return &sourceInstance[T]{src: newSource(), out: out.(pushFn[T]), oc: oc, records: oc.countRecords(), first: oc.firstRecord,
			wms: newSourceWatermarks(ws)}, nil
	}
	n.newUser = func() any { return newSource() }
	_, n.union = newSource().(UnionState)
	setOutputType[T](n)
	return &Stream[T]{job: j, node: n}
}

// Map applies fn to every record. An error from fn fails the task. fn is
// shared by every subtask: it must be safe for concurrent use.
func Map[T, U any](s *Stream[T], name string, fn func(T) (U, error), opts ...OpOpt) *Stream[U] {
	n := connect(s, name, opts)
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		next := out.(pushFn[U])
		return &funcInstance{in: withFailpoint(oc.Failpoints, pushFn[T](func(v T) error {
			u, err := fn(v)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return next(u)
		}))}, nil
	}
	setOutputType[U](n)
	return &Stream[U]{job: s.job, node: n}
}

// FlatMap calls fn for every record; fn emits zero or more records into out.
func FlatMap[T, U any](s *Stream[T], name string, fn func(T, Collector[U]) error, opts ...OpOpt) *Stream[U] {
	n := connect(s, name, opts)
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		c := &collector[U]{push: out.(pushFn[U])}
		return &funcInstance{in: withFailpoint(oc.Failpoints, pushFn[T](func(v T) error {
			if err := fn(v, c); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return c.take()
		}))}, nil
	}
	setOutputType[U](n)
	return &Stream[U]{job: s.job, node: n}
}

// Filter keeps the records for which keep returns true.
func Filter[T any](s *Stream[T], name string, keep func(T) bool, opts ...OpOpt) *Stream[T] {
	n := connect(s, name, opts)
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		next := out.(pushFn[T])
		return &funcInstance{in: withFailpoint(oc.Failpoints, pushFn[T](func(v T) error {
			if keep(v) {
				return next(v)
			}
			return nil
		}))}, nil
	}
	setOutputType[T](n)
	return &Stream[T]{job: s.job, node: n}
}

// Process runs a keyed process function with keyed state. newFn is called
// once per subtask and attempt. For event time and timers, see
// ProcessKeyed.
func Process[K comparable, T, U any](ks *KeyedStream[K, T], name string, newFn func() KeyedProcessFunction[K, T, U], opts ...OpOpt) *Stream[U] {
	return process(ks, name, func() keyedFunction[K, T, U] { return keyedFunction[K, T, U]{fn: newFn()} }, opts)
}

// process adds a keyed operator running the functions newFn makes.
func process[K comparable, T, U any](ks *KeyedStream[K, T], name string, newFn func() keyedFunction[K, T, U], opts []OpOpt) *Stream[U] {
	hashed := &Stream[T]{job: ks.s.job, node: ks.s.node, part: edgeHash, side: ks.s.side}
	n := connect(hashed, name, opts)
	n.keyed = true
	hash := keyHasher(ks.codec)
	maxPar := ks.s.job.maxParallelism
	n.inputs[0].keyGroup = func(v T) int { return int(hash(ks.key(v)) % uint32(maxPar)) }
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		return newKeyedInstance[K, T, U](name, ks, newFn(), hash, maxPar, oc, out.(pushFn[U])), nil
	}
	n.stateReader = func(ctx context.Context) (keyedStateReader, error) {
		return newStateReader[K, T, U](ctx, ks.codec, maxPar, newFn())
	}
	setOutputType[U](n)
	return &Stream[U]{job: ks.s.job, node: n}
}

// Reduce keeps one accumulated value per key and emits it after every record
// (a rolling reduce): the first record of a key is its first accumulator.
func Reduce[K comparable, T any](ks *KeyedStream[K, T], name string, fn func(acc, v T) (T, error), c Codec[T], opts ...OpOpt) *Stream[T] {
	if c == nil {
		if err := CheckDefaultCodec[T](); err != nil {
			ks.s.job.fail(fmt.Errorf("reduce %q: state codec: %w", name, err))
		}
	}
	return Process[K, T, T](ks, name, func() KeyedProcessFunction[K, T, T] { return &reducer[K, T]{fn: fn, codec: c} }, opts...)
}

type reducer[K comparable, T any] struct {
	fn    func(acc, v T) (T, error)
	codec Codec[T]
	acc   *ValueState[T]
}

func (r *reducer[K, T]) Open(_ context.Context, st *StateRegistry[K]) error {
	var err error
	r.acc, err = NewValueState[T](st, "reduce", r.codec)
	return err
}

func (r *reducer[K, T]) Process(_ K, v T, out Collector[T]) error {
	if acc, ok := r.acc.Value(); ok {
		var err error
		if v, err = r.fn(acc, v); err != nil {
			return err
		}
	}
	r.acc.Update(v)
	out.Collect(v)
	return nil
}

// ProcessFunc adapts a function without state to a KeyedProcessFunction.
type ProcessFunc[K comparable, T, U any] func(key K, v T, out Collector[U]) error

// Open implements KeyedProcessFunction.
func (ProcessFunc[K, T, U]) Open(context.Context, *StateRegistry[K]) error { return nil }

// Process implements KeyedProcessFunction.
func (f ProcessFunc[K, T, U]) Process(key K, v T, out Collector[U]) error { return f(key, v, out) }

// SinkTo writes the stream into a sink. newSink is called once per subtask
// and attempt, and once here, to record what the sink declares
// (UnionState).
func SinkTo[T any](s *Stream[T], name string, newSink func() Sink[T], opts ...OpOpt) {
	n := connect(s, name, opts)
	n.kind = kindSink
	n.newInstance = func(oc *OperatorContext, out any) (instance, error) {
		return newSinkInstance(newSink(), oc), nil
	}
	n.newUser = func() any { return newSink() }
	_, n.union = newSink().(UnionState)
}

var uidPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

func (j *Job) addNode(name string, opts []OpOpt) *node {
	n := &node{id: len(j.nodes), name: name, uid: name, parallelism: j.parallelism}
	for _, o := range opts {
		o.apply(n)
	}
	if !uidPattern.MatchString(n.uid) {
		j.fail(fmt.Errorf("%w: operator %q: uid %q must be 1-128 of [A-Za-z0-9._-]", ErrInvalidJob, name, n.uid))
	}
	if n.parallelism < 1 {
		j.fail(fmt.Errorf("%w: operator %q: parallelism %d < 1", ErrInvalidJob, name, n.parallelism))
	}
	j.nodes = append(j.nodes, n)
	return n
}

func connect[T any](s *Stream[T], name string, opts []OpOpt) *node {
	n := s.job.addNode(name, opts)
	addInput(s, n)
	return n
}

// addInput adds the edge from s into n (one of n's inputs) and returns it.
func addInput[T any](s *Stream[T], n *node) *edge {
	kind := s.part
	if kind == edgeForward && s.node.parallelism != n.parallelism {
		kind = edgeRebalance
	}
	e := &edge{from: s.node, to: n, kind: kind, tag: s.side}
	e.newWriter = func(tw *taskWiring, chans []chan envelope, subtask int) (any, outputGate) {
		w := newOutWriter[T](tw, chans, e, subtask)
		return pushFn[T](w.push), w
	}
	e.bind = func(head, keyed any, now *recordTime) func(batcher) (int, error) {
		push := head.(pushFn[T])
		pushKG, _ := keyed.(func(T, int) error)
		return func(bt batcher) (int, error) {
			b := bt.(*batch[T])
			n := len(b.vs)
			if pushKG != nil && len(b.kgs) == n {
				for i, v := range b.vs {
					now.ts = b.timestamp(i)
					if err := pushKG(v, int(b.kgs[i])); err != nil {
						return i, err
					}
				}
			} else {
				for i, v := range b.vs {
					now.ts = b.timestamp(i)
					if err := push(v); err != nil {
						return i, err
					}
				}
			}
			b.release()
			return n, nil
		}
	}
	if e.codecErr = CheckDefaultCodec[T](); e.codecErr == nil {
		codec := DefaultCodec[T]()
		e.encode = func(dst []byte, bt batcher) []byte {
			b := bt.(*batch[T])
			withTS := slices.ContainsFunc(b.ts, func(ts int64) bool { return ts != NoTimestamp })
			if !withTS {
				dst = append(dst, msgBatch)
			} else {
				dst = append(dst, msgBatchTS)
			}
			var buf []byte
			for i, v := range b.vs {
				if withTS {
					dst = binary.AppendVarint(dst, b.timestamp(i))
				}
				buf = codec.Append(buf[:0], v)
				dst = appendFrame(dst, buf)
			}
			return dst
		}
		e.decode = func(kind byte, b []byte) (batcher, error) {
			out := &batch[T]{}
			for len(b) > 0 {
				ts := NoTimestamp
				if kind == msgBatchTS {
					var n int
					if ts, n = binary.Varint(b); n <= 0 {
						return nil, fmt.Errorf("%w: record timestamp", ErrDecode)
					}
					b = b[n:]
				}
				f, rest, err := readFrame(b)
				if err != nil {
					return nil, err
				}
				v, err := codec.Decode(f)
				if err != nil {
					return nil, err
				}
				out.vs, b = append(out.vs, v), rest
				out.stamp(ts)
			}
			return out, nil
		}
	}
	s.node.outputs = append(s.node.outputs, e)
	n.inputs = append(n.inputs, e)
	return e
}

// setOutputType records how to fan one output out to several edges.
func setOutputType[T any](n *node) {
	n.fanout = func(pushes []any) any {
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
	}
	n.discard = func() any { return pushFn[T](func(T) error { return nil }) }
	n.collect = func(fn func(any) error) any { return pushFn[T](func(v T) error { return fn(v) }) }
}

// withFailpoint returns push, preceded by the task.process failpoint if fp
// is set: without failpoints a record costs no extra call.
func withFailpoint[T any](fp Failpointer, push pushFn[T]) pushFn[T] {
	if fp == nil {
		return push
	}
	return func(v T) error {
		if err := fp.Inject(failpointProcess); err != nil {
			return err
		}
		return push(v)
	}
}

// failpointProcess fires before every record an operator processes.
const failpointProcess = "task.process"

// keyHasher returns the key hash for K, avoiding an encoding for strings.
func keyHasher[K comparable](c Codec[K]) func(K) uint32 {
	if _, ok := any(c).(stringCodec); ok {
		var f any = hashString
		if h, ok := f.(func(K) uint32); ok {
			return h
		}
	}
	return func(k K) uint32 {
		var buf [64]byte
		return hashKey(c.Append(buf[:0], k))
	}
}

// collector buffers the first error of a push behind the Collector interface.
type collector[T any] struct {
	push pushFn[T]
	err  error
	n    int64 // records pushed
}

func (c *collector[T]) Collect(v T) {
	if c.err == nil {
		if c.err = c.push(v); c.err == nil {
			c.n++
		}
	}
}

func (c *collector[T]) take() error {
	err := c.err
	c.err = nil
	return err
}
