package jobmanager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/runtime"
)

// Jobs on the job manager (docs/architecture.md, "Cluster"): a submitted
// job is recorded in the job store (synced) before its id is returned, and
// then runs as runtime's job master loop (restore, checkpoint coordinator,
// restart strategy) over a deployer into the task managers' slots, with
// its checkpoints in the job manager's pebble checkpoint store. A job
// manager that stops suspends its jobs (their transactions stay pending);
// one started on the same data directory resumes every job that was not
// finished, failed or cancelled, from its latest completed checkpoint.

// DefaultRestartStrategy is the restart strategy of a job submitted without
// one: Flink's default for a checkpointed job (since 1.19).
func DefaultRestartStrategy() runtime.RestartPolicy { return runtime.ExponentialDelayRestart() }

// restartPolicy is the restart strategy a job submitted with spec runs
// under: DefaultRestartStrategy when spec is empty.
func restartPolicy(spec string) (runtime.RestartPolicy, error) {
	if spec == "" {
		return DefaultRestartStrategy(), nil
	}
	return runtime.ParseRestartStrategy(spec)
}

// restartStrategyInForce is the spec of the strategy a job submitted with
// spec runs under, every parameter spelled out, as its status shows it.
func restartStrategyInForce(spec string) string {
	p, err := restartPolicy(spec)
	if err != nil {
		return spec // refused at submit; shown as given
	}
	return p.String()
}

// DefaultSlotTimeout is how long an attempt waits for free slots before it
// fails (and the restart strategy decides), as Flink's slot.request.timeout
// bounds a slot request.
const DefaultSlotTimeout = 60 * time.Second

// submitCheckTimeout bounds a job type's Check at submit.
const submitCheckTimeout = 10 * time.Second

// ErrCheckFailed is wrapped by Submit's error when the job type's Check
// refused the job (e.g. its brokers are unreachable).
var ErrCheckFailed = errors.New("job refused by its check")

// suspendWait bounds how long a stopping job manager waits for its jobs'
// tasks to stop before it closes the task managers' sessions.
const suspendWait = 15 * time.Second

// jobs are the jobs this job manager runs.
type jobs struct {
	store jobStore
	cps   checkpointStore

	mu      sync.Mutex
	running map[string]*runningJob
	stats   map[string]*cpStats // every job started here, kept after it ends
	// final is the last attempt of every job that ended here: its tasks'
	// placement and final metrics, kept for REST and the dashboard.
	final map[string]endedAttempt
	// savepoints are the savepoint operations asked of each job here.
	savepoints map[string][]*SavepointOp
	wg         sync.WaitGroup
	suspend    context.CancelCauseFunc
	ctx        context.Context // suspended when the job manager stops
}

// runningJob is a job whose job master loop runs here.
type runningJob struct {
	cancel context.CancelFunc
	done   chan struct{}

	graph runtime.Graph
	stats *cpStats
	start time.Time            // when this job manager started the job
	mc    *runtime.MiniCluster // runs the job; takes its savepoints

	mu       sync.Mutex
	rec      JobRecord
	last     checkpoint.ID
	restored checkpoint.ID     // what the current attempt restored
	current  *remoteDeployment // the current attempt (nil before the first)
	waiting  string            // why the job waits for its next attempt ("": it does not)
	// nextAttempt is when the restart strategy's delay ends and the next
	// attempt starts (zero once it started, or before the first failure).
	nextAttempt time.Time
	// recoveries are the latest restarts, timed (Recovery).
	recoveries []*recovery
}

// endedAttempt is the last attempt of a job that stopped here.
type endedAttempt struct {
	graph   runtime.Graph
	placed  map[checkpoint.TaskID]placedTask
	attempt int
	records runtime.RecordCounts
}

// attempt returns the current attempt (nil before the first).
func (j *runningJob) attempt() *remoteDeployment {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.current
}

func (j *runningJob) record() (JobRecord, checkpoint.ID) {
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.rec
	r.Params = maps.Clone(r.Params)
	r.RestoredFrom = j.restored
	r.Exceptions = slices.Clone(r.Exceptions)
	if j.current != nil && !ended(r.State) {
		r.Records = j.current.Counts()
	}
	if r.State == StateCreated || r.State == StateRestarting {
		r.Waiting = j.waiting
	}
	if r.State == StateRestarting && !j.nextAttempt.IsZero() {
		r.NextAttemptUnixMs = j.nextAttempt.UnixMilli()
	}
	return r, j.last
}

// ended reports whether a job in state st is over.
func ended(st JobState) bool {
	return st == StateFinished || st == StateFailed || st == StateCanceled
}

// exception describes err, which failed an attempt of rj (restarted: the
// job restarts) or rj itself, for its exception history.
func (rj *runningJob) exception(err error, restarted bool) JobException {
	e := JobException{UnixMs: time.Now().UnixMilli(), Message: err.Error(), Restarted: restarted}
	var tf *taskFailure
	if errors.As(err, &tf) {
		e.TaskManager = tf.taskManager
		e.Task = taskName(rj.graph, tf.task)
	}
	return e
}

// taskName names task t of g as Flink names a subtask: "name (2/4)" for
// the second of four; t itself if g does not hold it, "" for none.
func taskName(g runtime.Graph, t checkpoint.TaskID) string {
	if t == "" {
		return ""
	}
	for _, v := range g.Vertices {
		if i := slices.Index(v.Tasks, t); i >= 0 {
			return fmt.Sprintf("%s (%d/%d)", v.Name, i+1, v.Parallelism)
		}
	}
	return string(t)
}

// open opens the job manager's stores in dir ("" keeps them in memory).
func (js *jobs) open(dir string, log *zap.Logger) error {
	var err error
	jobDir, opts := "", []checkpoint.StoreOpt{checkpoint.WithLogger(log)}
	cpDir := "checkpoints"
	if dir != "" {
		jobDir, cpDir = filepath.Join(dir, "jobs"), filepath.Join(dir, "checkpoints")
	} else {
		opts = append(opts, checkpoint.InMemory())
	}
	if js.store, err = OpenJobStore(jobDir); err != nil {
		return err
	}
	if js.cps, err = checkpoint.OpenStore(cpDir, opts...); err != nil {
		js.store.Close()
		return fmt.Errorf("open checkpoint store: %w", err)
	}
	return nil
}

// init readies js to run jobs, before its stores are open.
func (js *jobs) init() {
	js.running = map[string]*runningJob{}
	js.stats = map[string]*cpStats{}
	js.final = map[string]endedAttempt{}
	js.savepoints = map[string][]*SavepointOp{}
	js.ctx, js.suspend = context.WithCancelCause(context.Background())
}

func (js *jobs) close() error {
	var errs []error
	if js.cps != nil {
		errs = append(errs, js.cps.Close())
	}
	if js.store != nil {
		errs = append(errs, js.store.Close())
	}
	return errors.Join(errs...)
}

// resume starts every job the store holds that is not over.
func (s *Server) resume() error {
	recs, err := s.jobs.store.List()
	if err != nil {
		return err
	}
	for _, r := range recs {
		if ended(r.State) {
			continue
		}
		s.cfg.log.Info("resuming job", zap.String("job_id", r.ID), zap.String("job", r.Type), zap.String("state", string(r.State)))
		job, err := s.cfg.jobs.Build(r.Type, r.Params)
		if err == nil {
			err = s.start(r, job, s.cfg.ha != nil)
		}
		if err != nil {
			r.State, r.Error, r.ChangedUnixMs = StateFailed, err.Error(), time.Now().UnixMilli()
			s.cfg.log.Error("job cannot resume", zap.String("job_id", r.ID), zap.Error(err))
			if err := s.jobs.store.Put(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// suspendAll stops every job without cancelling it, and waits (bounded)
// for their tasks to stop.
func (s *Server) suspendAll() {
	s.jobs.suspend(errors.New("job manager stopping"))
	done := make(chan struct{})
	go func() {
		s.jobs.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(suspendWait):
		s.cfg.log.Warn("jobs did not stop in time; closing task manager sessions", zap.Duration("waited", suspendWait))
	}
}

// start runs the job master loop of r, whose graph is job. failover says
// that this job manager took the job over as the cluster's new leader: its
// first restore is then recorded as a restart, with an entry in the
// exception history saying so (a failover is otherwise invisible in the
// job's status).
func (s *Server) start(r JobRecord, job *runtime.Job, failover bool) error {
	policy, err := restartPolicy(r.RestartStrategy)
	if err != nil {
		return err
	}
	log := s.cfg.log.With(zap.String("job_id", r.ID))
	d, err := newDeployer(s, r, job, log)
	if err != nil {
		return err
	}
	graph, err := job.Graph()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.jobs.mu.Lock()
	stats := s.jobs.stats[r.ID]
	if stats == nil {
		stats = newCPStats()
		s.jobs.stats[r.ID] = stats
	}
	s.jobs.mu.Unlock()
	rj := &runningJob{cancel: cancel, done: make(chan struct{}), rec: r, graph: graph, stats: stats, start: time.Now()}
	d.onStart = func(dep *remoteDeployment) {
		rj.mu.Lock()
		rj.current = dep
		if r := rj.timingLocked(); r != nil && r.Attempt == dep.attempt {
			r.dep = dep
		}
		rj.mu.Unlock()
		s.setState(rj, StateRunning, nil)
	}
	d.onSlots = func(attempt int, at time.Time) {
		rj.recoveryStep(func(r *recovery) {
			if r.Attempt == attempt {
				r.Slots = at
			}
		})
	}
	interval := time.Duration(r.CheckpointIntervalMs) * time.Millisecond
	var extra []runtime.ClusterOpt
	if r.AllowNonRestoredState {
		extra = append(extra, runtime.AllowNonRestoredState())
	}
	if s.storage != nil {
		extra = append(extra, runtime.StateStorage(s.storage, s.cfg.storageURL), runtime.StateInlineLimit(s.cfg.inlineLimit),
			runtime.OrphanGrace(s.cfg.orphanGrace), runtime.OnStateDeleted(stats.stateDeleted))
	}
	mc := runtime.NewMiniCluster(append(extra, runtime.Deployment(d), runtime.CheckpointStore(s.jobs.cps), runtime.JobID(r.ID),
		runtime.CheckpointInterval(interval), runtime.CheckpointTimeout(s.cpTimeout(r)), runtime.RestartStrategy(policy), runtime.Logger(s.cfg.log),
		runtime.Failpoints(s.cfg.fp), runtime.SuspendWith(s.jobs.ctx),
		runtime.FailoverDelays(s.cfg.timeout, s.cfg.slotTimeout),
		runtime.OnCheckpointTriggered(stats.triggered),
		runtime.OnCheckpointAborted(stats.abortedCheckpoint), runtime.OnCheckpointAck(stats.acked),
		runtime.OnCheckpointComplete(func(e runtime.CheckpointEvent) {
			stats.completedCheckpoint(e)
			rj.mu.Lock()
			rj.last = e.ID
			rj.mu.Unlock()
			rj.checkpointCompleted(e.ID, log)
		}),
		runtime.OnRestore(func(attempt int, from checkpoint.ID) {
			stats.restoredFrom(from)
			rj.mu.Lock()
			rj.restored = from
			rj.nextAttempt = time.Time{}
			if r := rj.timingLocked(); r != nil && r.Restarted.IsZero() {
				r.Attempt, r.Restarted = attempt, time.Now()
			}
			rj.mu.Unlock()
			if failover && attempt == 0 {
				s.recordFailover(rj, from)
			}
		}),
		runtime.OnNextAttempt(func(at time.Time) {
			rj.mu.Lock()
			rj.nextAttempt = at
			if r := rj.timingLocked(); r != nil && r.NextAttempt.IsZero() {
				r.NextAttempt = at
			}
			rj.mu.Unlock()
		}),
		runtime.OnRestart(func(_ int, err error) {
			rj.failed(err)
			stats.restart(err)
			// One update: a status read between a counted restart and
			// the state RESTARTING would show the failed attempt RUNNING
			// with a restart (the demo then read the old attempt's
			// restored checkpoint as the new one's).
			s.setState(rj, StateRestarting, nil, func(r *JobRecord) {
				r.Restarts++
				r.addException(rj.exception(err, true))
			})
		}))...)
	rj.mc = mc
	s.jobs.mu.Lock()
	s.jobs.running[r.ID] = rj
	s.jobs.wg.Add(1)
	s.jobs.mu.Unlock()
	go func() {
		defer s.jobs.wg.Done()
		defer close(rj.done)
		defer func() {
			rec, _ := rj.record()
			end := endedAttempt{graph: rj.graph, records: rec.Records}
			end.placed, end.attempt = rj.placement()
			s.jobs.mu.Lock()
			delete(s.jobs.running, r.ID)
			s.jobs.final[r.ID] = end
			s.jobs.mu.Unlock()
		}()
		defer cancel()
		_, err := mc.Run(ctx, job)
		stats.ended(fmt.Errorf("the job stopped: %w", cmp.Or(err, errors.New("finished"))))
		switch {
		case s.cfg.ha != nil && s.leadingTerm() == nil:
			// Whatever ended it (a store refusing a deposed leader's
			// call, say), the job is the next leader's to resume.
			log.Info("job suspended: the leadership was lost; the next leader resumes it", zap.Error(err))
		case errors.Is(err, runtime.ErrSuspended):
			log.Info("job suspended; a job manager started on the same data directory resumes it", zap.Error(err))
		case err != nil && ctx.Err() != nil:
			retained := s.retain(r, log)
			var last checkpoint.ID
			if !r.RetainOnCancel {
				last = s.latest(context.Background(), r.ID)
			}
			if s.setState(rj, StateCanceled, nil, func(r *JobRecord) { r.RetainedSavepoint, r.LastCheckpoint = retained, last }) == nil && !r.RetainOnCancel {
				s.discardCheckpoints(r.ID, log)
			}
			log.Info("job cancelled")
		case err != nil:
			s.setState(rj, StateFailed, err)
			log.Error("job failed", zap.Error(err))
		default:
			s.setState(rj, StateFinished, nil)
			log.Info("job finished")
		}
	}()
	return nil
}

// setState records a job's new state durably, with the changes also makes
// to its record in the same update; a job that ends keeps the record
// counts of its last attempt, and the failure that ended it in its
// exception history.
// It returns the job store's error (logged).
func (s *Server) setState(rj *runningJob, st JobState, err error, also ...func(*JobRecord)) error {
	rj.mu.Lock()
	for _, f := range also {
		f(&rj.rec)
	}
	rj.rec.State = st
	rj.rec.ChangedUnixMs = time.Now().UnixMilli()
	if err != nil {
		rj.rec.Error = err.Error()
		rj.rec.addException(rj.exception(err, false))
	}
	if ended(st) && rj.current != nil {
		rj.rec.Records = rj.current.Counts()
	}
	r := rj.rec
	rj.mu.Unlock()
	if err := s.jobs.store.Put(r); err != nil {
		s.cfg.log.Error("cannot record job state", zap.String("job_id", r.ID), zap.String("state", string(st)), zap.Error(err))
		return err
	}
	return nil
}

// recordFailover records in rj's job record that this job manager, the
// cluster's new leader, resumed the job from checkpoint from (0: none): a
// restart, and an entry of the exception history.
func (s *Server) recordFailover(rj *runningJob, from checkpoint.ID) {
	by := cmp.Or(s.advertised, "the new leader")
	msg := fmt.Sprintf("job manager failover: resumed from checkpoint %d by %s", from, by)
	if from == 0 {
		msg = fmt.Sprintf("job manager failover: resumed by %s with no completed checkpoint (from the start)", by)
	}
	rj.mu.Lock()
	rj.rec.Restarts++
	rj.rec.addException(JobException{UnixMs: time.Now().UnixMilli(), Message: msg, Restarted: true})
	r := rj.rec
	rj.mu.Unlock()
	if err := s.jobs.store.Put(r); err != nil {
		s.cfg.log.Error("cannot record the failover in the job's record", zap.String("job_id", r.ID), zap.Error(err))
	}
}

// discardTimeout bounds deleting a cancelled job's checkpoints.
const discardTimeout = time.Minute

// discardCheckpoints deletes the checkpoints of cancelled job id, as Flink
// discards a cancelled job's checkpoints unless they are retained: the
// checkpoint store's records (with high availability: the pointers, in a
// fenced etcd transaction, and the metadata objects) and then every object
// below the job's prefix of the checkpoint storage. A failure is logged
// and leaves the rest in place.
func (s *Server) discardCheckpoints(id string, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), discardTimeout)
	defer cancel()
	if err := s.jobs.cps.DeleteJob(ctx, id); err != nil {
		log.Warn("cannot delete the cancelled job's checkpoints; they stay", zap.Error(err))
		return
	}
	n := 0
	if s.storage != nil {
		var keys []string
		err := s.storage.List(ctx, checkpoint.SharedPrefix(id), func(o storage.Object) error {
			keys = append(keys, o.Key)
			return nil
		})
		for _, k := range keys {
			if err == nil {
				if err = s.storage.Delete(ctx, k); err == nil {
					n++
				}
			}
		}
		if err != nil {
			log.Warn("cannot delete the cancelled job's state objects; they stay", zap.Error(err))
		}
	}
	log.Info("deleted the cancelled job's checkpoints (submit with --retain-on-cancel to keep the latest)", zap.Int("objects", n))
}

// SubmitOpt is an option of Submit.
type SubmitOpt interface{ apply(*submitCfg) }

type submitCfg struct {
	name             string
	fromSavepoint    string
	allowNonRestored bool
	retainOnCancel   bool
	cpTimeout        time.Duration
}

type submitOpt func(*submitCfg)

func (o submitOpt) apply(c *submitCfg) { o(c) }

// JobName names the submitted job (Flink's job name); without it the job
// is shown by its type.
func JobName(name string) SubmitOpt { return submitOpt(func(c *submitCfg) { c.name = name }) }

// FromSavepoint starts the job from the savepoint at dir (a directory or
// savepoint URL checkpoint.WriteSavepoint wrote, on this cluster or
// another; read by the job manager's process, a URL with the
// CheckpointStorage options; it must lie under SavepointAllowedLocations,
// ErrSavepointLocation otherwise): its state is matched to the job's operators by
// UID, keyed state goes to the key groups' owners at the job's
// parallelism, and its pending transactions are committed as a restored
// checkpoint's. A savepoint that cannot be read (damaged, truncated, not a
// savepoint) or that does not fit the job refuses the submit: the job is
// not created.
func FromSavepoint(dir string) SubmitOpt {
	return submitOpt(func(c *submitCfg) { c.fromSavepoint = dir })
}

// AllowNonRestoredState lets a job submitted FromSavepoint start although
// the savepoint holds state of operators (UIDs) the job no longer has; that
// state is dropped (Flink's --allowNonRestoredState).
func AllowNonRestoredState() SubmitOpt {
	return submitOpt(func(c *submitCfg) { c.allowNonRestored = true })
}

// RetainOnCancel makes a cancel of the job write its latest completed
// checkpoint out as a savepoint (Flink's retained externalized
// checkpoints), under the job manager's SavepointDir, else DataDir's
// "retained"; the job's record names it (RetainedSavepoint).
func RetainOnCancel() SubmitOpt {
	return submitOpt(func(c *submitCfg) { c.retainOnCancel = true })
}

// JobCheckpointTimeout sets how long the job's checkpoints may take before
// they expire (Flink's per-job execution.checkpointing.timeout), instead of
// the job manager's CheckpointTimeout. It must be positive.
func JobCheckpointTimeout(d time.Duration) SubmitOpt {
	return submitOpt(func(c *submitCfg) { c.cpTimeout = d })
}

// cpTimeout is job r's checkpoint timeout in force: its own, else the job
// manager's.
func (s *Server) cpTimeout(r JobRecord) time.Duration {
	if r.CheckpointTimeoutMs > 0 {
		return time.Duration(r.CheckpointTimeoutMs) * time.Millisecond
	}
	return s.cfg.cpTimeout
}

// Submit records and starts a job; it returns the job's new id.
func (s *Server) Submit(ctx context.Context, jobType string, params map[string]string, interval time.Duration, restart string, opts ...SubmitOpt) (string, error) {
	var cfg submitCfg
	for _, o := range opts {
		o.apply(&cfg)
	}
	if interval <= 0 {
		return "", fmt.Errorf("%w: checkpoint interval %v must be positive", runtime.ErrInvalidOption, interval)
	}
	if cfg.cpTimeout < 0 || (cfg.cpTimeout > 0 && cfg.cpTimeout < time.Millisecond) {
		return "", fmt.Errorf("%w: checkpoint timeout %v must be positive (at least 1ms)", runtime.ErrInvalidOption, cfg.cpTimeout)
	}
	if restart != "" {
		if _, err := runtime.ParseRestartStrategy(restart); err != nil {
			return "", err
		}
	}
	if k := s.cfg.stateBackend; k != "" && params[runtime.ParamStateBackend] == "" {
		params = maps.Clone(params)
		if params == nil {
			params = map[string]string{}
		}
		params[runtime.ParamStateBackend] = string(k)
	}
	job, err := s.cfg.jobs.Build(jobType, params)
	if err != nil {
		return "", err
	}
	_, need, err := runtime.SlotShares(job, 1)
	if err != nil {
		return "", err
	}
	if t := s.totalSlots(); t < need {
		return "", fmt.Errorf("%w: the job needs %d slots (its largest parallelism); the registered task managers offer %d",
			ErrNotEnoughSlots, need, t)
	}
	var from checkpoint.Completed
	if cfg.fromSavepoint != "" {
		loc, opts, err := s.savepointLocation(cfg.fromSavepoint)
		if err != nil {
			return "", err
		}
		if from, err = checkpoint.ReadSavepoint(ctx, loc, s.savepointOpts(opts...)...); err != nil {
			return "", err
		}
		if err := runtime.CheckRestore(job, from, cfg.allowNonRestored); err != nil {
			return "", fmt.Errorf("savepoint %s: %w", cfg.fromSavepoint, err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, submitCheckTimeout)
	err = s.cfg.jobs.Check(cctx, jobType, params)
	cancel()
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrCheckFailed, err)
	}
	id, err := NewJobID()
	if err != nil {
		return "", err
	}
	if cfg.fromSavepoint != "" {
		// Refused here rather than at the first attempt: a restore an
		// operator refuses (a share group's later acknowledgements) never
		// creates the job.
		vctx, cancel := context.WithTimeout(ctx, submitCheckTimeout)
		err := runtime.VerifyRestore(vctx, job, id, from, cfg.allowNonRestored)
		cancel()
		if err != nil {
			return "", fmt.Errorf("savepoint %s: %w", cfg.fromSavepoint, err)
		}
		// The savepoint becomes the job's first completed checkpoint, in
		// this job manager's store: a restart or a resume restores it
		// like any checkpoint, without the savepoint directory.
		if _, err := runtime.ImportCheckpoint(ctx, s.jobs.cps, id, from); err != nil {
			return "", fmt.Errorf("savepoint %s: %w", cfg.fromSavepoint, err)
		}
	}
	r := JobRecord{ID: id, Type: jobType, Name: cfg.name, Params: maps.Clone(params), CheckpointIntervalMs: interval.Milliseconds(),
		State: StateCreated, RestartStrategy: restart, SubmittedUnixMs: time.Now().UnixMilli(),
		FromSavepoint: cfg.fromSavepoint, AllowNonRestoredState: cfg.allowNonRestored, RetainOnCancel: cfg.retainOnCancel,
		CheckpointTimeoutMs: cfg.cpTimeout.Milliseconds()}
	if cfg.fromSavepoint != "" {
		r.FromSavepointCheckpoint = from.ID
	}
	r.ChangedUnixMs = r.SubmittedUnixMs
	if r.Params == nil {
		r.Params = map[string]string{}
	}
	if err := s.jobs.store.Put(r); err != nil {
		return "", err
	}
	if err := s.start(r, job, false); err != nil {
		return "", err
	}
	s.cfg.log.Info("job submitted", zap.String("job_id", id), zap.String("job", jobType), zap.Any("params", params))
	return id, nil
}

func (s *Server) totalSlots() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ss := range s.tms {
		n += ss.tm.Slots
	}
	return n
}

// Cancel cancels job id and waits until its tasks stopped (open
// transactions aborted, held share records released).
func (s *Server) Cancel(ctx context.Context, id string) (JobRecord, error) {
	s.jobs.mu.Lock()
	rj := s.jobs.running[id]
	s.jobs.mu.Unlock()
	if rj == nil {
		r, err := s.jobs.store.Get(id)
		return r, err
	}
	rj.cancel()
	select {
	case <-rj.done:
	case <-ctx.Done():
		return JobRecord{}, ctx.Err()
	}
	r, _ := rj.record()
	return r, nil
}

// ErrJobEnded is returned by CancelAsync for a job that already finished
// or failed.
var ErrJobEnded = errors.New("the job already ended")

// CancelAsync starts cancelling job id and returns at once (Cancel waits
// for its tasks to stop). Cancelling a cancelled job does nothing.
func (s *Server) CancelAsync(id string) error {
	s.jobs.mu.Lock()
	rj := s.jobs.running[id]
	s.jobs.mu.Unlock()
	if rj != nil {
		rj.cancel()
		return nil
	}
	r, err := s.jobs.store.Get(id)
	if err != nil {
		return err
	}
	if r.State != StateCanceled {
		return fmt.Errorf("%w: job %s is %s", ErrJobEnded, id, r.State)
	}
	return nil
}

// Job returns the status of job id.
func (s *Server) Job(ctx context.Context, id string) (JobRecord, checkpoint.ID, error) {
	s.jobs.mu.Lock()
	rj := s.jobs.running[id]
	s.jobs.mu.Unlock()
	if rj != nil {
		r, last := rj.record()
		if last == 0 {
			last = s.latest(ctx, id)
		}
		return r, last, nil
	}
	r, err := s.jobs.store.Get(id)
	if err != nil {
		return JobRecord{}, 0, err
	}
	s.jobs.mu.Lock()
	end, ok := s.jobs.final[id]
	s.jobs.mu.Unlock()
	if ok {
		r.Records = end.records
	}
	return r, s.latestOf(ctx, id, r.LastCheckpoint), nil
}

func (s *Server) latest(ctx context.Context, id string) checkpoint.ID {
	return s.latestOf(ctx, id, 0)
}

// latestOf is job id's latest completed checkpoint, or kept (the record's
// LastCheckpoint) if the store holds none.
func (s *Server) latestOf(ctx context.Context, id string, kept checkpoint.ID) checkpoint.ID {
	sums, err := s.jobs.cps.List(ctx, id)
	if err != nil {
		return kept
	}
	for _, c := range sums {
		if c.Err == nil {
			return c.ID
		}
	}
	return kept
}

// LatestCheckpoint returns job id's latest completed checkpoint.
func (s *Server) LatestCheckpoint(ctx context.Context, id string) (checkpoint.Completed, error) {
	return s.jobs.cps.Latest(ctx, id)
}

// Jobs lists every job the store holds, newest first (as the dashboard
// shows them).
func (s *Server) Jobs(ctx context.Context) ([]JobRecord, error) {
	recs, err := s.jobs.store.List()
	if err != nil {
		return nil, err
	}
	for i, r := range recs {
		if rr, _, err := s.Job(ctx, r.ID); err == nil {
			recs[i] = rr
		}
	}
	slices.SortStableFunc(recs, func(a, b JobRecord) int { return cmp.Compare(b.SubmittedUnixMs, a.SubmittedUnixMs) })
	return recs, nil
}

// ---- the client API ----

// badSavepoint reports whether err refuses a savepoint request or a
// savepoint: one the caller must change, not retry.
func badSavepoint(err error) bool {
	for _, e := range []error{checkpoint.ErrNotSavepoint, checkpoint.ErrCorruptSavepoint, checkpoint.ErrSavepointVersion,
		checkpoint.ErrSavepointExists, runtime.ErrIncompatibleState, ErrNoSavepointTarget, storage.ErrBadURL,
		ErrSavepointLocation, storage.ErrSymlink, storage.ErrNotBeneath} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func rpcError(err error) error {
	var c codes.Code
	switch {
	case errors.Is(err, ErrJobNotFound):
		c = codes.NotFound
	case errors.Is(err, ErrNotEnoughSlots), errors.Is(err, ErrCheckFailed):
		c = codes.FailedPrecondition
	case errors.Is(err, runtime.ErrUnknownJob), errors.Is(err, runtime.ErrBadParam), runtime.IsUnrecoverable(err), errors.Is(err, runtime.ErrInvalidOption),
		badSavepoint(err):
		c = codes.InvalidArgument
	case errors.Is(err, ErrJobEnded), errors.Is(err, runtime.ErrNotRunning):
		c = codes.FailedPrecondition
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		c = codes.DeadlineExceeded
	default:
		c = codes.Internal
	}
	return status.Error(c, err.Error())
}

// SubmitJob implements weirpb.JobManagerServer.
func (s *Server) SubmitJob(ctx context.Context, req *weirpb.SubmitJobRequest) (*weirpb.SubmitJobResponse, error) {
	params := maps.Clone(req.Params)
	if params == nil {
		params = map[string]string{}
	}
	if req.Parallelism != 0 {
		if v, ok := params[runtime.ParamParallelism]; ok && v != strconv.Itoa(int(req.Parallelism)) {
			return nil, status.Errorf(codes.InvalidArgument, "parallelism %d and parameter parallelism=%s disagree", req.Parallelism, v)
		}
		params[runtime.ParamParallelism] = strconv.Itoa(int(req.Parallelism))
	}
	interval := time.Duration(req.CheckpointIntervalMs) * time.Millisecond
	if req.CheckpointIntervalMs == 0 {
		interval = time.Second
	}
	opts := []SubmitOpt{JobName(req.Name)}
	if req.FromSavepoint != "" {
		opts = append(opts, FromSavepoint(req.FromSavepoint))
	}
	if req.AllowNonRestoredState {
		opts = append(opts, AllowNonRestoredState())
	}
	if req.RetainOnCancel {
		opts = append(opts, RetainOnCancel())
	}
	if req.CheckpointTimeoutMs != 0 {
		opts = append(opts, JobCheckpointTimeout(time.Duration(req.CheckpointTimeoutMs)*time.Millisecond))
	}
	id, err := s.Submit(ctx, req.JobType, params, interval, req.RestartStrategy, opts...)
	if err != nil {
		return nil, rpcError(err)
	}
	return &weirpb.SubmitJobResponse{JobId: id}, nil
}

func (s *Server) toStatus(r JobRecord, last checkpoint.ID) *weirpb.JobStatus {
	st := &weirpb.JobStatus{Id: r.ID, Name: r.DisplayName(), State: string(r.State), Restarts: int32(r.Restarts),
		LastCompletedCheckpoint: uint64(last), Error: r.Error, Params: r.Params, SubmittedUnixMs: r.SubmittedUnixMs,
		RestartStrategy: restartStrategyInForce(r.RestartStrategy), CheckpointIntervalMs: r.CheckpointIntervalMs, RestoredFromCheckpoint: uint64(r.RestoredFrom),
		RecordsIn: r.Records.In, RecordsOut: r.Records.Out, JobType: r.Type, Waiting: r.Waiting, RetainedSavepoint: r.RetainedSavepoint,
		CheckpointTimeoutMs: s.cpTimeout(r).Milliseconds(), NextAttemptUnixMs: r.NextAttemptUnixMs,
		StateBackend: stateBackendOf(r.Params)}
	if e := r.LastException(); e != nil {
		st.LastFailure = &weirpb.JobFailure{UnixMs: e.UnixMs, Message: e.Message, Task: e.Task, TaskManager: e.TaskManager, Restarted: e.Restarted}
	}
	return st
}

// ListJobs implements weirpb.JobManagerServer.
func (s *Server) ListJobs(ctx context.Context, _ *weirpb.ListJobsRequest) (*weirpb.ListJobsResponse, error) {
	recs, err := s.Jobs(ctx)
	if err != nil {
		return nil, rpcError(err)
	}
	out := &weirpb.ListJobsResponse{}
	for _, r := range recs {
		out.Jobs = append(out.Jobs, s.toStatus(r, s.latestOf(ctx, r.ID, r.LastCheckpoint)))
	}
	return out, nil
}

// GetJob implements weirpb.JobManagerServer.
func (s *Server) GetJob(ctx context.Context, req *weirpb.GetJobRequest) (*weirpb.JobStatus, error) {
	r, last, err := s.Job(ctx, req.JobId)
	if err != nil {
		return nil, rpcError(err)
	}
	return s.toStatus(r, last), nil
}

// CancelJob implements weirpb.JobManagerServer.
func (s *Server) CancelJob(ctx context.Context, req *weirpb.CancelJobRequest) (*weirpb.JobStatus, error) {
	if _, err := s.Cancel(ctx, req.JobId); err != nil {
		return nil, rpcError(err)
	}
	return s.GetJob(ctx, &weirpb.GetJobRequest{JobId: req.JobId})
}

// ListCheckpoints implements weirpb.JobManagerServer.
func (s *Server) ListCheckpoints(ctx context.Context, req *weirpb.ListCheckpointsRequest) (*weirpb.ListCheckpointsResponse, error) {
	if _, err := s.jobs.store.Get(req.JobId); err != nil {
		return nil, rpcError(err)
	}
	sums, err := s.jobs.cps.List(ctx, req.JobId)
	if err != nil {
		return nil, rpcError(err)
	}
	out := &weirpb.ListCheckpointsResponse{}
	stats := s.statsOf(req.JobId)
	for _, c := range sums {
		ci := &weirpb.CheckpointInfo{Id: uint64(c.ID)}
		if c.Err != nil {
			ci.Error = c.Err.Error()
		} else {
			ci.CompletedUnixMs, ci.TriggeredUnixMs = c.CompletedAt.UnixMilli(), c.TriggeredAt.UnixMilli()
			ci.DurationMs, ci.SizeBytes, ci.Tasks = c.Duration.Milliseconds(), c.Size, int32(len(c.Stats))
			if stats != nil {
				sync, async, ok := stats.taskTimes(c.ID)
				ci.TaskTimes, ci.SyncMs, ci.AsyncMs = ok, sync.Milliseconds(), async.Milliseconds()
			}
		}
		out.Checkpoints = append(out.Checkpoints, ci)
	}
	sort.Slice(out.Checkpoints, func(i, j int) bool { return out.Checkpoints[i].Id > out.Checkpoints[j].Id })
	return out, nil
}

// stateBackendOf is the state backend a job's parameters choose.
func stateBackendOf(params map[string]string) string {
	k, err := runtime.ParseStateBackend(params[runtime.ParamStateBackend])
	if err != nil {
		return params[runtime.ParamStateBackend]
	}
	return string(k)
}
