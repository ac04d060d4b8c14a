package runtime

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
)

type ctrlKind int

const (
	ctrlTrigger ctrlKind = iota + 1 // sources only
	ctrlComplete
	ctrlAbort
)

// control is a message from the executor to one task.
type control struct {
	kind ctrlKind
	id   checkpoint.ID
	// final marks a trigger sent after every source ended: once it
	// completes, sources end their streams. drain marks the trigger of a
	// stop-with-savepoint with drain: the source stops reading and emits
	// MaxWatermark before the barrier.
	final bool
	drain bool
}

// reporter is how a task talks back to whoever runs it.
type reporter interface {
	// ack acknowledges checkpoint id; the reporter ends the asynchronous
	// part's time (t.syncEnd on) when the snapshot is ready to be sent.
	ack(task checkpoint.TaskID, id checkpoint.ID, snap checkpoint.TaskSnapshot, t snapshotTiming)
	decline(task checkpoint.TaskID, id checkpoint.ID, err error)
	sourceEnded(task checkpoint.TaskID)
	// failed reports a failure of the task outside its goroutine (e.g. in
	// its asynchronous snapshot).
	failed(task checkpoint.TaskID, err error)
	// lastCompleted is the job's latest completed checkpoint.
	lastCompleted() checkpoint.ID
}

type inputChan struct {
	ch      chan envelope
	deliver func(batcher) (int, error) // into the task's head (edge.bind)
}

// task is one subtask of a vertex: a chain of operator instances driven by
// one goroutine.
type task struct {
	id      checkpoint.TaskID
	v       *vertex
	subtask int
	ops     []instance
	inputs  []inputChan
	outs    []outputGate
	ctrl    chan control
	// interrupt fires when a control message is sent (OperatorContext.Interrupt);
	// source tasks only (a send to nil is skipped).
	interrupt chan struct{}
	rep       reporter
	log       *zap.Logger
	stats     *taskStats
	// now is the event timestamp of the record being processed, shared by
	// the chain and the output writers.
	now *recordTime
	// publishers are the chain's instances that count records in a plain
	// field; publishRecords hands their counts to stats.
	publishers []recordPublisher

	aligner    *aligner        // barrier alignment (pure state machine)
	valve      *watermarkValve // input watermark and status (pure state machine)
	seq        sequencer       // per-task checkpoint logic (pure state machine)
	alignStart time.Time
	async      sync.WaitGroup
	// drained is the stop-with-savepoint with drain this source task
	// stopped reading for (0: none): it polls no more.
	drained checkpoint.ID

	// Processing-time timers of the chain's keyed operators: wake fires at
	// the earliest (wakeAt, epoch ms); nil when the chain has none.
	timed  []processingTimeHandler
	wake   *time.Timer
	wakeC  <-chan time.Time
	wakeAt int64
	armed  bool
}

// processingTimeHandler is an instance with processing-time timers.
type processingTimeHandler interface {
	hasTimers() bool
	// nextProcessingTime is the earliest timer; changed: one was
	// registered or restored since the last call.
	nextProcessingTime() (ts int64, ok, changed bool)
	fireProcessingTime(now int64) error
}

// armProcessingTime sets the wake-up to the chain's earliest
// processing-time timer.
func (t *task) armProcessingTime() {
	if len(t.timed) == 0 {
		return
	}
	next, any, changed := int64(0), false, false
	for _, h := range t.timed {
		ts, ok, c := h.nextProcessingTime()
		changed = changed || c
		if ok && (!any || ts < next) {
			next, any = ts, true
		}
	}
	if !any || (t.armed && next == t.wakeAt && !changed) {
		return
	}
	t.wakeAt, t.armed = next, true
	t.wake.Reset(time.Until(time.UnixMilli(next)))
}

// fireProcessingTime fires the chain's due processing-time timers.
func (t *task) fireProcessingTime() error {
	t.armed = false
	now := time.Now().UnixMilli()
	for _, h := range t.timed {
		if err := h.fireProcessingTime(now); err != nil {
			return err
		}
	}
	t.armProcessingTime()
	return nil
}

// panicError is a task's recovered panic with its stack.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("panic: %v\n%s", p.value, p.stack) }

// recoverInto turns a panic of the calling function into *err (deferred).
func recoverInto(err *error) {
	if r := recover(); r != nil {
		*err = &panicError{value: r, stack: debug.Stack()}
	}
}

// closeOps closes every operator of the chain, tail first, each one even if
// another failed or panicked.
func (t *task) closeOps() error {
	var errs []error
	for i := len(t.ops) - 1; i >= 0; i-- {
		if t.ops[i] == nil {
			continue
		}
		if err := closeOp(t.ops[i]); err != nil {
			errs = append(errs, fmt.Errorf("task %s: close %s: %w", t.id, t.v.nodes[i].name, err))
		}
	}
	return errors.Join(errs...)
}

// notifyCanceled tells every operator that is a checkpoint.CancelListener
// that the job ends for good, with its latest completed checkpoint. A
// failure is logged (and returned): the job is over, and what an operator
// could not end ends at the broker's transaction timeout.
func (t *task) notifyCanceled() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	last := t.rep.lastCompleted()
	var errs []error
	for i, op := range t.ops {
		if op == nil {
			continue
		}
		l, ok := op.user().(checkpoint.CancelListener)
		if !ok {
			continue
		}
		if err := notifyCanceledSafely(ctx, l, last); err != nil {
			t.log.Warn("ending a cancelled job's transactions failed; they end at the broker's transaction timeout",
				zap.String("operator", t.v.nodes[i].name), zap.Error(err))
			errs = append(errs, fmt.Errorf("task %s: %s: %w", t.id, t.v.nodes[i].name, err))
		}
	}
	return errors.Join(errs...)
}

func notifyCanceledSafely(ctx context.Context, l checkpoint.CancelListener, last checkpoint.ID) (err error) {
	defer recoverInto(&err)
	return l.NotifyJobCanceled(ctx, last)
}

func closeOp(op instance) (err error) {
	defer recoverInto(&err)
	return op.close()
}

// run executes the task until its input ends, an error, or ctx is done.
// ready is called once every operator is open and restored; sources then
// wait for start before reading.
func (t *task) run(ctx context.Context, restore []*SubtaskState, ready func(), start <-chan struct{}) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("task %s: %w", t.id, &panicError{value: r, stack: debug.Stack()})
		}
		if errors.Is(context.Cause(ctx), ErrJobCanceled) {
			_ = t.notifyCanceled() // logged
		}
		if cerr := t.closeOps(); cerr != nil && err == nil {
			err = cerr
		}
		t.async.Wait()
	}()
	if err := t.openOps(ctx, restore); err != nil {
		return err
	}
	ready()
	if t.v.isSource() {
		select {
		case <-start:
		case <-ctx.Done():
			return ctx.Err()
		}
		if m, ok := t.ops[0].(interface {
			setMarkEmitter(func(envelope) error, func() time.Duration)
		}); ok {
			m.setMarkEmitter(func(e envelope) error {
				if e.mark == markWatermark {
					return t.advanceWatermark(ctx, e.wm)
				}
				return t.event(ctx, e)
			}, func() time.Duration { return time.Duration(t.stats.backPressuredNs.Load()) })
		}
		err = t.runSource(ctx)
	} else {
		err = t.runInputs(ctx)
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("task %s: %w", t.id, err)
	}
	return err
}

// openOps restores and opens the chain's operators, head first: the
// restore path (it commits the restored checkpoint's transactions and
// aborts later ones, in the operators that hold any).
func (t *task) openOps(ctx context.Context, restore []*SubtaskState) error {
	for i, op := range t.ops {
		if restore[i] != nil {
			if err := op.restore(restore[i]); err != nil {
				return fmt.Errorf("task %s: restore %s: %w", t.id, t.v.nodes[i].name, err)
			}
		}
		if err := op.open(ctx); err != nil {
			return fmt.Errorf("task %s: open %s: %w", t.id, t.v.nodes[i].name, err)
		}
	}
	return nil
}

// end ends the task of a job cancelled while no attempt ran it: the restore
// path (openOps), then the path of a cancel for good (notifyCanceled with
// the latest completed checkpoint), then Close; no record is read. Every
// step runs even if an earlier one failed; the errors are joined.
func (t *task) end(ctx context.Context, restore []*SubtaskState) error {
	oerr := func() (err error) {
		defer recoverInto(&err)
		return t.openOps(ctx, restore)
	}()
	nerr := t.notifyCanceled()
	return errors.Join(oerr, nerr, t.closeOps())
}

func (t *task) runSource(ctx context.Context) error {
	src := t.ops[0].(interface{ poll(context.Context) error })
	ended := false
	defer t.publishRecords()
	for {
		// What the last round wrote is published before the next wait:
		// a chained sink also writes on a checkpoint's or a drain's
		// control message (the final watermark fires its windows).
		t.publishRecords()
		if err := ctx.Err(); err != nil {
			return err
		}
		// Control first: barriers go in between two polls. The interrupt
		// is taken first, so that it fires again only for a message
		// this drain does not see.
		select {
		case <-t.interrupt:
		default:
		}
		for drained := false; !drained; {
			select {
			case c := <-t.ctrl:
				if done, err := t.handleControl(ctx, c); err != nil || done {
					return err
				}
			default:
				drained = true
			}
		}
		if ended || t.drained != 0 {
			select {
			case c := <-t.ctrl:
				if done, err := t.handleControl(ctx, c); err != nil || done {
					return err
				}
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		err := src.poll(ctx)
		t.publishRecords()
		if errors.Is(err, ErrEndOfInput) {
			ended = true
			t.seq.endOfSource()
			t.rep.sourceEnded(t.id)
		} else if err != nil {
			return err
		}
		if err := t.flush(ctx); err != nil {
			return err
		}
	}
}

// handleControl feeds one control message to the sequencer and executes
// what it decides; done reports that the task ended its stream.
func (t *task) handleControl(ctx context.Context, c control) (done bool, err error) {
	switch c.kind {
	case ctrlTrigger:
		if c.drain {
			if err := t.drain(c.id); err != nil {
				return false, err
			}
		}
		return t.execute(ctx, t.seq.trigger(c.id, c.final), 0)
	case ctrlAbort:
		if t.drained != 0 && c.id == t.drained {
			// The final watermark went out: reading on would make every
			// later record late. The job fails over to its latest
			// checkpoint, before the drain; what the drain fired is in
			// the aborted checkpoint's transactions, rolled back.
			return false, fmt.Errorf("%w: checkpoint %d was aborted", ErrDrainAborted, c.id)
		}
		return t.execute(ctx, t.seq.notify(c.id, false), 0)
	case ctrlComplete:
		return t.execute(ctx, t.seq.notify(c.id, true), 0)
	}
	return false, nil
}

// ErrDrainAborted fails a job whose stop-with-savepoint with drain failed
// (aborted, or not written out) after its sources emitted the final
// watermark: it restarts from its latest completed checkpoint, as after
// any failure, and reads on.
var ErrDrainAborted = errors.New("stop --drain: the savepoint failed after the sources emitted the final watermark; the job fails over to its latest checkpoint")

// drain stops the source task reading for the stop-with-savepoint with
// drain id: it emits MaxWatermark (through the chain and out), so that
// every event-time window and timer downstream fires before the
// savepoint's barrier, which follows it in band. A source that already
// ended emitted it at its end.
func (t *task) drain(id checkpoint.ID) error {
	d, ok := t.ops[0].(interface{ drain() error })
	if !ok || t.drained != 0 {
		return nil
	}
	t.drained = id
	return d.drain()
}

// execute carries out the sequencer's actions.
func (t *task) execute(ctx context.Context, acts []seqAction, alignment time.Duration) (done bool, err error) {
	for _, a := range acts {
		switch a.kind {
		case seqSnapshot:
			err = t.checkpoint(ctx, a.id, alignment)
		case seqNotify:
			err = t.notify(ctx, a.id, a.complete)
		case seqEnd:
			err, done = t.event(ctx, envelope{eos: true}), true
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (t *task) runInputs(ctx context.Context) error {
	t.aligner = newAligner(len(t.inputs))
	t.valve = newWatermarkValve(len(t.inputs))
	for _, op := range t.ops {
		if h, ok := op.(processingTimeHandler); ok && h.hasTimers() {
			t.timed = append(t.timed, h)
		}
	}
	if len(t.timed) > 0 {
		t.wake = time.NewTimer(time.Hour)
		t.wake.Stop()
		t.wakeC = t.wake.C
		defer t.wake.Stop()
		t.armProcessingTime()
	}
	sel := newSelector(t)
	defer t.publishRecords()
	for t.aligner.live() > 0 {
		// What the last element made the chain write is published
		// before the next wait, whatever the element was: a sink writes
		// what a watermark, a processing-time timer or the end of input
		// fired as well as what a batch brought.
		t.publishRecords()
		idx, e, c, err := sel.next(ctx)
		if err != nil {
			return err
		}
		if idx == wakeInput {
			if err := t.fireProcessingTime(); err != nil {
				return err
			}
			continue
		}
		if idx < 0 {
			if _, err := t.handleControl(ctx, c); err != nil {
				return err
			}
			continue
		}
		switch {
		case e.batch != nil:
			n, err := t.inputs[idx].deliver(e.batch)
			t.stats.in.Add(int64(n))
			if err != nil {
				return err
			}
			t.armProcessingTime()
		case e.barrier != 0:
			if err := t.align(ctx, t.aligner.onBarrier(idx, e.barrier)); err != nil {
				return err
			}
		case e.mark != 0:
			var acts []valveAction
			switch e.mark {
			case markWatermark:
				acts = t.valve.watermark(idx, e.wm)
			case markIdle:
				acts = t.valve.idleChannel(idx)
			case markActive:
				acts = t.valve.active(idx)
			}
			if err := t.forwardMarks(ctx, acts); err != nil {
				return err
			}
			t.armProcessingTime()
		case e.eos:
			if err := t.forwardMarks(ctx, t.valve.ended(idx)); err != nil {
				return err
			}
			if err := t.align(ctx, t.aligner.onEnd(idx)); err != nil {
				return err
			}
		}
		sel.update()
	}
	// Every input ended: the stream ends once the last snapshot is resolved.
	done, err := t.execute(ctx, t.seq.endOfInputs(), 0)
	for !done && err == nil {
		t.publishRecords()
		select {
		case c := <-t.ctrl:
			done, err = t.handleControl(ctx, c)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

// watermarkHandler is an instance that acts when its input watermark
// advances (a keyed operator fires its event-time timers). It runs on the
// task goroutine; what it emits reaches the rest of the chain before the
// watermark does.
type watermarkHandler interface {
	advanceWatermark(ctx context.Context, wm int64) error
}

// forwardMarks carries out the valve's actions.
func (t *task) forwardMarks(ctx context.Context, acts []valveAction) error {
	for _, a := range acts {
		var err error
		if a.Kind == markWatermark {
			err = t.advanceWatermark(ctx, a.TS)
		} else {
			err = t.event(ctx, envelope{mark: a.Kind})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// advanceWatermark hands watermark wm to the chain's operators, head first,
// then sends it on every output.
func (t *task) advanceWatermark(ctx context.Context, wm int64) error {
	t.stats.inputWatermark.Store(wm)
	for i, op := range t.ops {
		if h, ok := op.(watermarkHandler); ok {
			if err := h.advanceWatermark(ctx, wm); err != nil {
				return fmt.Errorf("%s: watermark %d: %w", t.v.nodes[i].name, wm, err)
			}
		}
	}
	t.stats.outputWatermark.Store(wm)
	return t.event(ctx, envelope{mark: markWatermark, wm: wm})
}

func (t *task) align(ctx context.Context, acts []alignAction) error {
	for _, a := range acts {
		switch a.Kind {
		case alignBlock:
			if t.alignStart.IsZero() {
				t.alignStart = time.Now()
			}
		case alignAbort:
			t.alignStart = time.Time{}
			t.rep.decline(t.id, a.ID, fmt.Errorf("%w: alignment overtaken by a newer barrier", checkpoint.ErrDeclined))
		case alignDecline:
			t.rep.decline(t.id, a.ID, fmt.Errorf("%w: barrier arrived after a newer one", checkpoint.ErrDeclined))
		case alignSnapshot:
			var alignment time.Duration
			if !t.alignStart.IsZero() {
				alignment = time.Since(t.alignStart)
				t.alignStart = time.Time{}
			}
			if _, err := t.execute(ctx, t.seq.aligned(a.ID), alignment); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkpoint snapshots every operator of the chain (synchronous part),
// forwards the barrier, and acknowledges once the asynchronous parts are done.
func (t *task) checkpoint(ctx context.Context, id checkpoint.ID, alignment time.Duration) error {
	timing := snapshotTiming{alignment: alignment}
	syncStart := time.Now()
	snap := checkpoint.TaskSnapshot{Task: t.id, Operators: make([]checkpoint.OperatorSnapshot, len(t.ops))}
	asyncs := make([]func() (map[int][]byte, error), len(t.ops))
	var declined error
	for i, op := range t.ops {
		s, async, err := op.snapshot(ctx, id)
		if err != nil {
			if !errors.Is(err, checkpoint.ErrDeclined) {
				return fmt.Errorf("snapshot %s for checkpoint %d: %w", t.v.nodes[i].name, id, err)
			}
			declined = err
			break
		}
		s.UID, s.Subtask, s.Parallelism = t.v.nodes[i].uid, t.subtask, t.v.parallelism
		snap.Operators[i], asyncs[i] = s, async
	}
	timing.syncEnd = time.Now()
	timing.sync = timing.syncEnd.Sub(syncStart)
	// The barrier goes on even when declined: downstream alignment must not
	// wait for a barrier that never comes; the decline aborts the checkpoint.
	if err := t.event(ctx, envelope{barrier: id}); err != nil {
		return err
	}
	if declined != nil {
		t.rep.decline(t.id, id, declined)
		return nil
	}
	encoded := slices.ContainsFunc(snap.Operators, func(o checkpoint.OperatorSnapshot) bool { return o.Encode != nil })
	if !encoded && !slices.ContainsFunc(asyncs, func(f func() (map[int][]byte, error)) bool { return f != nil }) {
		t.rep.ack(t.id, id, snap, timing) // nothing asynchronous: no goroutine to wait for
		yieldToCheckpoint()
		return nil
	}
	t.async.Add(1)
	defer yieldToCheckpoint()
	go func() {
		defer t.async.Done()
		for i, async := range asyncs {
			if async == nil {
				continue
			}
			kgs, err := runAsyncSnapshot(async)
			var pe *panicError
			if errors.As(err, &pe) {
				// A codec or user code panicked: a task failure, not a
				// declined checkpoint.
				t.rep.failed(t.id, fmt.Errorf("task %s: async snapshot of %s for checkpoint %d: %w", t.id, t.v.nodes[i].name, id, err))
				return
			}
			if err != nil {
				t.rep.decline(t.id, id, fmt.Errorf("%w: async snapshot of %s: %w", checkpoint.ErrDeclined, t.v.nodes[i].name, err))
				return
			}
			snap.Operators[i].KeyGroups = kgs
		}
		// Operators' Encode runs in the reporter's ack: as the state is
		// written to checkpoint storage, or here (encodeSnapshot).
		t.rep.ack(t.id, id, snap, timing)
	}()
	return nil
}

// encodeSnapshot runs the Encode of snap's operators (the snapshot goes
// inline: no checkpoint storage) and reports an error as the asynchronous
// part's: a task failure for a panic (a codec's), a decline otherwise;
// false then.
func encodeSnapshot(rep reporter, task checkpoint.TaskID, id checkpoint.ID, snap checkpoint.TaskSnapshot) bool {
	err := snap.EncodeKeyGroups()
	if err == nil {
		return true
	}
	reportAsyncError(rep, task, id, err)
	return false
}

// reportAsyncError reports err of the asynchronous part of task's snapshot
// for checkpoint id: a task failure if a codec or user code panicked, a
// declined checkpoint otherwise.
func reportAsyncError(rep reporter, task checkpoint.TaskID, id checkpoint.ID, err error) {
	var pe *panicError
	if errors.As(err, &pe) {
		rep.failed(task, fmt.Errorf("task %s: async snapshot for checkpoint %d: %w", task, id, err))
		return
	}
	rep.decline(task, id, fmt.Errorf("%w: async snapshot: %w", checkpoint.ErrDeclined, err))
}

// SnapshotTimes are the durations of one task's part in a checkpoint, as
// Flink's checkpoint statistics report them per subtask.
type SnapshotTimes struct {
	// Alignment is how long the task waited for the checkpoint's barrier
	// on its other inputs after the first one arrived (0 with one input).
	Alignment time.Duration
	// Sync is the synchronous part: every operator of the chain
	// snapshotting its state at the barrier (the heap backend's
	// copy-on-write freeze, pebble's snapshot), while the task processes
	// nothing else.
	Sync time.Duration
	// Async is the asynchronous part, from the end of Sync until the
	// acknowledgement is sent: encoding the frozen state and writing it to
	// checkpoint storage, while the task processes records again.
	Async time.Duration
}

// snapshotTiming is a checkpoint's times as the task hands them to its
// reporter: the asynchronous part ends when the reporter sends the ack.
type snapshotTiming struct {
	alignment, sync time.Duration
	syncEnd         time.Time
}

// times ends the asynchronous part now.
func (s snapshotTiming) times() SnapshotTimes {
	t := SnapshotTimes{Alignment: s.alignment, Sync: s.sync}
	if !s.syncEnd.IsZero() {
		t.Async = max(time.Since(s.syncEnd), 0)
	}
	return t
}

// yieldToCheckpoint lets the goroutines a snapshot just started (its
// asynchronous part, the acknowledgement to the coordinator) run now: on a
// saturated machine they would otherwise wait for this busy task's time
// slice to end (up to 10 ms, at every hand-off of the checkpoint). Once
// per checkpoint per task.
func yieldToCheckpoint() { goruntime.Gosched() }

func runAsyncSnapshot(async func() (map[int][]byte, error)) (kgs map[int][]byte, err error) {
	defer recoverInto(&err)
	return async()
}

// notify delivers a completion or abort to every operator, tail first, so a
// sink commits the transaction a chained source's acknowledgements ride in
// before that source acts on them.
func (t *task) notify(ctx context.Context, id checkpoint.ID, complete bool) error {
	for i := len(t.ops) - 1; i >= 0; i-- {
		if err := t.ops[i].notify(ctx, id, complete); err != nil {
			kind := "aborted"
			if complete {
				kind = "complete"
			}
			return fmt.Errorf("%s: notify checkpoint %d %s: %w", t.v.nodes[i].name, id, kind, err)
		}
	}
	return nil
}

// publishRecords publishes the records the chain's publishers counted
// since the last call.
func (t *task) publishRecords() {
	for _, p := range t.publishers {
		p.publishRecords()
	}
}

func (t *task) flush(ctx context.Context) error {
	for _, o := range t.outs {
		if err := o.flush(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (t *task) event(ctx context.Context, e envelope) error {
	for _, o := range t.outs {
		if err := o.event(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// wakeInput is the selector's index for the processing-time wake-up.
const wakeInput = -4

// selector receives from the task's unblocked inputs and its control
// channel. Before blocking it flushes the task's outputs: records wait in a
// batch only while more input is ready.
type selector struct {
	t     *task
	cases []reflect.SelectCase
	idx   []int // case -> input index; wakeInput, -1 control, -2 ctx, -3 default
	stale bool
	// A task of up to staticInputs inputs selects without reflection
	// (reflect.Select boxed every envelope it received, an allocation per
	// batch, and cost about 4% of a two-input keyed task's CPU): in[i] is
	// input i's channel, nil while it is blocked for alignment or ended (a
	// nil channel is never ready).
	static bool
	in     [staticInputs]chan envelope
}

// staticInputs is the most inputs a task selects over without reflection.
const staticInputs = 4

func newSelector(t *task) *selector {
	s := &selector{t: t}
	s.update()
	return s
}

// update marks the case list for rebuilding after blocking changed.
func (s *selector) update() { s.stale = true }

func (s *selector) rebuild(ctx context.Context) {
	if len(s.t.inputs) <= staticInputs {
		s.static, s.stale = true, false
		for i := range s.in {
			s.in[i] = nil
			if i < len(s.t.inputs) && !s.t.aligner.ended[i] && !s.t.aligner.blocked(i) {
				s.in[i] = s.t.inputs[i].ch
			}
		}
		return
	}
	s.cases, s.idx = s.cases[:0], s.idx[:0]
	for i, in := range s.t.inputs {
		if s.t.aligner.ended[i] || s.t.aligner.blocked(i) {
			continue
		}
		s.cases = append(s.cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(in.ch)})
		s.idx = append(s.idx, i)
	}
	s.cases = append(s.cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.t.wakeC)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.t.ctrl)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectDefault})
	s.idx = append(s.idx, wakeInput, -1, -2, -3)
	s.stale = false
}

func (s *selector) next(ctx context.Context) (int, envelope, control, error) {
	if len(s.t.inputs) == 1 && !s.t.aligner.ended[0] {
		return s.nextSingle(ctx)
	}
	if s.stale {
		s.rebuild(ctx)
	}
	if s.static {
		return s.nextStatic(ctx)
	}
	chosen, v, _ := reflect.Select(s.cases)
	if s.idx[chosen] == -3 { // nothing ready: flush, then block
		if err := s.t.flush(ctx); err != nil {
			return 0, envelope{}, control{}, err
		}
		chosen, v, _ = reflect.Select(s.cases[:len(s.cases)-1])
	}
	switch s.idx[chosen] {
	case wakeInput:
		return wakeInput, envelope{}, control{}, nil
	case -1:
		return -1, envelope{}, v.Interface().(control), nil
	case -2:
		return 0, envelope{}, control{}, ctx.Err()
	}
	return s.idx[chosen], v.Interface().(envelope), control{}, nil
}

func (s *selector) nextSingle(ctx context.Context) (int, envelope, control, error) {
	in := s.t.inputs[0].ch
	select {
	case e := <-in:
		return 0, e, control{}, nil
	case c := <-s.t.ctrl:
		return -1, envelope{}, c, nil
	case <-s.t.wakeC:
		return wakeInput, envelope{}, control{}, nil
	default:
	}
	if err := s.t.flush(ctx); err != nil {
		return 0, envelope{}, control{}, err
	}
	select {
	case e := <-in:
		return 0, e, control{}, nil
	case c := <-s.t.ctrl:
		return -1, envelope{}, c, nil
	case <-s.t.wakeC:
		return wakeInput, envelope{}, control{}, nil
	case <-ctx.Done():
		return 0, envelope{}, control{}, ctx.Err()
	}
}

// nextStatic is next for a task of up to staticInputs inputs: the same
// choice as the reflective select (any ready case, at random; flush before
// blocking), written out.
func (s *selector) nextStatic(ctx context.Context) (int, envelope, control, error) {
	select {
	case e := <-s.in[0]:
		return 0, e, control{}, nil
	case e := <-s.in[1]:
		return 1, e, control{}, nil
	case e := <-s.in[2]:
		return 2, e, control{}, nil
	case e := <-s.in[3]:
		return 3, e, control{}, nil
	case c := <-s.t.ctrl:
		return -1, envelope{}, c, nil
	case <-s.t.wakeC:
		return wakeInput, envelope{}, control{}, nil
	case <-ctx.Done():
		return 0, envelope{}, control{}, ctx.Err()
	default:
	}
	if err := s.t.flush(ctx); err != nil {
		return 0, envelope{}, control{}, err
	}
	select {
	case e := <-s.in[0]:
		return 0, e, control{}, nil
	case e := <-s.in[1]:
		return 1, e, control{}, nil
	case e := <-s.in[2]:
		return 2, e, control{}, nil
	case e := <-s.in[3]:
		return 3, e, control{}, nil
	case c := <-s.t.ctrl:
		return -1, envelope{}, c, nil
	case <-s.t.wakeC:
		return wakeInput, envelope{}, control{}, nil
	case <-ctx.Done():
		return 0, envelope{}, control{}, ctx.Err()
	}
}
