package weirtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// JobOpt configures StartJob.
type JobOpt interface{ applyJob(*jobCfg) }

type jobCfg struct {
	interval time.Duration
	cluster  []runtime.ClusterOpt
	fp       runtime.Failpointer
}

type jobOpt func(*jobCfg)

func (o jobOpt) applyJob(c *jobCfg) { o(c) }

// CheckpointEvery sets the checkpoint interval (default 50 ms: output is
// committed, and so visible read_committed, about one interval after it
// was written).
func CheckpointEvery(d time.Duration) JobOpt { return jobOpt(func(c *jobCfg) { c.interval = d }) }

// WithClusterOpts passes options to the mini cluster the job runs on
// (runtime.Restarts, runtime.Logger, ...). The kit sets the checkpoint
// store, the checkpoint interval and the failpoints itself: use
// CheckpointEvery and WithFailpoints for those.
func WithClusterOpts(opts ...runtime.ClusterOpt) JobOpt {
	return jobOpt(func(c *jobCfg) { c.cluster = append(c.cluster, opts...) })
}

// WithFailpoints injects fp's faults into the job, besides FailNextRecord's.
func WithFailpoints(fp runtime.Failpointer) JobOpt { return jobOpt(func(c *jobCfg) { c.fp = fp }) }

// ErrInjected is the failure FailNextRecord injects.
var ErrInjected = errors.New("weirtest: injected task failure")

// RunningJob is a job running on the mini cluster in the test process
// (StartJob): a job master, its checkpoint coordinator and every task, its
// checkpoints in a store of its own, restarted from its latest completed
// checkpoint when a task fails, as a cluster restarts it.
type RunningJob struct {
	job    *runtime.Job
	cfg    jobCfg
	dir    string
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	res       runtime.Result
	err       error
	ended     bool
	suspend   context.CancelFunc // the running Run's SuspendWith
	completed int
	last      checkpoint.ID
	restarts  int
	runs      int
	restored  checkpoint.ID // what the latest attempt restored (0: none)
	attempts  int
	changed   chan struct{} // closed and replaced at every event

	failNext atomic.Bool // FailNextRecord
}

// StartJob runs job on the mini cluster (runtime.NewMiniCluster) until
// Stop, or until it ends: a bounded job ends once its input did, a job
// that failed more often than its restart budget ends with the failure.
// Its checkpoints go to a temporary store that Stop removes.
func StartJob(job *runtime.Job, opts ...JobOpt) (*RunningJob, error) {
	cfg := jobCfg{interval: 50 * time.Millisecond}
	for _, o := range opts {
		o.applyJob(&cfg)
	}
	dir, err := os.MkdirTemp("", "weirtest-checkpoints-")
	if err != nil {
		return nil, fmt.Errorf("weirtest: checkpoint dir: %w", err)
	}
	if _, err := job.Describe(); err != nil { // refuse a job that cannot run before starting anything
		_ = os.RemoveAll(dir)
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &RunningJob{job: job, cfg: cfg, dir: dir, cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
	go r.loop(ctx)
	return r, nil
}

// loop runs the job, again from its latest checkpoint after each
// RestartJob, until it ends.
func (r *RunningJob) loop(ctx context.Context) {
	defer close(r.done)
	for {
		sctx, suspend := context.WithCancel(ctx)
		r.mu.Lock()
		r.suspend = suspend
		r.runs++
		r.mu.Unlock()
		opts := append([]runtime.ClusterOpt{}, r.cfg.cluster...)
		opts = append(opts, runtime.JobID(r.job.Name()), runtime.CheckpointDir(r.dir), runtime.CheckpointInterval(r.cfg.interval),
			runtime.Failpoints(r), runtime.SuspendWith(sctx),
			runtime.OnCheckpointComplete(func(e runtime.CheckpointEvent) {
				r.event(func() {
					r.completed++
					r.last = max(r.last, e.ID)
				})
			}),
			runtime.OnRestart(func(int, error) { r.event(func() { r.restarts++ }) }),
			runtime.OnRestore(func(_ int, from checkpoint.ID) { r.event(func() { r.attempts++; r.restored = from }) }))
		res, err := runtime.NewMiniCluster(opts...).Run(ctx, r.job)
		suspend()
		if errors.Is(err, runtime.ErrSuspended) && ctx.Err() == nil {
			continue // RestartJob: run again, from the latest checkpoint
		}
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			err = nil // stopped
		}
		r.event(func() {
			r.res.Restarts += res.Restarts
			r.res.LastCheckpoint = max(r.res.LastCheckpoint, res.LastCheckpoint)
			r.err, r.ended = err, true
		})
		return
	}
}

// event changes the job's record under its lock and wakes every waiter.
func (r *RunningJob) event(fn func()) {
	r.mu.Lock()
	fn()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// Inject implements runtime.Failpointer: FailNextRecord's failure, then the
// WithFailpoints ones.
func (r *RunningJob) Inject(name string) error {
	if name == "task.process" && r.failNext.Load() && r.failNext.CompareAndSwap(true, false) {
		return ErrInjected
	}
	if r.cfg.fp != nil {
		return r.cfg.fp.Inject(name)
	}
	return nil
}

// Status is what a RunningJob has done so far.
type Status struct {
	// CompletedCheckpoints counts the checkpoints completed, LastCheckpoint
	// is the latest.
	CompletedCheckpoints int
	LastCheckpoint       checkpoint.ID
	// Restarts counts restarts after failures (FailNextRecord's among them);
	// Runs counts the job's runs (1, plus one per RestartJob).
	Restarts, Runs int
	// RestoredFrom is the checkpoint the latest attempt restored (0: none).
	RestoredFrom checkpoint.ID
	// Ended reports that the job ended; Err is why (nil: it finished, or
	// Stop stopped it).
	Ended bool
	Err   error
}

// Status reports what the job has done so far.
func (r *RunningJob) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status()
}

func (r *RunningJob) status() Status {
	return Status{CompletedCheckpoints: r.completed, LastCheckpoint: r.last, Restarts: r.restarts, Runs: r.runs,
		RestoredFrom: r.restored, Ended: r.ended, Err: r.err}
}

// WaitUntil returns once cond holds, evaluating it now and after every
// event of the job (a checkpoint completed, a restart, a restore, its end),
// or ctx's error joined with cond's last error once ctx is done. A job
// that ended with an error ends the wait with that error; cond is
// evaluated once more after the job ended. It never sleeps: a running job
// completes a checkpoint every interval.
func (r *RunningJob) WaitUntil(ctx context.Context, cond func(ctx context.Context, s Status) (bool, error)) error {
	var last error
	for {
		r.mu.Lock()
		s, changed := r.status(), r.changed
		r.mu.Unlock()
		ok, err := cond(ctx, s)
		if ok && err == nil {
			return nil
		}
		last = err
		if s.Ended {
			if s.Err != nil {
				return fmt.Errorf("weirtest: the job failed: %w", s.Err)
			}
			return fmt.Errorf("weirtest: the job ended before the condition held (last error: %v)", last)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("weirtest: %w while waiting (status %+v)", ctx.Err(), s), last)
		}
	}
}

// WaitCommitted waits until the records of topic visible read_committed
// satisfy cond, reading them after every completed checkpoint (a read
// that fails, as while the broker restarts, is tried again at the next),
// and returns them; on ctx's end it returns the last records read with
// the error.
func (r *RunningJob) WaitCommitted(ctx context.Context, k *Kafka, topic string, cond func([]*kgo.Record) bool) ([]*kgo.Record, error) {
	var recs []*kgo.Record
	err := r.WaitUntil(ctx, func(ctx context.Context, _ Status) (bool, error) {
		got, err := k.ReadCommitted(ctx, topic)
		if err != nil {
			return false, err
		}
		recs = got
		return cond(got), nil
	})
	if err != nil {
		return recs, fmt.Errorf("%w (%d records of %s read_committed)", err, len(recs), topic)
	}
	return recs, nil
}

// WaitCheckpoints waits until n more checkpoints than now completed.
func (r *RunningJob) WaitCheckpoints(ctx context.Context, n int) error {
	from := r.Status().CompletedCheckpoints
	return r.WaitUntil(ctx, func(_ context.Context, s Status) (bool, error) {
		return s.CompletedCheckpoints >= from+n, nil
	})
}

// FailNextRecord makes the next record any operator of the job
// processes fail its task (with ErrInjected): the job restarts from its
// latest completed checkpoint, as after any task failure, every operator's
// state rolled back to it and the transactions of later checkpoints
// aborted. It returns at once; the failure needs a record to process
// (write input after it), and WaitRestarts waits for the restart.
func (r *RunningJob) FailNextRecord() { r.failNext.Store(true) }

// WaitRestarts waits until the job restarted after failures n times in
// all (Status.Restarts).
func (r *RunningJob) WaitRestarts(ctx context.Context, n int) error {
	return r.WaitUntil(ctx, func(_ context.Context, s Status) (bool, error) { return s.Restarts >= n, nil })
}

// RestartJob stops the job as a job manager that goes away stops it (its
// tasks stop as in a failover; checkpoints and pending transactions stay)
// and runs it again from its latest completed checkpoint, as the next job
// manager does. It returns once the new run restored.
func (r *RunningJob) RestartJob(ctx context.Context) error {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return fmt.Errorf("weirtest: restart: the job ended (%v)", r.err)
	}
	runs, attempts, suspend := r.runs, r.attempts, r.suspend
	r.mu.Unlock()
	suspend()
	return r.WaitUntil(ctx, func(_ context.Context, s Status) (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return s.Runs > runs && r.attempts > attempts, nil
	})
}

// Wait waits until the job ends by itself (a bounded job), and returns
// its result.
func (r *RunningJob) Wait(ctx context.Context) (runtime.Result, error) {
	select {
	case <-r.done:
	case <-ctx.Done():
		return runtime.Result{}, ctx.Err()
	}
	return r.result()
}

func (r *RunningJob) result() (runtime.Result, error) {
	defer os.RemoveAll(r.dir)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.res, r.err
}

// Stop cancels the job for good, as `streamctl cancel` does (its latest
// completed checkpoint's transactions committed, later ones aborted, held
// records released), waits until it ended, and removes its checkpoints.
// The error is the job's failure, if it failed before.
func (r *RunningJob) Stop() (runtime.Result, error) {
	r.cancel()
	<-r.done
	return r.result()
}
