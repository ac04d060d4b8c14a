package runtime

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// ErrJobFailed is wrapped by the error of a job that exhausted its restarts.
var ErrJobFailed = errors.New("job failed")

// cancelDriverWait bounds how long a job cancel waits for the coordinator
// to stop before it cancels the tasks.
const cancelDriverWait = 10 * time.Second

// errCoordinatorStuck cancels an attempt whose job was cancelled while its
// coordinator did not stop within cancelDriverWait.
var errCoordinatorStuck = errors.New("runtime: the checkpoint coordinator did not stop in time for the cancel")

// cancelEndTimeout bounds the ending step of a job cancelled while no
// attempt of it runs (endCanceled).
const cancelEndTimeout = time.Minute

// ErrJobCanceled is the cause (context.Cause) with which the context of a
// deployment is cancelled when the job is cancelled for good (not failed,
// not restarting): a Deployer whose context ends with it cancels its tasks
// for good (Deployed.Cancel(true)).
var ErrJobCanceled = errors.New("job cancelled")

// ErrUnrecoverable marks a task failure that a restart cannot fix (e.g. a
// configuration the broker refuses): wrap it (Unrecoverable) and the job
// fails at once instead of restarting.
var ErrUnrecoverable = errors.New("unrecoverable")

// Unrecoverable wraps err so that the job fails without restarting.
func Unrecoverable(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrUnrecoverable, err)
}

// isConfigError reports whether err is one a restart cannot fix.
func isConfigError(err error) bool {
	return errors.Is(err, ErrUnrecoverable) || errors.Is(err, ErrInvalidJob) || errors.Is(err, ErrInvalidOption) ||
		errors.Is(err, ErrIncompatibleState) || errors.Is(err, checkpoint.ErrInvalidConfig)
}

// MiniCluster runs a job graph in one process: every subtask a goroutine,
// checkpoints coordinated by checkpoint.Driver and stored in a pebble
// checkpoint.Store, and every task restarted from the latest completed
// checkpoint when one fails.
type MiniCluster struct {
	cfg clusterCfg

	// mu guards the running job's handles for savepoints: the current
	// attempt, the cancel that ends Run with a stop-with-savepoint, and
	// stopping (closed once such a stop ended; no attempt starts while it
	// is open).
	mu       sync.Mutex
	current  *attempt
	stopRun  context.CancelCauseFunc
	stopping chan struct{}
}

type clusterCfg struct {
	jobID             string
	interval          time.Duration
	timeout           time.Duration
	minPause          time.Duration
	minPauseSet       bool
	tolerable         int
	store             CheckpointStorage
	storeDir          string
	restart           RestartPolicy
	batchSize         int
	channelCap        int
	log               *zap.Logger
	fp                Failpointer
	driverFailpoint   func(string) error
	onCheckpoint      func(CheckpointEvent)
	onTriggered       func(CheckpointEvent)
	onAborted         func(CheckpointEvent)
	onAck             func(CheckpointAck)
	restoreFromLatest bool
	allowNonRestored  bool
	startFrom         *checkpoint.Completed
	deployer          Deployer
	stateBudget       int64        // StateMemoryLimit
	stateDir          string       // StateMemoryDir
	stateMem          *StateMemory // the run's, for a job on the pebble state backend
	suspend           context.Context
	onRestart         func(restarts int, err error)
	onRestore         func(attempt int, from checkpoint.ID)
	onNextAttempt     func(at time.Time)
	detection         time.Duration
	slotWait          time.Duration
	stateStorage      storage.Storage
	stateStorageURL   string
	inlineLimit       int64
	fullUploads       bool
	orphanGrace       time.Duration
	onStateDeleted    func(n int)
}

// Defaults of BatchSize and ChannelCapacity.
const (
	defaultBatchSize  = 256
	defaultChannelCap = 8
)

// ErrInvalidOption is wrapped by the error of Run when an executor option
// cannot work; the job does not start (and is never restarted).
var ErrInvalidOption = errors.New("invalid option")

// validate refuses options that cannot work, naming every bad one.
func (c *clusterCfg) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.interval <= 0 {
		bad("CheckpointInterval %v must be positive", c.interval)
	}
	if c.timeout <= 0 {
		bad("CheckpointTimeout %v must be positive", c.timeout)
	}
	if c.minPause < 0 {
		bad("MinPause %v must not be negative", c.minPause)
	}
	if c.tolerable < 0 {
		bad("TolerableCheckpointFailures %d must not be negative", c.tolerable)
	}
	if err := c.restart.validate(); err != nil {
		if c.restart.name == StrategyFixedDelay {
			bad("Restarts(%d, %v): neither may be negative", c.restart.attempts, c.restart.delay)
		} else {
			bad("RestartStrategy: %w", err)
		}
	}
	if c.detection < 0 || c.slotWait < 0 {
		bad("FailoverDelays(%v, %v): neither may be negative", c.detection, c.slotWait)
	}
	if c.batchSize < 1 {
		bad("BatchSize %d must be at least 1", c.batchSize)
	}
	if c.channelCap < 1 {
		bad("ChannelCapacity %d must be at least 1", c.channelCap)
	}
	if c.orphanGrace < 0 {
		bad("OrphanGrace %v must not be negative", c.orphanGrace)
	}
	if c.store != nil && c.storeDir != "" {
		bad("CheckpointStore and CheckpointDir are exclusive")
	}
	if c.log == nil {
		bad("Logger must not be nil")
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidOption, errors.Join(errs...))
}

// ClusterOpt configures a MiniCluster.
type ClusterOpt interface{ apply(*clusterCfg) }

// clusterOpt is a ClusterOpt from a function.
type clusterOpt func(*clusterCfg)

func (o clusterOpt) apply(c *clusterCfg) { o(c) }

// JobID sets the id under which the job's checkpoints are stored (default:
// the job's name).
func JobID(id string) ClusterOpt { return clusterOpt(func(c *clusterCfg) { c.jobID = id }) }

// CheckpointInterval sets the checkpoint trigger period (default 1s).
func CheckpointInterval(d time.Duration) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.interval = d })
}

// CheckpointTimeout aborts checkpoints not complete after d (default 1m).
func CheckpointTimeout(d time.Duration) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.timeout = d })
}

// MinPause sets the least time between the end of one checkpoint and the
// trigger of the next, periodic or asked for by an operator
// (OperatorContext.RequestCheckpoint), as Flink's
// minPauseBetweenCheckpoints. The default is the checkpoint interval: a
// source that asks for checkpoints all the time (a share-group source with a
// backlog) gets at most one per interval. MinPause(0) lets requested
// checkpoints follow one another at once, which short checkpoint cycles
// (and the throughput of share-group sources) need.
func MinPause(d time.Duration) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.minPause, c.minPauseSet = d, true })
}

// coordinatorMinPause is CoordinatorConfig.MinPause for the configured
// pause: 0 (the coordinator's default, the interval) when unset,
// checkpoint.NoMinPause for an explicit 0.
func (c *clusterCfg) coordinatorMinPause() time.Duration {
	switch {
	case !c.minPauseSet:
		return 0
	case c.minPause == 0:
		return checkpoint.NoMinPause
	}
	return c.minPause
}

// TolerableCheckpointFailures sets how many consecutive failed checkpoints
// are tolerated before the job fails over (0: the coordinator's default,
// checkpoint.DefaultTolerableFailures). Tolerance applies only to jobs whose
// checkpoint listeners all carry an aborted checkpoint's work to the next
// one (checkpoint.AbortCarrier); any other job tolerates none, and asking
// for a tolerance for it is refused when the job starts.
func TolerableCheckpointFailures(n int) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.tolerable = n })
}

// CheckpointStorage is where a job master keeps its completed checkpoints
// and finds the one to restore from. checkpoint.Store (pebble, local disk)
// implements it; a remote store (an object store, say) would implement the
// same three contracts (docs/architecture.md, "Checkpoint storage").
type CheckpointStorage interface {
	// Persister hands out ids and saves completed checkpoints (Save is the
	// commit point).
	checkpoint.Persister
	// LatestUsable returns the newest completed checkpoint of job that
	// verifies, and the newer ones it skipped (checkpoint.Store.LatestUsable).
	LatestUsable(ctx context.Context, job string) (checkpoint.Completed, []checkpoint.Skipped, error)
	// Reopen makes the storage usable again after a Save whose outcome is
	// unknown, so that what it holds decides the restore; it does nothing
	// on healthy storage.
	Reopen() error
}

var _ CheckpointStorage = (*checkpoint.Store)(nil)

// CheckpointStore stores checkpoints in s (the caller closes it).
func CheckpointStore(s CheckpointStorage) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.store = s })
}

// CheckpointDir stores checkpoints in a pebble store at dir. Without
// CheckpointStore or CheckpointDir, checkpoints live in an in-memory pebble
// and are lost with the process.
func CheckpointDir(dir string) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.storeDir = dir })
}

// StateStorage makes tasks write their state to st (checkpoint storage,
// docs/internals/checkpoint-storage.md) and acknowledge checkpoints with
// references to it, instead of carrying the bytes in their
// acknowledgements; rawURL is st's URL (storage.Open), which a Deployer
// passes to remote task managers so they open it themselves. The job
// master then tracks which retained checkpoints reference which object and
// deletes the rest; it never reads the state. The caller closes st.
// Without it, state travels inline and lives in the CheckpointStore.
func StateStorage(st storage.Storage, rawURL string) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.stateStorage, c.stateStorageURL = st, rawURL })
}

// StateInlineLimit sets the task snapshot size below which state stays
// inline in the acknowledgement even with StateStorage (default
// checkpoint.DefaultInlineLimit, 20 KiB; negative: none stays inline).
func StateInlineLimit(n int64) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.inlineLimit = n })
}

// FullCheckpoints turns incremental checkpoints off: with StateStorage,
// every checkpoint writes every key group again instead of reusing the
// references of key groups unchanged since the task's last confirmed
// checkpoint (a baseline for measuring them; Flink's
// state.backend.incremental false).
func FullCheckpoints() ClusterOpt { return clusterOpt(func(c *clusterCfg) { c.fullUploads = true }) }

// OrphanGrace sets how old an object in checkpoint storage that no
// retained checkpoint references must be before the orphan sweep deletes
// it (default DefaultOrphanGrace): the sweep runs when each attempt starts,
// when the job ends, and every max(grace, CheckpointTimeout) of
// completed checkpoints. A grace period shorter than the longest a task
// of an earlier attempt may still be writing its state could delete state
// a late acknowledgement names; such a checkpoint then fails on restore,
// naming the object.
func OrphanGrace(d time.Duration) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.orphanGrace = d })
}

// OnStateDeleted calls fn with the number of objects deleted from
// checkpoint storage after each deletion (metrics, tests).
func OnStateDeleted(fn func(n int)) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.onStateDeleted = fn })
}

// Restarts sets how many times the job restarts after failures before it
// fails (default 10), and the delay before each restart (default 100ms):
// RestartStrategy(FixedDelayRestart(n, delay)).
func Restarts(n int, delay time.Duration) ClusterOpt {
	return RestartStrategy(FixedDelayRestart(n, delay))
}

// RestartStrategy sets how the job restarts after failures: Flink's
// fixed-delay (FixedDelayRestart; the default, 10 attempts 100ms apart),
// exponential-delay (ExponentialDelayRestart), failure-rate
// (FailureRateRestart) or none (NoRestart). A delay counts from the
// failure, as in Flink: the failed attempt's tasks are cancelled during
// it, and the next attempt starts once both are over.
func RestartStrategy(p RestartPolicy) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.restart = p })
}

// BatchSize sets how many records travel together between tasks (default 256).
func BatchSize(n int) ClusterOpt { return clusterOpt(func(c *clusterCfg) { c.batchSize = n }) }

// ChannelCapacity sets how many batches a channel between two subtasks holds
// before the sender blocks (default 8): with BatchSize, the bound on records
// in flight per channel.
func ChannelCapacity(n int) ClusterOpt { return clusterOpt(func(c *clusterCfg) { c.channelCap = n }) }

// Logger sets the logger (default: none).
func Logger(l *zap.Logger) ClusterOpt { return clusterOpt(func(c *clusterCfg) { c.log = l }) }

// AllowNonRestoredState lets a job restore from a checkpoint that holds
// state of operators (UIDs) the job no longer has, dropping that state (as
// Flink's --allowNonRestoredState). Their pre-committed transactions are
// still committed, by an operator of the job that implements
// RestoreCommitter. Without it such a restore is refused, naming the UIDs.
func AllowNonRestoredState() ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.allowNonRestored = true })
}

// StartFrom starts the job from c (a savepoint read with
// checkpoint.ReadSavepoint, or another job's checkpoint) when the
// checkpoint storage holds no completed checkpoint of the job yet: c is
// saved there first, under the job's id, as its first completed checkpoint,
// so the job restores it as it would its own (state matched by UID, key
// groups at the new parallelism, its transactions committed if still
// pending) and its checkpoint ids continue above c's. Once the job has a
// checkpoint of its own, c is ignored: a restart or a resumed job restores
// the latest.
func StartFrom(c checkpoint.Completed) ClusterOpt {
	return clusterOpt(func(cfg *clusterCfg) { cfg.startFrom = &c })
}

// CheckRestore reports whether job can start from c (StartFrom) with the
// given AllowNonRestoredState, as the restore would decide it: an error
// wrapping ErrIncompatibleState names what does not fit. A job manager
// calls it at submit, so that such a job is refused rather than failed.
func CheckRestore(job *Job, c checkpoint.Completed, allowNonRestored bool) error {
	p, err := compile(job)
	if err != nil {
		return err
	}
	_, err = AssignState(p.layout(), RestoreInput{Checkpoint: c, AllowNonRestoredState: allowNonRestored})
	return err
}

// importStart saves cfg.startFrom as the job's first completed checkpoint
// if the storage holds none of the job.
func importStart(ctx context.Context, cfg clusterCfg, store CheckpointStorage) (imported bool, err error) {
	if cfg.startFrom == nil {
		return false, nil
	}
	imported, err = ImportCheckpoint(ctx, store, cfg.jobID, *cfg.startFrom)
	if imported {
		cfg.log.Info("job starts from a savepoint", zap.String("job", cfg.jobID), zap.Uint64("checkpoint", uint64(cfg.startFrom.ID)))
	}
	return imported, err
}

// ImportCheckpoint saves c (a savepoint, or another job's checkpoint) in
// store as job's first completed checkpoint, if store holds no completed
// checkpoint of job (imported says whether it did): the rule of StartFrom,
// for a job manager that imports at submit. The job then restores c as its
// own, and its checkpoint ids continue above c's.
func ImportCheckpoint(ctx context.Context, store CheckpointStorage, job string, c checkpoint.Completed) (imported bool, err error) {
	_, skipped, err := store.LatestUsable(ctx, job)
	switch {
	case err == nil || len(skipped) > 0:
		return false, nil // the job has checkpoints of its own
	case !errors.Is(err, checkpoint.ErrNotFound):
		return false, err
	}
	c.Job = job
	if err := store.Save(ctx, c); err != nil {
		return false, fmt.Errorf("start from checkpoint %d: %w", c.ID, err)
	}
	return true, nil
}

// ErrNotRunning is wrapped by TriggerSavepoint's error when no attempt of
// the job runs (it is deploying, restarting or over): try again later.
var ErrNotRunning = errors.New("the job is not running")

// errStoppedWithSavepoint ends Run after a stop-with-savepoint.
var errStoppedWithSavepoint = errors.New("stopped with a savepoint")

// TriggerSavepoint takes a savepoint of the running job: a checkpoint like
// any other (barriers, alignment, acknowledgements, saved to the checkpoint
// storage, its transactions committed on its notification) that
// checkpoint.Driver.TriggerSavepoint marks, after which write is called
// with it (to write it out with checkpoint.WriteSavepoint). It returns the
// checkpoint once write returned nil.
//
// With stop (stop-with-savepoint) no checkpoint is triggered after the
// savepoint; once write succeeded, the job ends: its tasks are cancelled
// for good with the savepoint as their latest completed checkpoint (its
// transactions committed, anything later aborted, held records released)
// and Run returns nil, the job FINISHED. If write fails, checkpoints resume
// and the job goes on.
//
// With drain (which implies stop: Flink's stop-with-savepoint --drain),
// every source task stops reading when the savepoint's trigger reaches it
// (no Poll after it) and emits MaxWatermark before the barrier: every
// event-time window and timer downstream fires first, so the savepoint
// holds the state after they fired and their output is in its
// checkpoint's transactions, committed with it. Should the savepoint be
// aborted, or write fail, after the final watermark went out, the job
// fails over to its latest completed checkpoint (before the drain, or the
// savepoint's own) and reads on, instead of going on with its sources
// stopped.
func (m *MiniCluster) TriggerSavepoint(ctx context.Context, stop, drain bool, write func(checkpoint.Completed) error) (checkpoint.Completed, error) {
	stop = stop || drain
	m.mu.Lock()
	a := m.current
	if m.stopping != nil {
		m.mu.Unlock()
		return checkpoint.Completed{}, fmt.Errorf("savepoint: %w: it is being stopped", ErrNotRunning)
	}
	m.mu.Unlock()
	var d *checkpoint.Driver
	if a != nil {
		d = a.drv.Load()
	}
	if d == nil {
		return checkpoint.Completed{}, fmt.Errorf("savepoint: %w (deploying, restarting or over): try again", ErrNotRunning)
	}
	c, err := d.TriggerSavepoint(ctx, stop, drain)
	if err != nil {
		return checkpoint.Completed{}, err
	}
	if !stop {
		if err := write(c); err != nil {
			return checkpoint.Completed{}, err
		}
		return c, nil
	}
	// No attempt starts while the savepoint is written: a restart now would
	// take checkpoints after the savepoint, which must stay the last one.
	done := make(chan struct{})
	m.mu.Lock()
	m.stopping = done
	m.mu.Unlock()
	werr := write(c)
	m.mu.Lock()
	if werr == nil && m.stopRun != nil {
		m.stopRun(errStoppedWithSavepoint)
	} else {
		m.stopping = nil
	}
	m.mu.Unlock()
	close(done)
	if werr != nil {
		if drain {
			// The sources emitted the final watermark and read no more:
			// restart from the latest checkpoint rather than go on.
			a.fail(fmt.Errorf("%w: the savepoint could not be written: %w", ErrDrainAborted, werr))
		}
		_ = d.ResumeTriggers(ctx) // fails only once the attempt is over
		return checkpoint.Completed{}, werr
	}
	return c, nil
}

// FailoverDelays sets what a failover costs beyond the restart strategy's
// delay and the restore, for the restart budget transactional operators
// check their transaction timeout against (checkpoint.Failover): detection,
// how long a failure may go unseen (a cluster's heartbeat timeout), and
// slotWait, the longest an attempt waits for free slots. Both default to 0
// (one process).
func FailoverDelays(detection, slotWait time.Duration) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.detection, c.slotWait = detection, slotWait })
}

// ErrSuspended is wrapped by Run's error when the job stopped because the
// context given to SuspendWith was done: its tasks stopped as in a
// failover, and its checkpoints and pending transactions stay for a later
// Run of the same job id to resume from (Flink's SUSPENDED).
var ErrSuspended = errors.New("job suspended")

// SuspendWith stops the job when ctx is done without cancelling it: the
// running attempt fails over (no checkpoint completes after that, tasks are
// cancelled as for a restart, transactions stay pending) and Run returns an
// error wrapping ErrSuspended instead of restarting. A job manager that
// shuts down suspends its jobs, so that the next one resumes them.
func SuspendWith(ctx context.Context) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.suspend = ctx })
}

// OnRestart calls fn each time the job fails and the restart strategy
// restarts it, with the number of restarts so far and the failure (for job
// status and metrics). fn must return quickly.
func OnRestart(fn func(restarts int, err error)) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.onRestart = fn })
}

// OnRestore calls fn before each attempt deploys its tasks, with the
// completed checkpoint it restores (0: none). fn must return quickly.
func OnRestore(fn func(attempt int, from checkpoint.ID)) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.onRestore = fn })
}

// OnNextAttempt calls fn each time the job fails and the restart strategy
// restarts it (after OnRestart), with the time the restart strategy's
// delay ends and the next attempt starts: what a job waiting in
// RESTARTING waits for (status's next_attempt_at). fn must return quickly.
func OnNextAttempt(fn func(at time.Time)) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.onNextAttempt = fn })
}

// Failpoints injects faults into every operator and the checkpoint driver.
func Failpoints(fp Failpointer) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) {
		c.fp = fp
		if fp != nil {
			c.driverFailpoint = fp.Inject
		}
	})
}

// CheckpointEvent describes a checkpoint that was triggered, completed or
// aborted.
type CheckpointEvent struct {
	ID checkpoint.ID
	// Triggered is when the checkpoint was triggered.
	Triggered time.Time
	// AfterSourceEnd is set when a source of the job had run out of input
	// when the checkpoint was triggered: its barriers then follow that
	// source's final watermark, so its cycle includes the downstream
	// tasks firing every timer and window left (a bounded job's drain).
	AfterSourceEnd bool
	// Cycle is from the trigger to the last task's notification being sent
	// (completed checkpoints).
	Cycle time.Duration
	// Size is the state bytes the tasks acknowledged (completed
	// checkpoints): the checkpoint's full size, inline and referenced.
	Size int64
	// Uploaded is the part of Size the checkpoint added: inline, or
	// written to checkpoint storage for it; references reused from earlier
	// checkpoints (incremental checkpoints) do not count. Without
	// checkpoint storage it equals Size.
	Uploaded int64
	// Err is why the checkpoint was aborted (aborted checkpoints).
	Err error
}

// OnCheckpointTriggered calls fn after each checkpoint's barriers were
// injected (for metrics: the checkpoint is in progress until
// OnCheckpointComplete or OnCheckpointAborted, or the attempt ends). fn runs
// on the checkpoint driver's goroutine and must return quickly.
func OnCheckpointTriggered(fn func(CheckpointEvent)) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.onTriggered = fn })
}

// OnCheckpointAborted calls fn after each checkpoint the coordinator
// aborted (declined, timed out, not persisted) and every task was told.
// Checkpoints in progress when an attempt fails get no call. fn runs on the
// checkpoint driver's goroutine and must return quickly.
func OnCheckpointAborted(fn func(CheckpointEvent)) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.onAborted = fn })
}

// CheckpointAck is one task's acknowledgement of a checkpoint.
type CheckpointAck struct {
	ID   checkpoint.ID
	Task checkpoint.TaskID
	// At is when the acknowledgement reached the job master.
	At time.Time
	// Size is the state bytes the task snapshotted.
	Size int64
	// Uploaded is the part of Size the task added for this checkpoint
	// (CheckpointEvent.Uploaded).
	Uploaded int64
	// Alignment is how long the task waited for the checkpoint's barrier
	// on its other inputs after the first one arrived (0 with one input).
	Alignment time.Duration
	// Sync and Async are the synchronous and asynchronous parts of the
	// task's snapshot (SnapshotTimes); Flink's "Sync Duration" and "Async
	// Duration" of a subtask.
	Sync, Async time.Duration
}

// OnCheckpointAck calls fn for each task's acknowledgement of a checkpoint
// (for statistics: Flink's acknowledged subtasks). fn runs on the calling
// task's report path and must return quickly.
func OnCheckpointAck(fn func(CheckpointAck)) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.onAck = fn })
}

// OnCheckpointComplete calls fn after each completed checkpoint was stored
// and every task was sent its notification (for tests and metrics). fn runs
// on the checkpoint driver's goroutine and must return quickly.
func OnCheckpointComplete(fn func(CheckpointEvent)) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.onCheckpoint = fn })
}

// DefaultCheckpointTimeout is how long a checkpoint may take before the
// coordinator aborts it, unless CheckpointTimeout says otherwise.
const DefaultCheckpointTimeout = time.Minute

// NewMiniCluster returns an executor with the given options.
func NewMiniCluster(opts ...ClusterOpt) *MiniCluster {
	c := clusterCfg{interval: time.Second, timeout: DefaultCheckpointTimeout, restart: FixedDelayRestart(10, 100*time.Millisecond),
		batchSize: defaultBatchSize, channelCap: defaultChannelCap, log: zap.NewNop(), restoreFromLatest: true}
	for _, o := range opts {
		o.apply(&c)
	}
	return &MiniCluster{cfg: c}
}

// Result describes a finished job.
type Result struct {
	Restarts       int
	LastCheckpoint checkpoint.ID
	// Records are what the last attempt's sources emitted and its sinks
	// wrote (Deployed.Counts once its tasks ended): a run without
	// restarts counts every record once.
	Records RecordCounts
}

// Run runs job until every source ended and the final checkpoint completed
// (nil), ctx is done (ctx's error), or the job failed more often than its
// restart budget (an error wrapping ErrJobFailed and the last failure). A
// restart restores every task from the latest completed checkpoint.
//
// Cancelling ctx cancels the job for good, whatever it is doing: its
// latest completed checkpoint's transactions are committed, later ones
// aborted and held records released before Run returns. A running attempt
// does it in its tasks (checkpoint.CancelListener); when none runs (the job
// is restarting, waiting for its deployment, restoring, or just resumed)
// the job master does it itself (endCanceled). If that fails, Run's error
// wraps ctx's error and the failure.
func (m *MiniCluster) Run(parent context.Context, job *Job) (Result, error) {
	ctx, stop := context.WithCancelCause(parent)
	defer stop(nil)
	m.mu.Lock()
	m.stopRun = stop
	m.mu.Unlock()
	res, err := m.run(ctx, job)
	if parent.Err() == nil && errors.Is(context.Cause(ctx), errStoppedWithSavepoint) && err == context.Canceled { //nolint:errorlint // only the plain cancel, not a failure to end the job wrapping it
		return res, nil // stopped with a savepoint: finished
	}
	return res, err
}

// run is Run's work.
func (m *MiniCluster) run(ctx context.Context, job *Job) (Result, error) {
	cfg := m.cfg
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	p, err := compile(job)
	if err != nil {
		return Result{}, err
	}
	if cfg.jobID == "" {
		cfg.jobID = job.name
	}
	if job.StateBackendOf() == PebbleState && cfg.deployer == nil {
		memOpts := []StateMemoryOpt{StateMemoryBudget(cfg.stateBudget), StateSlots(p.slots()), StateLogger(cfg.log)}
		if cfg.stateDir != "" {
			memOpts = append(memOpts, StateDir(cfg.stateDir))
		}
		mem, err := NewStateMemory(memOpts...)
		if err != nil {
			return Result{}, err
		}
		defer mem.Close()
		cfg.stateMem = mem
	}
	store := cfg.store
	if store == nil {
		dir, opts := cfg.storeDir, []checkpoint.StoreOpt{checkpoint.WithLogger(cfg.log)}
		if dir == "" {
			dir, opts = "checkpoints", append(opts, checkpoint.InMemory())
		}
		owned, err := checkpoint.OpenStore(dir, opts...)
		if err != nil {
			return Result{}, fmt.Errorf("open checkpoint store: %w", err)
		}
		defer owned.Close()
		store = owned
	}
	imported, err := importStart(ctx, cfg, store)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrJobFailed, err)
	}
	gc := newStateGC(cfg, store)
	defer func() { // the job ended: what no retained checkpoint references goes
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelEndTimeout)
		defer cancel()
		gc.ended(ectx)
	}()
	var res Result
	pending := newPendingHandles()
	summary := newCheckpointSummary(cfg.log, cfg.jobID, checkpointSummaryEvery, time.Now())
	defer func() { summary.flush(time.Now()) }()
	var cause string
	var failures []time.Time
	// Only a savepoint imported here is verified (RestoreVerifier): the
	// job's own latest checkpoint, restored by a restart, a resumed job or
	// a run started again on its checkpoint directory, is its lineage's
	// latest by construction, and judging it could only refuse it for
	// another consumer's progress on the same share group. A job manager
	// verifies the savepoint it imports at submit (VerifyRestore).
	verified := !imported
	var a *attempt // the current attempt, nil while none was made
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return res, m.endCanceled(ctx, cfg, store, p, pending, attempt)
		}
		if cfg.suspend != nil && cfg.suspend.Err() != nil {
			return res, fmt.Errorf("%w: %w", ErrSuspended, context.Cause(cfg.suspend))
		}
		// A store whose last write's outcome is unknown is reopened: what
		// it recovers decides where the job restores from.
		if err := store.Reopen(); err != nil {
			return res, fmt.Errorf("%w: %w", ErrJobFailed, err)
		}
		if err := gc.rebuild(ctx); err != nil {
			cfg.log.Warn("checkpoint storage: cannot rebuild the reference registry; nothing is deleted until it is rebuilt", zap.Error(err))
		} else {
			gc.sweep(ctx, cfg.orphanGrace)
		}
		restore, err := m.loadRestore(ctx, store, cfg.jobID, p, pending)
		if err != nil {
			if ctx.Err() != nil {
				return res, m.endCanceled(ctx, cfg, store, p, pending, attempt)
			}
			return res, err
		}
		if restore.From > 0 {
			cfg.log.Info("restoring from checkpoint", zap.String("job", cfg.jobID), zap.Uint64("checkpoint", uint64(restore.From)),
				zap.Int("attempt", attempt), zap.Int("transactions_to_commit", restore.handleCount()))
		}
		if cfg.onRestore != nil {
			cfg.onRestore(attempt, restore.From)
		}
		m.mu.Lock()
		stopping := m.stopping
		m.mu.Unlock()
		if stopping != nil {
			<-stopping // a stop-with-savepoint writes its savepoint
			if ctx.Err() != nil {
				return res, m.endCanceled(ctx, cfg, store, p, pending, attempt)
			}
		}
		// Before the first attempt restores an imported savepoint, its
		// operators verify it (RestoreVerifier).
		var runErr error
		if !verified && restore.From > 0 {
			runErr = verifyRestore(ctx, p, cfg.jobID, restore)
			if runErr != nil && ctx.Err() == nil && !isConfigError(runErr) {
				runErr = fmt.Errorf("verify the restore of checkpoint %d: %w", restore.From, runErr)
			}
		}
		a = nil
		if runErr == nil {
			verified = true
			a = newAttempt(cfg, p, store, attempt, pending)
			a.cause, a.summary, a.gc = cause, summary, gc
			m.mu.Lock()
			m.current = a
			m.mu.Unlock()
			var last checkpoint.ID
			last, runErr = a.run(ctx, restore)
			m.mu.Lock()
			m.current = nil
			m.mu.Unlock()
			if a.dep != nil {
				res.Records = a.dep.Counts()
			}
			if last > res.LastCheckpoint {
				res.LastCheckpoint = last
			}
			if runErr == nil {
				return res, nil
			}
		}
		if ctx.Err() != nil {
			if a != nil && a.endedForGood {
				return res, ctx.Err()
			}
			// The attempt failed or was still deploying or opening when
			// the cancel came: no task ended the job.
			return res, m.endCanceled(ctx, cfg, store, p, pending, attempt+1)
		}
		if errors.Is(runErr, ErrSuspended) {
			return res, runErr
		}
		if isConfigError(runErr) {
			return res, fmt.Errorf("%w (not restarted): %w", ErrJobFailed, runErr)
		}
		// The restart delay counts from the failure, as Flink's scheduler
		// counts it, not from the end of the failed attempt: cancelling
		// its other tasks (a share-group source waits for its fetch in
		// flight) runs during the delay, and the next attempt starts once
		// both are over.
		failedAt := time.Now()
		if a != nil && !a.failedAt.IsZero() {
			failedAt = a.failedAt
		}
		failures = append(failures, failedAt)
		d := cfg.restart.Decide(failures, rand.Float64())
		if !d.Restart {
			return res, fmt.Errorf("%w after %d restarts (%s): %w", ErrJobFailed, attempt, d.Reason, runErr)
		}
		res.Restarts++
		cause = runErr.Error()
		if cfg.onRestart != nil {
			cfg.onRestart(res.Restarts, runErr)
		}
		fields := []zap.Field{zap.String("job", cfg.jobID), zap.String("strategy", cfg.restart.Name()), zap.Int("attempt", d.Attempt)}
		if cfg.restart.name == StrategyFixedDelay {
			fields = append(fields, zap.Int("max_restarts", cfg.restart.attempts))
		}
		next := failedAt.Add(d.Delay)
		if cfg.onNextAttempt != nil {
			cfg.onNextAttempt(next)
		}
		cfg.log.Warn("job failed, restarting from the latest completed checkpoint",
			append(fields, zap.Duration("delay", d.Delay), zap.Time("next_attempt_at", next), zap.Error(runErr))...)
		select {
		case <-time.After(time.Until(next)):
		case <-ctx.Done():
			return res, m.endCanceled(ctx, cfg, store, p, pending, attempt+1)
		case <-cfg.suspended():
			return res, fmt.Errorf("%w while restarting: %w", ErrSuspended, context.Cause(cfg.suspend))
		}
	}
}

// suspended is done when the job must suspend (never without SuspendWith).
func (c *clusterCfg) suspended() <-chan struct{} {
	if c.suspend == nil {
		return nil
	}
	return c.suspend.Done()
}

// endCanceled ends the job cancelled (ctx done) while none of its attempts
// ran to a cancel for good, and returns ctx's error: the pre-committed
// transactions an attempt that failed left to the next one would otherwise
// stay open until the broker's transaction timeout (pinning every
// read_committed reader), and the latest completed checkpoint's would be
// aborted with them (its output lost) if no task was told it completed.
// It runs the restore path of the next attempt and then the cancel for
// good, in this process and reading no record: the latest completed
// checkpoint's transactions are committed (RestoreCommitter, and each
// operator's Open), later ones aborted, and every
// checkpoint.CancelListener is told that checkpoint, before every operator
// closes (releasing what it holds). A job manager therefore ends such a
// job itself, without task managers or slots. A failure is logged and
// wrapped into the error returned.
func (m *MiniCluster) endCanceled(ctx context.Context, cfg clusterCfg, store CheckpointStorage, p *plan, pending *pendingHandles, attempt int) error {
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelEndTimeout)
	defer cancel()
	from, err := m.end(ectx, cfg, store, p, pending, attempt)
	if err != nil {
		cfg.log.Error("the cancelled job could not end all its transactions; they end at the broker's transaction timeout",
			zap.String("job", cfg.jobID), zap.Uint64("checkpoint", uint64(from)), zap.Error(err))
		return fmt.Errorf("%w (ending the job failed: %w)", ctx.Err(), err)
	}
	cfg.log.Info("cancelled job ended: its latest completed checkpoint committed, later transactions aborted",
		zap.String("job", cfg.jobID), zap.Uint64("checkpoint", uint64(from)))
	return ctx.Err()
}

// end is endCanceled's work; it returns the checkpoint it committed.
func (m *MiniCluster) end(ctx context.Context, cfg clusterCfg, store CheckpointStorage, p *plan, pending *pendingHandles, attempt int) (checkpoint.ID, error) {
	if err := store.Reopen(); err != nil {
		return 0, err
	}
	restore, err := m.loadRestore(ctx, store, cfg.jobID, p, pending)
	if err != nil {
		return 0, err
	}
	d, err := deploy(ctx, p, DeploySpec{JobID: cfg.jobID, Attempt: attempt, Restore: restore, LastCompleted: restore.From,
		BatchSize: cfg.batchSize, ChannelCapacity: cfg.channelCap, Logger: cfg.log,
		Storage: cfg.stateStorage, StorageURL: cfg.stateStorageURL, InlineLimit: cfg.inlineLimit, StateMemory: cfg.stateMem}, nil, endReports{})
	if err != nil {
		return restore.From, err
	}
	a := newAttempt(cfg, p, store, attempt, pending)
	tolerable, err := a.tolerableFailures(d.prep.Discarding)
	if err != nil {
		tolerable = -1 // refused when the job runs; ending it tolerates nothing
	}
	return restore.From, d.end(ctx, a.timing(tolerable))
}

// endReports receives the reports of a deployment that only ends a job:
// its tasks read no record and take no checkpoint.
type endReports struct{}

func (endReports) Ack(checkpoint.TaskID, checkpoint.ID, checkpoint.TaskSnapshot, SnapshotTimes) {}
func (endReports) Decline(checkpoint.TaskID, checkpoint.ID, error)                              {}
func (endReports) SourceEnded(checkpoint.TaskID)                                                {}
func (endReports) Failed(checkpoint.TaskID, error)                                              {}
func (endReports) RequestCheckpoint(string)                                                     {}

// loadRestore reads the latest usable checkpoint and assigns its state and
// transaction handles to the operators of p (AssignState).
func (m *MiniCluster) loadRestore(ctx context.Context, store CheckpointStorage, job string, p *plan, pending *pendingHandles) (*StateAssignment, error) {
	c, skipped, err := store.LatestUsable(ctx, job)
	if errors.Is(err, checkpoint.ErrNotFound) && len(skipped) == 0 {
		return &StateAssignment{Subtasks: map[OperatorSubtask]*SubtaskState{}}, nil
	}
	if err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
		return nil, fmt.Errorf("restore job %q: %w", job, err)
	}
	for _, s := range skipped {
		if !s.HandlesOK {
			m.cfg.log.Error("skipping a corrupt completed checkpoint whose transaction handles are unreadable too: "+
				"its pre-committed transactions cannot be committed and will be aborted by the broker's timeout (data loss)",
				zap.Uint64("checkpoint", uint64(s.ID)), zap.Error(s.Err))
			continue
		}
		m.cfg.log.Error("skipping a corrupt completed checkpoint; its transactions are committed, "+
			"and records between it and the restored checkpoint may be processed twice",
			zap.Uint64("checkpoint", uint64(s.ID)), zap.Error(s.Err))
	}
	as, err := AssignState(p.layout(), RestoreInput{Checkpoint: c, Skipped: skipped, Abort: pending.after(c.ID),
		AllowNonRestoredState: m.cfg.allowNonRestored})
	if err != nil {
		return nil, fmt.Errorf("restore job %q: %w", job, err)
	}
	if len(as.NonRestored) > 0 {
		m.cfg.log.Warn("restoring without the state of operators no longer in the job (AllowNonRestoredState); their transactions are committed",
			zap.Uint64("checkpoint", uint64(c.ID)), zap.Strings("uids", as.NonRestored), zap.Int("transactions", len(as.Orphans)))
	}
	return as, nil
}

// Deployer runs an attempt's tasks: the mini cluster's own deploys every
// task in this process; a job manager's fans them out to task managers
// (docs/architecture.md, "Cluster").
type Deployer interface {
	// Deploy builds, connects and prepares the tasks of spec's attempt,
	// which report to rep. Cancelling ctx stops them.
	Deploy(ctx context.Context, spec DeploySpec, rep TaskReports) (Deployed, error)
}

// Deployment runs the job's tasks through d instead of in this process. A
// job cancelled while no attempt runs is still ended in this process (see
// Run): its operators are built here, and must reach what they end (the
// brokers).
func Deployment(d Deployer) ClusterOpt { return clusterOpt(func(c *clusterCfg) { c.deployer = d }) }

// StateMemoryLimit is the memory budget in bytes of a job on the pebble
// state backend run in this process (default DefaultStateMemory()): its
// keyed operators' pebble instances live in a temporary directory the run
// removes when it ends.
func StateMemoryLimit(bytes int64) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.stateBudget = bytes })
}

// StateMemoryDir puts the pebble instances of a job on the pebble state
// backend in dir, emptied when the run starts (default: a temporary
// directory removed when the run ends).
func StateMemoryDir(dir string) ClusterOpt {
	return clusterOpt(func(c *clusterCfg) { c.stateDir = dir })
}

// localDeployer deploys every task of a plan in this process.
type localDeployer struct{ p *plan }

func (l localDeployer) Deploy(ctx context.Context, spec DeploySpec, rep TaskReports) (Deployed, error) {
	d, err := deploy(ctx, l.p, spec, nil, rep)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// attempt is one run of every task of the job, from one restore point: the
// job master's side (coordinator, reports); the tasks are a Deployed.
type attempt struct {
	cfg      clusterCfg
	p        *plan
	deployer Deployer
	store    CheckpointStorage
	n        int
	pending  *pendingHandles

	dep       Deployed
	sources   []checkpoint.TaskID
	driver    *checkpoint.Driver
	drv       atomic.Pointer[checkpoint.Driver] // driver, for TriggerSavepoint
	ended     atomic.Int32
	lastDone  checkpoint.Latest
	sizeMu    sync.Mutex
	sizes     map[checkpoint.ID]int64     // state bytes acknowledged per checkpoint
	triggered map[checkpoint.ID]triggered // driver goroutine only
	cause     string                      // failure that led to this attempt
	summary   *checkpointSummary          // the job's, across attempts
	// endedForGood: every task opened, and the attempt ended with the job's
	// cancel, so each task told its operators (checkpoint.CancelListener).
	endedForGood bool
	// reports are the report goroutines in flight; once reportsOver is set
	// (the attempt is over, its driver stopped), reports are dropped: a task
	// manager's late ack may still arrive, and nothing could act on it.
	reports     sync.WaitGroup
	reportsMu   sync.Mutex
	reportsOver bool
	ctx         context.Context
	fail        func(error)
	gc          *stateGC                // nil: no checkpoint storage
	uploaded    map[checkpoint.ID]int64 // state bytes written per checkpoint (sizeMu)

	// failedAt is when the attempt's first failure was reported (zero: it
	// did not fail, or failed before its tasks were deployed); set before
	// run returns.
	failedAt time.Time
}

// triggered is what an attempt remembers of a checkpoint it triggered.
type triggered struct {
	at             time.Time
	afterSourceEnd bool // a source had ended (CheckpointEvent.AfterSourceEnd)
}

func newAttempt(cfg clusterCfg, p *plan, store CheckpointStorage, n int, pending *pendingHandles) *attempt {
	d := cfg.deployer
	if d == nil {
		d = localDeployer{p}
	}
	return &attempt{cfg: cfg, p: p, deployer: d, store: store, n: n, pending: pending, triggered: map[checkpoint.ID]triggered{}}
}

// run deploys, opens, starts and waits for every task; it returns the last
// completed checkpoint and nil when the job finished, or the first failure.
//
// Cancelling parent cancels the job for good: the coordinator stops first
// (no checkpoint completes after that), then the tasks are cancelled for
// good (Deployed.Cancel(true)), and each operator that is a
// checkpoint.CancelListener gets NotifyJobCanceled with the last completed
// checkpoint before it closes.
func (a *attempt) run(parent context.Context, restore *StateAssignment) (checkpoint.ID, error) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	defer cancel(nil)
	a.ctx = ctx
	var once sync.Once
	var firstErr error
	a.fail = func(err error) {
		once.Do(func() { firstErr, a.failedAt = err, time.Now() })
		cancel(err)
	}
	if a.cfg.suspend != nil {
		defer context.AfterFunc(a.cfg.suspend, func() {
			a.fail(fmt.Errorf("%w: %w", ErrSuspended, context.Cause(a.cfg.suspend)))
		})()
	}
	// Everything the restore must commit is committed before any subtask
	// opens (Deploy): an Open may fence or reuse transactional ids. A job
	// cancelled meanwhile stops the deployment at once (it may be waiting
	// for slots).
	stopDeploy := context.AfterFunc(parent, func() { cancel(ErrJobCanceled) })
	dep, err := a.deployer.Deploy(ctx, DeploySpec{JobID: a.cfg.jobID, Attempt: a.n, Restore: restore,
		LastCompleted: restore.From, RestartCause: a.cause, BatchSize: a.cfg.batchSize,
		ChannelCapacity: a.cfg.channelCap, Logger: a.cfg.log, Failpoints: a.cfg.fp,
		Storage: a.cfg.stateStorage, StorageURL: a.cfg.stateStorageURL, InlineLimit: a.cfg.inlineLimit, FullUploads: a.cfg.fullUploads,
		StateMemory: a.cfg.stateMem}, a)
	stopDeploy()
	if err != nil {
		if errors.Is(context.Cause(ctx), ErrJobCanceled) {
			return 0, parent.Err()
		}
		if cause := context.Cause(ctx); errors.Is(cause, ErrSuspended) {
			return 0, cause // not a failure: the job manager stops
		}
		return 0, err
	}
	a.dep = dep
	abandon := func(err error) (checkpoint.ID, error) {
		dep.Cancel(false)
		dep.Wait()
		return 0, err
	}
	prep := dep.Prepared()
	if len(restore.Orphans) > 0 && prep.RestoreCommitters == 0 {
		return abandon(Unrecoverable(fmt.Errorf("%w: %d transactions of checkpoint %d (%s) must be committed, but no operator of the job can commit them (none implements RestoreCommitter)",
			ErrIncompatibleState, len(restore.Orphans), restore.From, strings.Join(restore.NonRestored, ", "))))
	}
	tolerable, err := a.tolerableFailures(prep.Discarding)
	if err != nil {
		return abandon(err)
	}
	ids, srcIDs := a.p.taskIDs()
	a.sources = srcIDs
	var dopts []checkpoint.DriverOpt
	if a.cfg.driverFailpoint != nil {
		dopts = append(dopts, checkpoint.WithFailpoint(a.cfg.driverFailpoint))
	}
	a.driver, err = checkpoint.NewDriver(checkpoint.CoordinatorConfig{
		Job: a.cfg.jobID, Interval: a.cfg.interval, Timeout: a.cfg.timeout, MinPause: a.cfg.coordinatorMinPause(),
		TolerableFailures: tolerable, Tasks: ids, Sources: srcIDs,
	}, a, notingPersister{a.store, dep, a.gc, a.ctx}, dopts...)
	if err != nil {
		return abandon(Unrecoverable(fmt.Errorf("%w", err)))
	}
	a.drv.Store(a.driver)

	driverDone := make(chan error, 1)
	driverStopped := make(chan struct{})
	driverCtx, stopDriver := context.WithCancel(ctx)
	// A coordinator that does not stop in time may still be saving a
	// checkpoint: the tasks are then cancelled as for a restart (their
	// transactions stay open), and once the coordinator stopped Run ends
	// the job from what the store holds (endCanceled), so a checkpoint
	// saved after the tasks stopped is committed, not aborted.
	defer context.AfterFunc(parent, func() {
		stopDriver()
		select {
		case <-driverStopped:
			cancel(ErrJobCanceled)
		case <-time.After(cancelDriverWait):
			a.cfg.log.Warn("the checkpoint coordinator did not stop in time; cancelling the tasks, the job ends once it stopped",
				zap.Duration("waited", cancelDriverWait))
			cancel(errCoordinatorStuck)
		}
	})()
	// However the attempt ends, its tasks stop: for good if the job was
	// cancelled.
	defer context.AfterFunc(ctx, func() { dep.Cancel(errors.Is(context.Cause(ctx), ErrJobCanceled)) })()
	go func() {
		defer close(driverStopped)
		err := a.driver.Run(driverCtx)
		if err != nil && driverCtx.Err() == nil {
			// The coordinator stopped (e.g. a failpoint after persisting a
			// checkpoint): the job manager is gone, the attempt fails.
			a.fail(fmt.Errorf("checkpoint coordinator stopped: %w", err))
		} else if err == nil && driverCtx.Err() == nil {
			a.fail(errors.New("checkpoint coordinator stopped"))
		}
		driverDone <- err
	}()

	opened := false
	if err := dep.Open(ctx, a.timing(tolerable)); err == nil && ctx.Err() == nil {
		opened = true
		if err := dep.Start(ctx); err != nil && ctx.Err() == nil {
			a.fail(fmt.Errorf("start tasks: %w", err))
		}
	}
	finished := dep.Wait()
	a.endedForGood = opened && errors.Is(context.Cause(ctx), ErrJobCanceled)
	stopDriver()
	derr := <-driverDone
	a.reportsMu.Lock()
	a.reportsOver = true
	a.reportsMu.Unlock()
	a.reports.Wait()
	last := a.lastDone.Load()
	if firstErr != nil {
		return last, firstErr
	}
	if finished {
		return last, nil
	}
	if derr != nil && !errors.Is(derr, context.Canceled) {
		return last, derr
	}
	if errors.Is(context.Cause(ctx), ErrJobCanceled) {
		return last, parent.Err()
	}
	return last, context.Cause(ctx)
}

// notingPersister saves completed checkpoints and, once a save succeeded
// (the commit point), tells the deployment that the checkpoint completed
// (completedNoter) before the coordinator goes on to notify the tasks. A
// cancel for good that reaches the tasks between the two (the coordinator
// failed or stopped right after the save) then commits what that
// checkpoint covers: the store says it completed, so its transactions must
// not be aborted.
//
// With checkpoint storage it first refuses a checkpoint that reuses a state
// object no retained checkpoint references any more (it may be deleted),
// and after the save deletes the objects retention left unreferenced.
type notingPersister struct {
	CheckpointStorage
	dep Deployed
	gc  *stateGC
	ctx context.Context // the attempt's, for deletions
}

func (p notingPersister) Save(ctx context.Context, c checkpoint.Completed) error {
	if err := p.gc.check(c); err != nil {
		return err
	}
	if err := p.CheckpointStorage.Save(ctx, c); err != nil {
		if errors.Is(err, checkpoint.ErrOutcomeUnknown) {
			p.gc.outcomeUnknown(c.ID)
		}
		return err
	}
	if n, ok := p.dep.(completedNoter); ok {
		n.NoteCompleted(c.ID)
	}
	p.gc.saved(p.ctx, c)
	return nil
}

// tolerableFailures is the coordinator's TolerableFailures: the configured
// tolerance if every checkpoint listener of the job carries an aborted
// checkpoint's work to the next one (discarding names those that do not),
// none otherwise; a tolerance asked for explicitly in that case is refused.
func (a *attempt) tolerableFailures(discarding []string) (int, error) {
	switch {
	case len(discarding) == 0:
		return a.cfg.tolerable, nil
	case a.cfg.tolerable > 0:
		return 0, fmt.Errorf("%w: TolerableCheckpointFailures(%d): operators %q may discard an aborted checkpoint's work (they are checkpoint listeners but not checkpoint.AbortCarrier), so a tolerated failure would lose records; every failed checkpoint must roll the job back",
			ErrInvalidOption, a.cfg.tolerable, discarding)
	}
	return -1, nil
}

// timing is the checkpoint timing the attempt runs with, given the
// coordinator's TolerableFailures setting.
func (a *attempt) timing(tolerable int) checkpoint.Timing {
	switch {
	case tolerable == 0:
		tolerable = checkpoint.DefaultTolerableFailures
	case tolerable < 0:
		tolerable = 0
	}
	f := checkpoint.Failover{Detection: a.cfg.detection, SlotWait: a.cfg.slotWait,
		RestartDelay: a.cfg.restart.maxDelay(), Recovery: a.cfg.timeout}
	return checkpoint.Timing{Interval: a.cfg.interval, Timeout: a.cfg.timeout,
		MinPause:          checkpoint.EffectiveMinPause(a.cfg.coordinatorMinPause(), a.cfg.interval),
		TolerableFailures: tolerable, RestartBudget: f.Total(), Failover: f}
}

// RequestCheckpoint implements TaskReports.
func (a *attempt) RequestCheckpoint(reason string) {
	a.report(func(ctx context.Context) error { return a.driver.TriggerNow(ctx, reason) })
}

// report hands a message to the driver without blocking the calling task.
func (a *attempt) report(fn func(ctx context.Context) error) {
	a.reportsMu.Lock()
	defer a.reportsMu.Unlock()
	if a.reportsOver {
		return
	}
	a.reports.Add(1)
	go func() {
		defer a.reports.Done()
		_ = fn(a.ctx) // fails only when the attempt is over
	}()
}

// Ack implements TaskReports.
func (a *attempt) Ack(task checkpoint.TaskID, id checkpoint.ID, snap checkpoint.TaskSnapshot, times SnapshotTimes) {
	a.pending.add(id, snap)
	a.sizeMu.Lock()
	if a.sizes == nil {
		a.sizes = map[checkpoint.ID]int64{}
	}
	a.sizes[id] += snap.Size()
	if a.uploaded == nil {
		a.uploaded = map[checkpoint.ID]int64{}
	}
	a.uploaded[id] += snap.Uploaded(id)
	a.sizeMu.Unlock()
	a.gc.acked(id, snap)
	if a.cfg.onAck != nil {
		a.cfg.onAck(CheckpointAck{ID: id, Task: task, At: time.Now(), Size: snap.Size(), Uploaded: snap.Uploaded(id), Alignment: times.Alignment,
			Sync: times.Sync, Async: times.Async})
	}
	a.report(func(ctx context.Context) error { return a.driver.Ack(ctx, task, id, snap, times.Alignment) })
}

// Decline implements TaskReports.
func (a *attempt) Decline(task checkpoint.TaskID, id checkpoint.ID, err error) {
	a.cfg.log.Info("checkpoint declined", zap.String("task", string(task)), zap.Uint64("checkpoint", uint64(id)), zap.Error(err))
	a.report(func(ctx context.Context) error { return a.driver.Decline(ctx, task, id, err) })
}

// Failed implements TaskReports.
func (a *attempt) Failed(_ checkpoint.TaskID, err error) { a.fail(err) }

// SourceEnded implements TaskReports.
func (a *attempt) SourceEnded(checkpoint.TaskID) {
	if int(a.ended.Add(1)) == len(a.sources) {
		a.RequestCheckpoint("every source ended")
	}
}

// TriggerCheckpoint implements checkpoint.Executor.
func (a *attempt) TriggerCheckpoint(ctx context.Context, id checkpoint.ID, sources []checkpoint.TaskID, drain bool) error {
	ended := int(a.ended.Load())
	tr := triggered{at: time.Now(), afterSourceEnd: ended > 0}
	a.triggered[id] = tr
	if err := a.dep.Trigger(ctx, id, sources, Barrier{Final: ended == len(a.sources), Drain: drain}); err != nil {
		return err
	}
	if a.cfg.onTriggered != nil {
		a.cfg.onTriggered(CheckpointEvent{ID: id, Triggered: tr.at, AfterSourceEnd: tr.afterSourceEnd})
	}
	return nil
}

// NotifyComplete implements checkpoint.Executor.
func (a *attempt) NotifyComplete(ctx context.Context, id checkpoint.ID) {
	a.pending.completed(id)
	a.lastDone.Note(id)
	a.dep.Notify(ctx, id, true)
	tr := a.triggered[id]
	cycle := time.Since(tr.at)
	a.sizeMu.Lock()
	size, uploaded := a.sizes[id], a.uploaded[id]
	for cid := range a.sizes {
		if cid <= id {
			delete(a.sizes, cid)
			delete(a.uploaded, cid)
		}
	}
	a.sizeMu.Unlock()
	a.summary.completed(time.Now(), id, cycle, size)
	if a.cfg.onCheckpoint != nil {
		a.cfg.onCheckpoint(CheckpointEvent{ID: id, Triggered: tr.at, AfterSourceEnd: tr.afterSourceEnd, Cycle: cycle, Size: size, Uploaded: uploaded})
	}
	for cid := range a.triggered {
		if cid <= id {
			delete(a.triggered, cid)
		}
	}
}

// NotifyAborted implements checkpoint.Executor.
func (a *attempt) NotifyAborted(ctx context.Context, id checkpoint.ID, reason error) {
	a.cfg.log.Info("checkpoint aborted", zap.Uint64("checkpoint", uint64(id)), zap.Error(reason))
	a.dep.Notify(ctx, id, false)
	a.gc.aborted(ctx, id)
	a.sizeMu.Lock()
	delete(a.sizes, id)
	delete(a.uploaded, id)
	a.sizeMu.Unlock()
	if a.cfg.onAborted != nil {
		tr := a.triggered[id]
		a.cfg.onAborted(CheckpointEvent{ID: id, Triggered: tr.at, AfterSourceEnd: tr.afterSourceEnd, Err: reason})
	}
	delete(a.triggered, id)
}

// FailJob implements checkpoint.Executor.
func (a *attempt) FailJob(_ context.Context, err error) {
	a.fail(fmt.Errorf("checkpointing failed: %w", err))
}
