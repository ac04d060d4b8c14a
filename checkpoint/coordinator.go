package checkpoint

// The coordinator is modelled the way etcd's raft separates the protocol from
// I/O: a Coordinator has no goroutines, no clock and does no I/O. The caller
// (the Driver, or a test) feeds it Events, each carrying the time it happened,
// and executes the Actions that Step returns, in order.
//
// Checkpoint ids. The coordinator never invents an id. When it decides to
// trigger it returns RequestID; the caller asks a durable IDSource (the pebble
// Store's NextID, which persists its high-water mark before answering) and
// feeds the answer back as IDAssigned. Only then does the coordinator return
// Trigger for that id. Ids therefore strictly increase across restarts of the
// job manager as long as the IDSource is durable, and the coordinator checks it
// too: an id not above every id it has seen (assigned ids and the
// Restored.LastCompleted) is refused with FailJob wrapping ErrIDNotIncreasing,
// and no Trigger is ever returned for it.
//
// Commit point. When every task has acknowledged checkpoint n the coordinator
// returns Persist; NotifyComplete(n) is returned only after the caller fed
// Persisted{ID: n, Err: nil}. Persists run one at a time in id order, and a
// checkpoint whose Persist is outstanding is never aborted by a timeout, a
// task failure or subsumption: its fate is the store's. If the store cannot
// tell whether the write landed, Persisted.Err must wrap ErrOutcomeUnknown:
// the coordinator then fails the job without aborting the checkpoint, and the
// restore (which reads the store) decides.

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// DefaultTolerableFailures is the number of consecutive failed checkpoints a
// job tolerates when CoordinatorConfig.TolerableFailures is 0.
const DefaultTolerableFailures = 3

// NoMinPause, as CoordinatorConfig.MinPause, lets a checkpoint be triggered
// as soon as the previous one ended: requested checkpoints (TriggerNow) then
// run back to back, bounded only by MaxConcurrent.
const NoMinPause time.Duration = -1

// EffectiveMinPause is the pause a coordinator keeps between the end of one
// checkpoint and the next trigger, for a configured minPause and interval
// (the rule of CoordinatorConfig.MinPause): 0 means the interval, so that
// checkpoints sources ask for (TriggerNow) never come more often than the
// interval; a negative value (NoMinPause) means none.
func EffectiveMinPause(minPause, interval time.Duration) time.Duration {
	switch {
	case minPause == 0:
		return interval
	case minPause < 0:
		return 0
	}
	return minPause
}

// Errors with which checkpoints are aborted and jobs failed. Reasons in
// NotifyAborted and errors in FailJob wrap one of these (a decline wraps
// ErrDeclined), so they can be matched with errors.Is.
var (
	// ErrTimeout: the checkpoint was not acknowledged by every task in time.
	ErrTimeout = errors.New("checkpoint timed out")
	// ErrSubsumed: a later checkpoint completed first.
	ErrSubsumed = errors.New("checkpoint subsumed")
	// ErrJobFailover: the job is failing over (a task failed, or the
	// coordinator failed the job), so every pending checkpoint is aborted.
	ErrJobFailover = errors.New("job failing over")
	// ErrPersistFailed: writing the completed checkpoint to the store failed.
	ErrPersistFailed = errors.New("persisting checkpoint failed")
	// ErrTriggerFailed: the barrier could not be injected at the sources.
	ErrTriggerFailed = errors.New("triggering checkpoint failed")
	// ErrIDUnavailable: the IDSource could not hand out a checkpoint id.
	ErrIDUnavailable = errors.New("no checkpoint id available")
	// ErrIDNotIncreasing: the IDSource returned an id not above every id
	// seen before; triggering it could reuse a transaction or a marker.
	ErrIDNotIncreasing = errors.New("checkpoint id not increasing")
	// ErrTooManyFailures: more consecutive checkpoints failed than tolerated.
	ErrTooManyFailures = errors.New("too many consecutive checkpoint failures")
	// ErrOutcomeUnknown is wrapped by a Persisted error when the store cannot
	// tell whether the checkpoint became durable. The coordinator must then
	// neither complete nor abort it: it fails the job and lets the restore
	// decide from what the store holds.
	ErrOutcomeUnknown = errors.New("checkpoint persist outcome unknown")
	// ErrInvalidConfig is wrapped by NewCoordinator and NewDriver errors.
	ErrInvalidConfig = errors.New("invalid checkpoint coordinator config")
)

// CoordinatorConfig configures a Coordinator.
type CoordinatorConfig struct {
	// Job is the job id; it goes into every Completed and to the IDSource.
	Job string
	// Interval is the period of checkpoint triggers, measured between two
	// trigger decisions (a TriggerNow restarts the period). Required.
	Interval time.Duration
	// Timeout aborts a checkpoint not acknowledged by every task this long
	// after its trigger. Required.
	Timeout time.Duration
	// MinPause is the least time between the end (completion or abort) of one
	// checkpoint and the trigger of the next, periodic or early (TriggerNow),
	// as Flink's minPauseBetweenCheckpoints. 0 means the Interval: however
	// often sources ask, at most one checkpoint is triggered per interval
	// (and the period becomes the interval plus the checkpoint's duration).
	// NoMinPause (any negative value) means none: early triggers follow the
	// end of the previous checkpoint at once (EffectiveMinPause).
	MinPause time.Duration
	// MaxConcurrent bounds the checkpoints in flight (triggered, or waiting for
	// an id, and not yet completed or aborted). 0 means 1. Jobs get 1, and no
	// job option may raise it until the share-group source's restore check
	// covers concurrent checkpoints: its lineage position moves only past a
	// subtask's own markers, so with two checkpoints in flight the older
	// one's restore could be accepted behind acknowledgements the newer one
	// committed (sources/sharegroup/lineage.go).
	MaxConcurrent int
	// TolerableFailures is how many consecutive failed checkpoints (declined,
	// timed out, failed to trigger or to persist) are tolerated; the next one
	// fails the job. 0 means DefaultTolerableFailures; a negative value
	// tolerates none. A completed checkpoint and a Restored reset the count;
	// aborts caused by a task failure or by subsumption do not count.
	//
	// A tolerated failure means the job carries on without rolling back. If
	// participants discard a checkpoint's work on NotifyAborted (release its
	// records, abort its transaction) while their state moves on, that loses
	// or duplicates records: such jobs must tolerate none, so that every
	// failed checkpoint rolls the job back to the last completed one.
	TolerableFailures int
	// Tasks are every subtask that must acknowledge a checkpoint (sources
	// included). Required, without duplicates.
	Tasks []TaskID
	// Sources are the subtasks at which barriers are injected; each must be
	// in Tasks. Required.
	Sources []TaskID
}

func (c CoordinatorConfig) validate() (CoordinatorConfig, error) {
	bad := func(format string, args ...any) (CoordinatorConfig, error) {
		return c, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Job == "":
		return bad("empty job")
	case c.Interval <= 0:
		return bad("interval %v must be positive", c.Interval)
	case c.Timeout <= 0:
		return bad("timeout %v must be positive", c.Timeout)
	case c.MaxConcurrent < 0:
		return bad("negative max concurrent %d", c.MaxConcurrent)
	case len(c.Tasks) == 0:
		return bad("no tasks")
	case len(c.Sources) == 0:
		return bad("no sources")
	}
	tasks := make(map[TaskID]struct{}, len(c.Tasks))
	for _, t := range c.Tasks {
		if _, dup := tasks[t]; dup {
			return bad("duplicate task %q", t)
		}
		tasks[t] = struct{}{}
	}
	for _, s := range c.Sources {
		if _, ok := tasks[s]; !ok {
			return bad("source %q is not a task", s)
		}
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 1
	}
	c.MinPause = EffectiveMinPause(c.MinPause, c.Interval)
	switch {
	case c.TolerableFailures == 0:
		c.TolerableFailures = DefaultTolerableFailures
	case c.TolerableFailures < 0:
		c.TolerableFailures = 0
	}
	c.Tasks = slices.Clone(c.Tasks)
	c.Sources = slices.Clone(c.Sources)
	return c, nil
}

// Event is an input to Coordinator.Step. Every event carries the time it
// happened; the coordinator's notion of now is the latest time it was given.
type Event interface{ eventTime() time.Time }

// Tick is the caller's timer. On a tick the coordinator expires checkpoints
// past their timeout and triggers one if it is due. Ticks may be late or
// dropped: one tick never means one checkpoint.
type Tick struct{ Now time.Time }

// TriggerNow asks for a checkpoint as soon as MinPause and MaxConcurrent
// allow, without waiting for the interval (e.g. the sources near their
// in-flight cap). Requests made while one is outstanding coalesce.
type TriggerNow struct {
	Now    time.Time
	Reason string
}

// IDAssigned answers RequestID: the id the IDSource handed out, or why not.
type IDAssigned struct {
	ID  ID
	Err error
	Now time.Time
}

// TriggerFailed reports that the Trigger for ID could not be delivered to the
// sources. It aborts the checkpoint and counts as a failure.
type TriggerFailed struct {
	ID  ID
	Err error
	Now time.Time
}

// Ack is a task's acknowledgement of a checkpoint with its snapshot.
type Ack struct {
	Task     TaskID
	ID       ID
	Snapshot TaskSnapshot
	// Alignment is how long the task held inputs back for barriers.
	Alignment time.Duration
	Now       time.Time
}

// Decline is a task refusing a checkpoint. It aborts the checkpoint and
// counts as a failure.
type Decline struct {
	Task TaskID
	ID   ID
	Err  error
	Now  time.Time
}

// Persisted is the result of executing Persist.
type Persisted struct {
	ID  ID
	Err error
	Now time.Time
}

// TaskFailed reports that the job is restarting because a task failed: every
// pending checkpoint (except one being persisted) is aborted, and nothing is
// triggered until Restored.
type TaskFailed struct {
	Err error
	Now time.Time
}

// TriggerSavepoint asks for a savepoint: a checkpoint that is triggered as
// soon as MaxConcurrent allows (MinPause does not hold it back, as in
// Flink), that no other checkpoint is triggered beside (so none can subsume
// it), and whose Trigger and Persist say Savepoint. Requests made while the
// id of one is being asked for join it. With Stop (stop-with-savepoint) no checkpoint at
// all is triggered once the savepoint is, unless it is aborted or
// ResumeTriggers lifts the stop: the job is meant to end with it as its
// final checkpoint. A request the coordinator cannot serve (the job is
// failing over) is answered with SavepointFailed. Drain (stop --drain,
// which implies Stop) marks its Trigger Drain: the sources stop reading and
// emit the final watermark before its barrier.
type TriggerSavepoint struct {
	Now   time.Time
	Stop  bool
	Drain bool
}

// ResumeTriggers lifts the stop a completed stop-with-savepoint left (the
// caller could not end the job with it, e.g. its savepoint directory could
// not be written): checkpoints are triggered again.
type ResumeTriggers struct{ Now time.Time }

// Restored reports that the job (re)started from LastCompleted (0 for none).
// It clears the failure count, lifts the stop set by TaskFailed or FailJob,
// and restarts the trigger period.
type Restored struct {
	LastCompleted ID
	Now           time.Time
}

func (e Tick) eventTime() time.Time             { return e.Now }
func (e TriggerNow) eventTime() time.Time       { return e.Now }
func (e IDAssigned) eventTime() time.Time       { return e.Now }
func (e TriggerFailed) eventTime() time.Time    { return e.Now }
func (e Ack) eventTime() time.Time              { return e.Now }
func (e Decline) eventTime() time.Time          { return e.Now }
func (e Persisted) eventTime() time.Time        { return e.Now }
func (e TaskFailed) eventTime() time.Time       { return e.Now }
func (e Restored) eventTime() time.Time         { return e.Now }
func (e TriggerSavepoint) eventTime() time.Time { return e.Now }
func (e ResumeTriggers) eventTime() time.Time   { return e.Now }

// Action is an output of Coordinator.Step, for the caller to execute in order.
type Action interface{ isAction() }

// RequestID asks the caller for a fresh checkpoint id from a durable
// IDSource, to be fed back as IDAssigned. It must always be answered (with an
// id or an error): no other checkpoint is triggered until it is.
type RequestID struct {
	// Reason is "periodic" or the reason of the TriggerNow.
	Reason string
}

// Trigger injects barrier ID at Sources.
type Trigger struct {
	ID      ID
	Sources []TaskID
	At      time.Time
	Reason  string
	// Savepoint marks a savepoint's checkpoint (TriggerSavepoint); Stop a
	// stop-with-savepoint's; Drain a stop-with-savepoint with drain (the
	// sources stop reading and emit the final watermark before the
	// barrier).
	Savepoint bool
	Stop      bool
	Drain     bool
}

// Persist writes a checkpoint every task acknowledged to the store (the
// commit point); its result is fed back as Persisted.
type Persist struct {
	Completed Completed
	// Savepoint marks a savepoint's checkpoint: once persisted, the caller
	// also writes it out as a savepoint.
	Savepoint bool
}

// SavepointFailed answers the savepoint requests that got no checkpoint id
// (the job failed over before one was triggered). A savepoint that was
// triggered ends with the NotifyAborted of its id instead.
type SavepointFailed struct{ Err error }

// NotifyComplete tells participants that ID (and every id below) completed.
// Best effort: nothing in the coordinator waits for it.
type NotifyComplete struct{ ID ID }

// NotifyAborted tells participants that ID will never complete. Best effort.
//
// A checkpoint aborted because a later one completed (Reason wraps
// ErrSubsumed) is returned after that later NotifyComplete: its work is
// covered by the later checkpoint, and a participant must not discard work
// that a completed checkpoint covers.
type NotifyAborted struct {
	ID     ID
	Reason error
}

// FailJob asks for the job to fail over. The coordinator stops triggering
// until Restored.
type FailJob struct{ Err error }

func (RequestID) isAction()       {}
func (Trigger) isAction()         {}
func (Persist) isAction()         {}
func (NotifyComplete) isAction()  {}
func (NotifyAborted) isAction()   {}
func (FailJob) isAction()         {}
func (SavepointFailed) isAction() {}

// PendingPhase is where a pending checkpoint is.
type PendingPhase int

const (
	// PhaseCollecting: triggered, waiting for acknowledgements.
	PhaseCollecting PendingPhase = iota + 1
	// PhaseQueued: every task acknowledged; waiting for an earlier
	// checkpoint's Persist to finish.
	PhaseQueued
	// PhasePersisting: Persist returned, Persisted not yet fed back.
	PhasePersisting
)

func (p PendingPhase) String() string {
	switch p {
	case PhaseCollecting:
		return "collecting"
	case PhaseQueued:
		return "queued"
	case PhasePersisting:
		return "persisting"
	}
	return fmt.Sprintf("PendingPhase(%d)", int(p))
}

// PendingInfo describes a checkpoint in flight.
type PendingInfo struct {
	ID          ID
	Reason      string
	Savepoint   bool
	Phase       PendingPhase
	TriggeredAt time.Time
	Deadline    time.Time
	// Acked and Waiting are the tasks that have and have not acknowledged,
	// sorted.
	Acked   []TaskID
	Waiting []TaskID
	// Stats are the statistics of the acknowledgements so far.
	Stats map[TaskID]TaskStats
}

type pending struct {
	id          ID
	reason      string
	phase       PendingPhase
	triggeredAt time.Time
	deadline    time.Time
	ackedAt     time.Time
	savepoint   bool
	stop        bool
	drain       bool
	snaps       map[TaskID]TaskSnapshot
	stats       map[TaskID]TaskStats
}

// Coordinator is the checkpoint protocol as a pure state machine. It is not
// safe for concurrent use; its zero value is not usable (use NewCoordinator).
type Coordinator struct {
	cfg   CoordinatorConfig
	tasks map[TaskID]struct{}

	now      time.Time
	anchored bool      // the trigger period has a start
	lastReq  time.Time // last trigger decision, start of the period
	lastEnd  time.Time // last completion or abort
	hasEnd   bool

	highestID     ID // highest id ever seen (assigned or restored)
	lastCompleted ID

	pending    map[ID]*pending
	persisting ID // 0 for none
	requesting bool
	reqReason  string
	wantEarly  bool
	earlyWhy   string

	// Savepoints: wantSavepoint is a request not yet asked an id for,
	// reqSavepoint/reqStop describe the outstanding RequestID, stopped is
	// set once a stop-with-savepoint was triggered (no more triggers).
	wantSavepoint bool
	wantStop      bool
	wantDrain     bool
	reqSavepoint  bool
	reqStop       bool
	reqDrain      bool
	stopped       bool

	failures int
	halted   bool // after TaskFailed or FailJob, until Restored

	out []Action
}

// NewCoordinator returns a coordinator for cfg, in the running state (as after
// Restored with LastCompleted 0). Its trigger period starts at the time of the
// first event it is given.
func NewCoordinator(cfg CoordinatorConfig) (*Coordinator, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	c := &Coordinator{
		cfg:     cfg,
		tasks:   make(map[TaskID]struct{}, len(cfg.Tasks)),
		pending: make(map[ID]*pending),
	}
	for _, t := range cfg.Tasks {
		c.tasks[t] = struct{}{}
	}
	return c, nil
}

// Step feeds one event to the coordinator and returns the actions to execute,
// in order. Unknown, late or duplicate events are ignored. The returned slice
// is the caller's.
func (c *Coordinator) Step(ev Event) []Action {
	c.out = nil
	if ev == nil {
		return nil
	}
	if t := ev.eventTime(); t.After(c.now) {
		c.now = t
	}
	if !c.anchored {
		c.anchored = true
		c.lastReq = c.now
	}
	c.expire()
	switch e := ev.(type) {
	case Tick:
	case TriggerNow:
		if !c.halted {
			c.wantEarly = true
			c.earlyWhy = e.Reason
		}
	case IDAssigned:
		c.onIDAssigned(e)
	case TriggerFailed:
		if p := c.pending[e.ID]; p != nil && p.phase == PhaseCollecting {
			err := fmt.Errorf("checkpoint %d: %w: %w", e.ID, ErrTriggerFailed, e.Err)
			c.abort(p, err)
			c.fail(err)
		}
	case Ack:
		c.onAck(e)
	case Decline:
		c.onDecline(e)
	case Persisted:
		c.onPersisted(e)
	case TaskFailed:
		c.halt(fmt.Errorf("%w: %w", ErrJobFailover, e.Err))
	case Restored:
		c.onRestored(e)
	case TriggerSavepoint:
		if c.halted {
			c.emit(SavepointFailed{Err: fmt.Errorf("savepoint: %w: the job is failing over", ErrJobFailover)})
			break
		}
		if c.requesting && c.reqSavepoint {
			// Joins the savepoint whose id is being asked for.
			c.reqStop = c.reqStop || e.Stop || e.Drain
			c.reqDrain = c.reqDrain || e.Drain
			break
		}
		c.wantSavepoint = true
		c.wantStop = c.wantStop || e.Stop || e.Drain
		c.wantDrain = c.wantDrain || e.Drain
	case ResumeTriggers:
		c.stopped = false
	}
	c.maybePersist()
	c.maybeTrigger()
	out := c.out
	c.out = nil
	return out
}

func (c *Coordinator) emit(a Action) { c.out = append(c.out, a) }

// expire aborts checkpoints past their deadline that are not being persisted.
func (c *Coordinator) expire() {
	for _, id := range c.sortedIDs() {
		p := c.pending[id] // an earlier expiry may have failed the job
		if p == nil || p.phase == PhasePersisting || c.now.Before(p.deadline) {
			continue
		}
		err := fmt.Errorf("checkpoint %d: %w after %v", id, ErrTimeout, c.cfg.Timeout)
		c.abort(p, err)
		c.fail(err)
	}
}

func (c *Coordinator) onIDAssigned(e IDAssigned) {
	if !c.requesting {
		return
	}
	c.requesting = false
	if e.Err != nil {
		c.failSavepointRequest(fmt.Errorf("%w: %w", ErrIDUnavailable, e.Err))
		if !c.halted {
			c.fail(fmt.Errorf("%w: %w", ErrIDUnavailable, e.Err))
		}
		return
	}
	if e.ID <= c.highestID {
		c.failSavepointRequest(fmt.Errorf("%w: got %d, already saw %d", ErrIDNotIncreasing, e.ID, c.highestID))
		if !c.halted {
			c.failJob(fmt.Errorf("%w: got %d, already saw %d", ErrIDNotIncreasing, e.ID, c.highestID))
		}
		return
	}
	if c.halted {
		c.failSavepointRequest(fmt.Errorf("savepoint: %w: the job is failing over", ErrJobFailover))
	}
	c.highestID = e.ID
	if c.halted {
		return // the id is burnt; ids may skip, never repeat
	}
	p := &pending{
		id:          e.ID,
		reason:      c.reqReason,
		phase:       PhaseCollecting,
		triggeredAt: c.now,
		deadline:    c.now.Add(c.cfg.Timeout),
		savepoint:   c.reqSavepoint,
		stop:        c.reqStop,
		drain:       c.reqDrain,
		snaps:       make(map[TaskID]TaskSnapshot, len(c.tasks)),
		stats:       make(map[TaskID]TaskStats, len(c.tasks)),
	}
	c.pending[e.ID] = p
	if p.stop {
		c.stopped = true
	}
	c.reqSavepoint, c.reqStop, c.reqDrain = false, false, false
	c.emit(Trigger{ID: e.ID, Sources: slices.Clone(c.cfg.Sources), At: c.now, Reason: c.reqReason,
		Savepoint: p.savepoint, Stop: p.stop, Drain: p.drain})
}

func (c *Coordinator) onAck(e Ack) {
	p := c.pending[e.ID]
	if p == nil || p.phase != PhaseCollecting {
		return
	}
	if _, ok := c.tasks[e.Task]; !ok {
		return
	}
	if _, dup := p.snaps[e.Task]; dup {
		return
	}
	snap := e.Snapshot
	if snap.Task == "" {
		snap.Task = e.Task
	}
	p.snaps[e.Task] = snap
	p.stats[e.Task] = TaskStats{
		AckLatency: max(c.now.Sub(p.triggeredAt), 0),
		Alignment:  e.Alignment,
		Size:       snap.Size(),
	}
	if len(p.snaps) == len(c.tasks) {
		p.phase = PhaseQueued
		p.ackedAt = c.now
	}
}

func (c *Coordinator) onDecline(e Decline) {
	p := c.pending[e.ID]
	if p == nil || p.phase != PhaseCollecting {
		return
	}
	if _, ok := c.tasks[e.Task]; !ok {
		return
	}
	if _, acked := p.snaps[e.Task]; acked {
		return // a task cannot take its ack back
	}
	var err error
	switch {
	case e.Err == nil:
		err = fmt.Errorf("checkpoint %d declined by %s: %w", e.ID, e.Task, ErrDeclined)
	case errors.Is(e.Err, ErrDeclined):
		err = fmt.Errorf("checkpoint %d declined by %s: %w", e.ID, e.Task, e.Err)
	default:
		err = fmt.Errorf("checkpoint %d declined by %s: %w: %w", e.ID, e.Task, ErrDeclined, e.Err)
	}
	c.abort(p, err)
	c.fail(err)
}

func (c *Coordinator) onPersisted(e Persisted) {
	if e.ID == 0 || e.ID != c.persisting {
		return
	}
	c.persisting = 0
	p := c.pending[e.ID]
	if p == nil {
		return
	}
	delete(c.pending, e.ID)
	c.lastEnd, c.hasEnd = c.now, true
	switch {
	case e.Err == nil:
		c.lastCompleted = max(c.lastCompleted, p.id)
		c.failures = 0
		c.emit(NotifyComplete{ID: p.id})
		for _, id := range c.sortedIDs() {
			if q := c.pending[id]; q != nil && id < p.id && q.phase != PhasePersisting {
				c.abort(q, fmt.Errorf("checkpoint %d: %w by %d", id, ErrSubsumed, p.id))
			}
		}
	case errors.Is(e.Err, ErrOutcomeUnknown):
		// Neither complete nor abort: the restore reads the store and decides.
		if !c.halted {
			c.failJob(fmt.Errorf("checkpoint %d: %w", p.id, e.Err))
		}
	default:
		err := fmt.Errorf("checkpoint %d: %w: %w", p.id, ErrPersistFailed, e.Err)
		c.emit(NotifyAborted{ID: p.id, Reason: err})
		c.fail(err)
	}
}

func (c *Coordinator) onRestored(e Restored) {
	for _, id := range c.sortedIDs() {
		if p := c.pending[id]; p.phase != PhasePersisting {
			c.abort(p, fmt.Errorf("checkpoint %d: %w: restored from %d", id, ErrJobFailover, e.LastCompleted))
		}
	}
	c.halted = false
	c.stopped = false
	c.failures = 0
	c.wantEarly = false
	c.lastCompleted = max(c.lastCompleted, e.LastCompleted)
	c.highestID = max(c.highestID, e.LastCompleted)
	c.lastReq = c.now
}

// failSavepointRequest answers the outstanding RequestID's savepoint
// request, if it was one, with SavepointFailed.
func (c *Coordinator) failSavepointRequest(err error) {
	if !c.reqSavepoint {
		return
	}
	c.reqSavepoint, c.reqStop, c.reqDrain = false, false, false
	c.emit(SavepointFailed{Err: err})
}

// abort removes p and notifies participants. An aborted stop-with-savepoint
// lifts the stop: the job goes on.
func (c *Coordinator) abort(p *pending, reason error) {
	if p.stop {
		c.stopped = false
	}
	delete(c.pending, p.id)
	c.lastEnd, c.hasEnd = c.now, true
	c.emit(NotifyAborted{ID: p.id, Reason: reason})
}

// fail counts a failed checkpoint and fails the job past the tolerance.
func (c *Coordinator) fail(err error) {
	if c.halted {
		return
	}
	c.failures++
	if c.failures > c.cfg.TolerableFailures {
		c.failJob(fmt.Errorf("%w: %d in a row (tolerated %d), last: %w",
			ErrTooManyFailures, c.failures, c.cfg.TolerableFailures, err))
	}
}

func (c *Coordinator) failJob(err error) {
	c.emit(FailJob{Err: err})
	c.halt(fmt.Errorf("%w: %w", ErrJobFailover, err))
}

// halt aborts every pending checkpoint not being persisted and stops
// triggering until Restored.
func (c *Coordinator) halt(reason error) {
	c.halted = true
	c.wantEarly = false
	if c.wantSavepoint {
		c.wantSavepoint, c.wantStop, c.wantDrain = false, false, false
		c.emit(SavepointFailed{Err: fmt.Errorf("savepoint: %w", reason)})
	}
	for _, id := range c.sortedIDs() {
		if p := c.pending[id]; p.phase != PhasePersisting {
			c.abort(p, fmt.Errorf("checkpoint %d: %w", id, reason))
		}
	}
}

// maybePersist starts persisting the lowest fully acknowledged checkpoint if
// no persist is outstanding.
func (c *Coordinator) maybePersist() {
	if c.persisting != 0 {
		return
	}
	for _, id := range c.sortedIDs() {
		p := c.pending[id]
		if p.phase != PhaseQueued {
			continue
		}
		p.phase = PhasePersisting
		c.persisting = id
		stats := make(map[TaskID]TaskStats, len(p.stats))
		for t, s := range p.stats {
			stats[t] = s
		}
		tasks := make(map[TaskID]TaskSnapshot, len(p.snaps))
		for t, s := range p.snaps {
			tasks[t] = s
		}
		c.emit(Persist{Savepoint: p.savepoint, Completed: Completed{
			Job:         c.cfg.Job,
			ID:          id,
			TriggeredAt: p.triggeredAt,
			CompletedAt: p.ackedAt,
			Tasks:       tasks,
			Stats:       stats,
		}})
		return
	}
}

func (c *Coordinator) maybeTrigger() {
	if c.halted || c.requesting || c.stopped {
		return
	}
	if len(c.pending) >= c.cfg.MaxConcurrent {
		return
	}
	for _, p := range c.pending {
		if p.savepoint {
			return // nothing may complete after it and subsume it
		}
	}
	if c.wantSavepoint {
		reason := "savepoint"
		if c.wantStop {
			reason = "stop-with-savepoint"
		}
		c.reqSavepoint, c.reqStop, c.reqDrain = true, c.wantStop, c.wantDrain
		c.wantSavepoint, c.wantStop, c.wantDrain = false, false, false
		c.requesting = true
		c.reqReason = reason
		c.lastReq = c.now
		c.emit(RequestID{Reason: reason})
		return
	}
	if c.hasEnd && c.now.Before(c.lastEnd.Add(c.cfg.MinPause)) {
		return
	}
	reason := "periodic"
	switch {
	case c.wantEarly:
		reason = c.earlyWhy
	case c.now.Before(c.lastReq.Add(c.cfg.Interval)):
		return
	}
	c.wantEarly = false
	c.requesting = true
	c.reqReason = reason
	c.lastReq = c.now
	c.emit(RequestID{Reason: reason})
}

func (c *Coordinator) sortedIDs() []ID {
	ids := make([]ID, 0, len(c.pending))
	for id := range c.pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Pending returns the checkpoints in flight, by id.
func (c *Coordinator) Pending() []PendingInfo {
	var infos []PendingInfo
	for _, id := range c.sortedIDs() {
		p := c.pending[id]
		info := PendingInfo{
			ID:          id,
			Reason:      p.reason,
			Savepoint:   p.savepoint,
			Phase:       p.phase,
			TriggeredAt: p.triggeredAt,
			Deadline:    p.deadline,
			Stats:       make(map[TaskID]TaskStats, len(p.stats)),
		}
		for _, t := range c.cfg.Tasks {
			if _, ok := p.snaps[t]; ok {
				info.Acked = append(info.Acked, t)
			} else {
				info.Waiting = append(info.Waiting, t)
			}
		}
		slices.Sort(info.Acked)
		slices.Sort(info.Waiting)
		for t, s := range p.stats {
			info.Stats[t] = s
		}
		infos = append(infos, info)
	}
	return infos
}

// LastCompleted returns the latest completed (persisted) checkpoint, or the
// one the job was restored from, 0 for none.
func (c *Coordinator) LastCompleted() ID { return c.lastCompleted }

// ConsecutiveFailures returns the count of failed checkpoints since the last
// completed one (or Restored).
func (c *Coordinator) ConsecutiveFailures() int { return c.failures }
