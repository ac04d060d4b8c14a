package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// restoreCommitter is implemented by the instances of sources and sinks:
// whether their user code is a RestoreCommitter, whether it has anything to
// commit, and the call.
type restoreCommitter interface {
	hasRestoreCommitter() bool
	mustCommitRestored() bool
	commitRestored(ctx context.Context) error
}

// callCommitRestored runs x's CommitRestored, a panic turned into an error.
func callCommitRestored(ctx context.Context, x any, oc *OperatorContext) (err error) {
	defer recoverInto(&err)
	return x.(RestoreCommitter).CommitRestored(ctx, oc)
}

func isRestoreCommitter(x any) bool { _, ok := x.(RestoreCommitter); return ok }

func hasHandlesToCommit(oc *OperatorContext) bool {
	return len(oc.CommitHandles) > 0 || len(oc.OrphanHandles) > 0
}

// funcInstance is a stateless operator: map, flatMap, filter.
type funcInstance struct {
	in any
}

func (f *funcInstance) input() any { return f.in }
func (f *funcInstance) snapshot(context.Context, checkpoint.ID) (checkpoint.OperatorSnapshot, func() (map[int][]byte, error), error) {
	return checkpoint.OperatorSnapshot{}, nil, nil
}
func (f *funcInstance) restore(*SubtaskState) error                       { return nil }
func (f *funcInstance) open(context.Context) error                        { return nil }
func (f *funcInstance) notify(context.Context, checkpoint.ID, bool) error { return nil }
func (f *funcInstance) close() error                                      { return nil }
func (f *funcInstance) user() any                                         { return nil }

// notifyListener forwards a notification to x if it is a checkpoint.Listener.
func notifyListener(ctx context.Context, x any, id checkpoint.ID, complete bool) error {
	l, ok := x.(checkpoint.Listener)
	if !ok {
		return nil
	}
	if complete {
		return l.NotifyCheckpointComplete(ctx, id)
	}
	return l.NotifyCheckpointAborted(ctx, id)
}

// sourceInstance runs a user Source.
type sourceInstance[T any] struct {
	src     Source[T]
	out     pushFn[T]
	c       *sourceCollector[T]
	wms     *sourceWatermarks[T]
	oc      *OperatorContext
	records *atomic.Int64 // c.n, published
	first   *atomic.Int64 // when c.n first went above 0, published (nil: not kept)
}

func (s *sourceInstance[T]) input() any { return nil }

// publishRecords publishes the records emitted so far and, the first time
// there are some, when: a recovery's source re-open ends with it.
func (s *sourceInstance[T]) publishRecords() {
	if s.records.Swap(s.c.n) == 0 && s.c.n > 0 && s.first != nil {
		s.first.Store(time.Now().UnixNano())
	}
}

// setMarkEmitter gives the source's watermark machinery the way to send
// watermarks and status through the chain and the outputs, and to read the
// task's back-pressure counter.
func (s *sourceInstance[T]) setMarkEmitter(emit func(envelope) error, backPressured func() time.Duration) {
	s.wms.emit, s.wms.readPressure = emit, backPressured
}

// poll runs one Poll, then the watermark machinery: the periodic watermark
// and idleness after a Poll, the final watermark at the end of the input.
func (s *sourceInstance[T]) poll(ctx context.Context) error {
	if err := s.wms.resume(); err != nil {
		return err
	}
	before := s.c.n
	err := s.src.Poll(ctx, s.c)
	if perr := s.c.take(); perr != nil {
		return perr
	}
	if werr := s.wms.take(); werr != nil {
		return werr
	}
	if errors.Is(err, ErrEndOfInput) {
		if werr := s.wms.end(); werr != nil {
			return werr
		}
		return err
	}
	if err != nil {
		return err
	}
	if s.wms.strategy {
		return s.wms.afterPoll(time.Now(), s.c.n-before)
	}
	return nil
}

// drain emits the final watermark of a stop-with-savepoint with drain
// (the task polls no more after it). A source that ended emitted it
// already: a watermark never goes back.
func (s *sourceInstance[T]) drain() error { return s.wms.end() }

func (s *sourceInstance[T]) snapshot(ctx context.Context, id checkpoint.ID) (checkpoint.OperatorSnapshot, func() (map[int][]byte, error), error) {
	st, err := s.src.Snapshot(ctx, id)
	return checkpoint.OperatorSnapshot{State: st.Entries, Handles: st.Handles, Watermark: s.wms.snapshotWatermark()}, nil, err
}

func (s *sourceInstance[T]) restore(st *SubtaskState) error {
	s.wms.restore(st.Watermark)
	return nil
}

func (s *sourceInstance[T]) hasRestoreCommitter() bool { return isRestoreCommitter(s.src) }
func (s *sourceInstance[T]) mustCommitRestored() bool  { return hasHandlesToCommit(s.oc) }
func (s *sourceInstance[T]) commitRestored(ctx context.Context) error {
	return callCommitRestored(ctx, s.src, s.oc)
}

func (s *sourceInstance[T]) open(ctx context.Context) error {
	s.c = &sourceCollector[T]{collector: collector[T]{push: s.out}, now: s.oc.recordTime()}
	if s.wms.strategy {
		s.c.wms = s.wms
		s.wms.useFrontier(s.src)
	}
	return s.src.Open(ctx, s.oc)
}

func (s *sourceInstance[T]) notify(ctx context.Context, id checkpoint.ID, complete bool) error {
	return notifyListener(ctx, s.src, id, complete)
}

func (s *sourceInstance[T]) close() error { return s.src.Close() }
func (s *sourceInstance[T]) user() any    { return s.src }

// sourceCollector is the TimestampCollector of a source: it sets the
// task's record timestamp before it pushes.
type sourceCollector[T any] struct {
	collector[T]
	now *recordTime
	wms *sourceWatermarks[T] // nil: no WatermarkStrategy
}

// Collect implements Collector: a record without a timestamp.
func (c *sourceCollector[T]) Collect(v T) { c.CollectWithTimestamp(v, NoTimestamp) }

// CollectWithTimestamp implements TimestampCollector.
func (c *sourceCollector[T]) CollectWithTimestamp(v T, ts int64) {
	if c.wms == nil {
		c.now.ts = ts
		c.collector.Collect(v)
		return
	}
	ts = c.wms.assign(v, ts)
	c.now.ts = ts
	c.collector.Collect(v)
	c.wms.observe(v, ts)
}

// CollectFromSplit implements SplitCollector.
func (c *sourceCollector[T]) CollectFromSplit(split string, v T, ts int64) {
	if c.wms == nil {
		c.now.ts = ts
		c.collector.Collect(v)
		return
	}
	ts = c.wms.assign(v, ts)
	c.now.ts = ts
	c.collector.Collect(v)
	c.wms.observeSplit(split, v, ts)
}

// SetSplits implements SplitCollector.
func (c *sourceCollector[T]) SetSplits(splits []string) {
	if c.wms != nil {
		c.wms.setSplits(splits)
	}
}

// SplitPending implements SplitCollector.
func (c *sourceCollector[T]) SplitPending(split string) {
	if c.wms != nil {
		c.wms.pendingSplit(split)
	}
}

var _ SplitCollector[int] = (*sourceCollector[int])(nil)

// sinkInstance runs a user Sink.
type sinkInstance[T any] struct {
	sink    Sink[T]
	oc      *OperatorContext
	ctx     context.Context
	written int64         // since the last publishRecords
	records *atomic.Int64 // written, published
}

func newSinkInstance[T any](sink Sink[T], oc *OperatorContext) *sinkInstance[T] {
	return &sinkInstance[T]{sink: sink, oc: oc, records: oc.countRecords()}
}

func (s *sinkInstance[T]) input() any {
	return withFailpoint(s.oc.Failpoints, pushFn[T](func(v T) error {
		if err := s.sink.Write(s.ctx, v); err != nil {
			return err
		}
		s.written++
		return nil
	}))
}

func (s *sinkInstance[T]) publishRecords() {
	if s.written != 0 {
		s.records.Add(s.written)
		s.written = 0
	}
}

func (s *sinkInstance[T]) snapshot(ctx context.Context, id checkpoint.ID) (checkpoint.OperatorSnapshot, func() (map[int][]byte, error), error) {
	st, err := s.sink.Snapshot(ctx, id)
	return checkpoint.OperatorSnapshot{State: st.Entries, Handles: st.Handles}, nil, err
}

func (s *sinkInstance[T]) restore(*SubtaskState) error { return nil }

func (s *sinkInstance[T]) hasRestoreCommitter() bool { return isRestoreCommitter(s.sink) }
func (s *sinkInstance[T]) mustCommitRestored() bool  { return hasHandlesToCommit(s.oc) }
func (s *sinkInstance[T]) commitRestored(ctx context.Context) error {
	return callCommitRestored(ctx, s.sink, s.oc)
}

func (s *sinkInstance[T]) open(ctx context.Context) error {
	s.ctx = ctx
	return s.sink.Open(ctx, s.oc)
}

func (s *sinkInstance[T]) notify(ctx context.Context, id checkpoint.ID, complete bool) error {
	return notifyListener(ctx, s.sink, id, complete)
}

func (s *sinkInstance[T]) close() error { return s.sink.Close() }
func (s *sinkInstance[T]) user() any    { return s.sink }

// keyedInstance runs a KeyedProcessFunction or a KeyedProcessor over its
// key groups, with their timers.
type keyedInstance[K comparable, T, U any] struct {
	name    string
	ks      *KeyedStream[K, T]
	fn      keyedFunction[K, T, U]
	hash    func(K) uint32
	maxPar  int
	backend *keyedBackend[K]
	c       *collector[U]
	oc      *OperatorContext
	owned   map[int]bool
	// native are the native snapshots to restore the pebble instance from
	// (restore, then open).
	native []*checkpoint.NativeState
	now    *recordTime
	kctx   *KeyedContext[K]
	// late counts records that arrived with a timestamp at or below the
	// operator's input watermark.
	late atomic.Int64
}

func newKeyedInstance[K comparable, T, U any](name string, ks *KeyedStream[K, T], fn keyedFunction[K, T, U],
	hash func(K) uint32, maxPar int, oc *OperatorContext, out pushFn[U]) *keyedInstance[K, T, U] {
	owned := map[int]bool{}
	for _, kg := range KeyGroupRange(oc.Subtask, maxPar, oc.Parallelism) {
		owned[kg] = true
	}
	k := &keyedInstance[K, T, U]{name: name, ks: ks, fn: fn, hash: hash, maxPar: maxPar,
		backend: newKeyedBackend[K](ks.codec, maxPar), c: &collector[U]{push: out}, oc: oc, owned: owned, now: oc.recordTime()}
	k.kctx = &KeyedContext[K]{host: k.backend.timers, now: k.now, side: sideOutputs{pushes: oc.sides, catchAll: oc.sideAny}}
	if oc.clock != nil {
		k.backend.timers.clock = oc.clock
	}
	if fn.proc != nil {
		k.backend.timers.onTimer = k.onTimer
	}
	return k
}

func (k *keyedInstance[K, T, U]) input() any {
	return withFailpoint(k.oc.Failpoints, pushFn[T](func(v T) error {
		key := k.ks.key(v)
		return k.process(key, v, int(k.hash(key)%uint32(k.maxPar)))
	}))
}

// inputWithKeyGroup is input for a record whose key group the sender
// already computed (a hash edge within the process).
func (k *keyedInstance[K, T, U]) inputWithKeyGroup() any {
	push := func(v T, kg int) error { return k.process(k.ks.key(v), v, kg) }
	if fp := k.oc.Failpoints; fp != nil {
		return func(v T, kg int) error {
			if err := fp.Inject(failpointProcess); err != nil {
				return err
			}
			return push(v, kg)
		}
	}
	return push
}

func (k *keyedInstance[K, T, U]) process(key K, v T, kg int) error {
	k.backend.scope.setKey(key, kg)
	if ts := k.now.ts; ts != NoTimestamp && ts <= k.backend.timers.watermark {
		k.late.Add(1)
	}
	var err error
	if k.fn.proc != nil {
		err = k.fn.proc.ProcessElement(k.kctx, v, k.c)
	} else {
		err = k.fn.fn.Process(key, v, k.c)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", k.name, err)
	}
	if err := k.kctx.side.take(); err != nil {
		return fmt.Errorf("%s: %w", k.name, err)
	}
	return k.c.take()
}

// onTimer runs the processor's OnTimer for a firing timer, its key in scope
// and the record timestamp of what it emits set.
func (k *keyedInstance[K, T, U]) onTimer(f *firingTimer) error {
	saved := k.now.ts
	defer func() { k.now.ts = saved }()
	if f.domain == EventTime {
		k.now.ts = f.ts
	} else {
		k.now.ts = NoTimestamp
	}
	if err := k.fn.proc.OnTimer(k.kctx, f.ts, k.c); err != nil {
		return fmt.Errorf("%s: %s timer %d: %w", k.name, f.domain, f.ts, err)
	}
	if err := k.kctx.side.take(); err != nil {
		return fmt.Errorf("%s: %w", k.name, err)
	}
	return k.c.take()
}

// advanceWatermark implements watermarkHandler: event-time timers fire.
func (k *keyedInstance[K, T, U]) advanceWatermark(_ context.Context, wm int64) error {
	return k.backend.timers.advanceWatermark(wm)
}

// hasTimers says whether the operator runs a KeyedProcessor (with timers).
func (k *keyedInstance[K, T, U]) hasTimers() bool { return k.fn.proc != nil }

// fireProcessingTime fires the processing-time timers due at now (epoch ms).
func (k *keyedInstance[K, T, U]) fireProcessingTime(now int64) error {
	return k.backend.timers.fireProcessingTime(now)
}

// nextProcessingTime is the earliest processing-time timer; changed says
// whether one was registered or restored since the last call.
func (k *keyedInstance[K, T, U]) nextProcessingTime() (ts int64, ok, changed bool) {
	h := k.backend.timers
	changed, h.procChanged = h.procChanged, false
	ts, ok = h.nextProcessingTime()
	return ts, ok, changed
}

// snapshot takes a native snapshot of a pebble instance when the
// deployment has checkpoint storage to upload its files to (and no state
// restored from canonical blobs waits to be declared again: only the
// canonical snapshot carries it); the canonical one otherwise. The heap
// backend's canonical snapshot is encoded as it is written (Encode, see
// keyedBackend.encoder); a pebble instance's is encoded by the task's
// asynchronous part, while the instance is open.
func (k *keyedInstance[K, T, U]) snapshot(_ context.Context, id checkpoint.ID) (checkpoint.OperatorSnapshot, func() (map[int][]byte, error), error) {
	p := k.backend.pebble
	if p != nil && k.oc.stateStorage != nil && len(k.backend.restored) == 0 {
		n, err := p.nativeSnapshot(id)
		if err != nil {
			return checkpoint.OperatorSnapshot{}, nil, fmt.Errorf("%w: %s: native snapshot: %w", checkpoint.ErrDeclined, k.name, err)
		}
		return checkpoint.OperatorSnapshot{MaxParallelism: k.maxPar, Native: n}, nil, nil
	}
	if p == nil {
		return checkpoint.OperatorSnapshot{MaxParallelism: k.maxPar, Encode: k.backend.encoder()}, nil, nil
	}
	return checkpoint.OperatorSnapshot{MaxParallelism: k.maxPar}, k.backend.snapshot(), nil
}

// keyGroupSpan is the subtask's key groups [lo, hi).
func (k *keyedInstance[K, T, U]) keyGroupSpan() (lo, hi int) {
	return KeyGroupSpan(k.oc.Subtask, k.maxPar, k.oc.Parallelism)
}

// restoreDecoded restores native snapshots through their canonical blobs
// (a heap backend, or snapshots whose states do not line up).
func (k *keyedInstance[K, T, U]) restoreDecoded(ctx context.Context, handles []*checkpoint.NativeState) error {
	for _, n := range handles {
		kgs, err := DecodeNativeState(ctx, k.oc.stateStorage, n)
		if err != nil {
			return fmt.Errorf("%s: restore native state of key groups [%d, %d): %w", k.name, n.KeyGroupStart, n.KeyGroupEnd, err)
		}
		if err := k.restore(&SubtaskState{KeyGroups: kgs}); err != nil {
			return err
		}
	}
	return nil
}

func (k *keyedInstance[K, T, U]) restore(r *SubtaskState) error {
	if len(r.Native) > 0 {
		if k.oc.stateBackend != PebbleState {
			// A heap job decodes a pebble job's native checkpoint.
			if err := k.restoreDecoded(context.Background(), r.Native); err != nil {
				return err
			}
		} else {
			k.native = r.Native
		}
	}
	for kg, blob := range r.KeyGroups {
		if !k.owned[kg] {
			continue
		}
		if err := k.backend.restoreKeyGroup(kg, blob); err != nil {
			return fmt.Errorf("%s: restore: %w", k.name, err)
		}
	}
	return nil
}

func (k *keyedInstance[K, T, U]) open(ctx context.Context) error {
	if k.oc.stateBackend == PebbleState {
		if k.oc.stateMem == nil {
			return Unrecoverable(fmt.Errorf("%s: the pebble state backend needs the task manager's state memory", k.name))
		}
		name := fmt.Sprintf("%s-%s-%d", k.oc.Job, k.oc.UID, k.oc.Subtask)
		lo, hi := k.keyGroupSpan()
		p, err := k.oc.stateMem.openInstanceFrom(ctx, name, k.maxPar, lo, hi, k.oc.stateShare, k.oc.stateStorage, k.native)
		if errors.Is(err, errNativeMismatch) {
			p, err = k.oc.stateMem.openInstanceFrom(ctx, name, k.maxPar, lo, hi, k.oc.stateShare, nil, nil)
			if err == nil {
				k.backend.usePebble(p)
				err = k.restoreDecoded(ctx, k.native)
			}
		} else if err == nil {
			k.backend.usePebble(p)
		}
		k.native = nil
		if err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
		k.oc.Metrics().Gauge("stateSizeOnDiskBytes", "Size on disk of the operator subtask's pebble state instance.",
			func() float64 { return float64(p.diskUsage()) })
	}
	st := &StateRegistry[K]{b: k.backend, oc: k.oc}
	if k.fn.proc != nil {
		t, err := NewTimers[struct{}](st, "", Codec[struct{}](voidCodec{}))
		if err != nil {
			return err
		}
		k.kctx.service = keyTimerService[K]{t: t}
	}
	k.oc.Metrics().Counter("numLateRecords_total", "Records that reached the keyed operator with an event timestamp at or below its input watermark (late); none is dropped here.",
		func() float64 { return float64(k.late.Load()) })
	return k.fn.open(ctx, st)
}

func (k *keyedInstance[K, T, U]) notify(ctx context.Context, id checkpoint.ID, complete bool) error {
	return notifyListener(ctx, k.fn.user(), id, complete)
}

func (k *keyedInstance[K, T, U]) close() error { return k.backend.close() }
func (k *keyedInstance[K, T, U]) user() any    { return k.fn.user() }
