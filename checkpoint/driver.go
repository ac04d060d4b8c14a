package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// FailpointAfterPersisted is the failpoint the Driver calls right after a
// completed checkpoint was saved and before any notification is sent.
const FailpointAfterPersisted = "jm.after-checkpoint-persisted"

// ErrDriverStopped is returned by Driver methods once Run has returned.
var ErrDriverStopped = errors.New("checkpoint driver stopped")

// ErrDriverRunning is returned by a second call to Driver.Run.
var ErrDriverRunning = errors.New("checkpoint driver already running")

// Executor carries out the coordinator's decisions towards the job's tasks.
// Its methods are called from the Driver's goroutine, one at a time, and
// should not block for long (hand RPCs off, do not wait on acks).
type Executor interface {
	// TriggerCheckpoint injects barrier id at the sources; with drain (a
	// stop-with-savepoint with drain, Trigger.Drain) each source first
	// stops reading and emits the final watermark. An error aborts the
	// checkpoint and counts as a failed checkpoint.
	TriggerCheckpoint(ctx context.Context, id ID, sources []TaskID, drain bool) error
	// NotifyComplete tells every participant that id (and every id below)
	// completed. Best effort: it may be lost.
	NotifyComplete(ctx context.Context, id ID)
	// NotifyAborted tells every participant that id will never complete.
	// Best effort. See NotifyAborted for subsumed checkpoints.
	NotifyAborted(ctx context.Context, id ID, reason error)
	// FailJob asks for the job to fail over; the driver triggers nothing
	// until Restored is called.
	FailJob(ctx context.Context, err error)
}

// IDSource hands out checkpoint ids that strictly increase across restarts;
// it must make the id durable before returning it. The pebble Store
// implements it.
type IDSource interface {
	NextID(ctx context.Context, job string) (ID, error)
}

// Persister stores completed checkpoints and hands out their ids. Save is the
// commit point: it returns nil only once c is durable. It must return an error
// wrapping ErrOutcomeUnknown when it cannot tell whether c became durable, and
// any other error only when c will never be restored from.
type Persister interface {
	IDSource
	Save(ctx context.Context, c Completed) error
}

// DriverOpt configures a Driver.
type DriverOpt interface{ apply(*driverCfg) }

type driverOpt func(*driverCfg)

func (o driverOpt) apply(c *driverCfg) { o(c) }

type driverCfg struct {
	failpoint func(name string) error
	tick      time.Duration
	now       func() time.Time
	queue     int
}

// WithFailpoint sets a hook called with a failpoint name at each failpoint of
// the driver (FailpointAfterPersisted). If the hook returns an error, Run
// returns it at once, as if the job manager had died there: the checkpoint is
// durable and no notification is sent for it. By default there is no hook.
func WithFailpoint(hook func(name string) error) DriverOpt {
	return driverOpt(func(c *driverCfg) { c.failpoint = hook })
}

// WithTickInterval sets how often the driver's timer ticks the coordinator,
// which bounds how late a trigger or a timeout is noticed. The default is a
// quarter of the smaller of the interval and the timeout, at least 1ms.
func WithTickInterval(d time.Duration) DriverOpt {
	return driverOpt(func(c *driverCfg) {
		if d > 0 {
			c.tick = d
		}
	})
}

// WithClock sets the clock events are stamped with, time.Now by default.
func WithClock(now func() time.Time) DriverOpt {
	return driverOpt(func(c *driverCfg) {
		if now != nil {
			c.now = now
		}
	})
}

// WithEventQueue sets how many events the driver buffers before Ack, Decline
// and the other event methods block (default 256).
func WithEventQueue(n int) DriverOpt {
	return driverOpt(func(c *driverCfg) {
		if n >= 0 {
			c.queue = n
		}
	})
}

// Driver runs a Coordinator: one goroutine (Run) owns it, a ticker and the
// Executor and Persister, and executes the coordinator's actions in order.
// It saves a completed checkpoint with the Persister before it sends
// NotifyComplete: that ordering is the exactly-once commit point. Its event
// methods are safe for concurrent use.
type Driver struct {
	coord *Coordinator
	job   string
	exec  Executor
	pers  Persister
	cfg   driverCfg

	events  chan Event
	queries chan func(*Coordinator)
	done    chan struct{}
	started atomic.Bool

	// Savepoint requests, owned by Run's goroutine: asked are waiting for
	// a Trigger, byID for their checkpoint, persisting holds a savepoint's
	// checkpoint between its Persist and Persisted.
	asked      []chan<- savepointResult
	byID       map[ID][]chan<- savepointResult
	persisting map[ID]Completed
}

// savepointRequest is the driver's own event: a TriggerSavepoint and who
// waits for its answer.
type savepointRequest struct {
	TriggerSavepoint
	reply chan<- savepointResult
}

type savepointResult struct {
	c   Completed
	err error
}

// NewDriver returns a driver for a coordinator configured by cfg. Call Run to
// start it.
func NewDriver(cfg CoordinatorConfig, exec Executor, pers Persister, opts ...DriverOpt) (*Driver, error) {
	if exec == nil || pers == nil {
		return nil, fmt.Errorf("%w: nil executor or persister", ErrInvalidConfig)
	}
	coord, err := NewCoordinator(cfg)
	if err != nil {
		return nil, err
	}
	dc := driverCfg{
		tick:  max(min(cfg.Interval, cfg.Timeout)/4, time.Millisecond),
		now:   time.Now,
		queue: 256,
	}
	for _, o := range opts {
		o.apply(&dc)
	}
	return &Driver{
		coord:      coord,
		job:        cfg.Job,
		exec:       exec,
		pers:       pers,
		cfg:        dc,
		events:     make(chan Event, dc.queue),
		queries:    make(chan func(*Coordinator)),
		done:       make(chan struct{}),
		byID:       map[ID][]chan<- savepointResult{},
		persisting: map[ID]Completed{},
	}, nil
}

// Run drives the coordinator until ctx is done (it then returns nil) or a
// failpoint hook fails (it returns that error). Actions not yet executed when
// it returns are dropped, as in a crash. Run may be called once.
func (d *Driver) Run(ctx context.Context) error {
	if !d.started.CompareAndSwap(false, true) {
		return ErrDriverRunning
	}
	defer close(d.done)
	defer d.failSavepoints(ErrDriverStopped)
	t := time.NewTicker(d.cfg.tick)
	defer t.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			err = d.step(ctx, Tick{Now: d.cfg.now()})
		case ev := <-d.events:
			err = d.step(ctx, ev)
		case q := <-d.queries:
			q(d.coord)
		}
		if err != nil {
			return err
		}
	}
}

// failSavepoints answers every savepoint request still waiting with err.
func (d *Driver) failSavepoints(err error) {
	for _, r := range d.asked {
		r <- savepointResult{err: err}
	}
	d.asked = nil
	for id, rs := range d.byID {
		for _, r := range rs {
			r <- savepointResult{err: fmt.Errorf("savepoint (checkpoint %d): %w", id, err)}
		}
		delete(d.byID, id)
	}
}

// step feeds ev and executes the resulting actions, feeding back the results
// of RequestID, Trigger and Persist as they come.
func (d *Driver) step(ctx context.Context, ev Event) error {
	if r, ok := ev.(savepointRequest); ok {
		d.asked = append(d.asked, r.reply)
		ev = r.TriggerSavepoint
	}
	queue := d.coord.Step(ev)
	for len(queue) > 0 {
		if ctx.Err() != nil {
			return nil
		}
		a := queue[0]
		queue = queue[1:]
		next, err := d.execute(ctx, a)
		if err != nil {
			return err
		}
		if next != nil {
			queue = append(queue, d.coord.Step(next)...)
		}
	}
	return nil
}

func (d *Driver) execute(ctx context.Context, a Action) (Event, error) {
	switch a := a.(type) {
	case RequestID:
		id, err := d.pers.NextID(ctx, d.job)
		return IDAssigned{ID: id, Err: err, Now: d.cfg.now()}, nil
	case Trigger:
		if a.Savepoint {
			d.byID[a.ID] = append(d.byID[a.ID], d.asked...)
			d.asked = nil
		}
		if err := d.exec.TriggerCheckpoint(ctx, a.ID, a.Sources, a.Drain); err != nil {
			return TriggerFailed{ID: a.ID, Err: err, Now: d.cfg.now()}, nil
		}
	case Persist:
		if a.Savepoint {
			d.persisting[a.Completed.ID] = a.Completed
		}
		err := d.pers.Save(ctx, a.Completed)
		if err == nil && d.cfg.failpoint != nil {
			if ferr := d.cfg.failpoint(FailpointAfterPersisted); ferr != nil {
				return nil, fmt.Errorf("checkpoint %d: failpoint %s: %w", a.Completed.ID, FailpointAfterPersisted, ferr)
			}
		}
		return Persisted{ID: a.Completed.ID, Err: err, Now: d.cfg.now()}, nil
	case NotifyComplete:
		d.exec.NotifyComplete(ctx, a.ID)
		// A savepoint is answered once its notification went out: its
		// transactions are being committed, as any checkpoint's.
		if c, ok := d.persisting[a.ID]; ok {
			for _, r := range d.byID[a.ID] {
				r <- savepointResult{c: c}
			}
		}
		delete(d.persisting, a.ID)
		delete(d.byID, a.ID)
	case NotifyAborted:
		d.exec.NotifyAborted(ctx, a.ID, a.Reason)
		for _, r := range d.byID[a.ID] {
			r <- savepointResult{err: fmt.Errorf("savepoint: %w", a.Reason)}
		}
		delete(d.persisting, a.ID)
		delete(d.byID, a.ID)
	case SavepointFailed:
		for _, r := range d.asked {
			r <- savepointResult{err: a.Err}
		}
		d.asked = nil
	case FailJob:
		d.exec.FailJob(ctx, a.Err)
	}
	return nil, nil
}

func (d *Driver) send(ctx context.Context, ev Event) error {
	select {
	case <-d.done:
		return ErrDriverStopped
	default:
	}
	select {
	case d.events <- ev:
		return nil
	case <-d.done:
		return ErrDriverStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ack reports task's acknowledgement of checkpoint id with its snapshot and
// the time it spent aligning barriers.
func (d *Driver) Ack(ctx context.Context, task TaskID, id ID, snap TaskSnapshot, alignment time.Duration) error {
	return d.send(ctx, Ack{Task: task, ID: id, Snapshot: snap, Alignment: alignment, Now: d.cfg.now()})
}

// Decline reports that task refuses checkpoint id.
func (d *Driver) Decline(ctx context.Context, task TaskID, id ID, err error) error {
	return d.send(ctx, Decline{Task: task, ID: id, Err: err, Now: d.cfg.now()})
}

// TriggerNow asks for a checkpoint as soon as MinPause and MaxConcurrent
// allow.
func (d *Driver) TriggerNow(ctx context.Context, reason string) error {
	return d.send(ctx, TriggerNow{Reason: reason, Now: d.cfg.now()})
}

// TriggerSavepoint takes a savepoint (Coordinator's TriggerSavepoint; with
// stop, a stop-with-savepoint: no checkpoint is triggered after it until
// ResumeTriggers; with drain, which implies stop, the sources stop reading
// and emit the final watermark before its barrier) and waits for it: it returns the completed checkpoint once
// it was saved by the Persister and its NotifyComplete was executed, or why
// it failed (its abort, the job failing over, ctx, or the driver stopping).
// The caller writes the savepoint out (WriteSavepoint).
func (d *Driver) TriggerSavepoint(ctx context.Context, stop, drain bool) (Completed, error) {
	reply := make(chan savepointResult, 1)
	if err := d.send(ctx, savepointRequest{TriggerSavepoint{Now: d.cfg.now(), Stop: stop, Drain: drain}, reply}); err != nil {
		return Completed{}, fmt.Errorf("savepoint: %w", err)
	}
	select {
	case r := <-reply:
		return r.c, r.err
	case <-d.done:
		select {
		case r := <-reply:
			return r.c, r.err
		default:
			return Completed{}, fmt.Errorf("savepoint: %w", ErrDriverStopped)
		}
	case <-ctx.Done():
		return Completed{}, fmt.Errorf("savepoint: %w", ctx.Err())
	}
}

// ResumeTriggers lifts the stop of a completed stop-with-savepoint that the
// caller could not end the job with: checkpoints are triggered again.
func (d *Driver) ResumeTriggers(ctx context.Context) error {
	return d.send(ctx, ResumeTriggers{Now: d.cfg.now()})
}

// TaskFailed reports that the job is failing over: pending checkpoints are
// aborted and nothing is triggered until Restored.
func (d *Driver) TaskFailed(ctx context.Context, err error) error {
	return d.send(ctx, TaskFailed{Err: err, Now: d.cfg.now()})
}

// Restored reports that the job (re)started from checkpoint last (0 for
// none).
func (d *Driver) Restored(ctx context.Context, last ID) error {
	return d.send(ctx, Restored{LastCompleted: last, Now: d.cfg.now()})
}

// Pending returns the checkpoints in flight. It waits for the driver's
// goroutine, so it answers only while Run runs.
func (d *Driver) Pending(ctx context.Context) ([]PendingInfo, error) {
	reply := make(chan []PendingInfo, 1)
	q := func(c *Coordinator) { reply <- c.Pending() }
	select {
	case d.queries <- q:
	case <-d.done:
		return nil, ErrDriverStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return <-reply, nil
}
