package jobmanager

import (
	"errors"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
)

// Detection is how the job manager learned of the failure that restarted
// a job.
type Detection string

// The ways a failure reaches the job manager.
const (
	// DetectedTaskFailure: a task reported its failure (its task manager
	// lives on).
	DetectedTaskFailure Detection = "task failure"
	// DetectedDeployFailure: a task manager could not build its share of
	// an attempt.
	DetectedDeployFailure Detection = "deploy failure"
	// DetectedConnectionLoss: a task manager's session stream ended
	// without a goodbye (its process exited, as after a SIGKILL, the kernel
	// closing its connections; or the network was lost): at once, without
	// waiting for the heartbeat timeout.
	DetectedConnectionLoss Detection = "connection loss"
	// DetectedHeartbeatTimeout: a task manager was silent for the
	// heartbeat timeout (paused, hung, or cut off without its connection
	// closing).
	DetectedHeartbeatTimeout Detection = "heartbeat timeout"
	// DetectedGoodbye: a task manager stopped on purpose (SIGINT/SIGTERM)
	// and said so.
	DetectedGoodbye Detection = "task manager stopped"
	// DetectedRegisteredAgain: a task manager registered again (restarted)
	// before its old session ended.
	DetectedRegisteredAgain Detection = "registered again"
	// DetectedOther: anything else (the checkpoint coordinator, a store).
	DetectedOther Detection = "other"
)

// Recovery is one restart of a job, step by step: from the failure the job
// manager learned of to the first checkpoint of the new attempt completed
// after its sources read again, whose output the sinks commit when they are
// notified. Each field is when a step ended (zero: not yet, or not known);
// Steps gives the durations. Server.Recoveries lists a job's latest.
type Recovery struct {
	// Attempt is the new attempt (1 for the first restart; 0 until it
	// began).
	Attempt int
	// Cause is the failure, Detection how the job manager learned of it.
	Cause     string
	Detection Detection
	// Failed is when the job manager learned of the failure: a task's
	// report, or the end of a task manager's session.
	Failed time.Time
	// Canceled is when every task of the failed attempt had ended.
	Canceled time.Time
	// NextAttempt is when the restart strategy let the next attempt start:
	// Failed plus its delay.
	NextAttempt time.Time
	// Restarted is when the new attempt began: the delay was over, the
	// failed attempt's tasks had ended and the restore point was read.
	Restarted time.Time
	// Slots is when the new attempt had its slots.
	Slots time.Time
	// Deployed is when every task manager had built its tasks and
	// listened on the data plane (Prepared).
	Deployed time.Time
	// Opened is when every task had restored its state and opened its
	// operators: the restored checkpoint's transactions committed, later
	// ones aborted, transactional producers initialised (which fences a
	// killed task manager's), the sources' Open.
	Opened time.Time
	// FirstRecord is when a source task first emitted a record (it joined
	// its share group or consumer group and fetched), as the task
	// managers' heartbeats report it (sampled every 10 ms).
	FirstRecord time.Time
	// Checkpoint is when the first checkpoint completed after FirstRecord
	// (persisted; every task is then notified and the sinks commit);
	// CheckpointID is its id.
	Checkpoint   time.Time
	CheckpointID checkpoint.ID
}

// Done reports whether every step of r is known.
func (r Recovery) Done() bool { return !r.Checkpoint.IsZero() }

// RecoveryStep is one step of a Recovery and how long it took.
type RecoveryStep struct {
	Name string
	Took time.Duration
}

// Steps are r's steps with their durations, in order, as far as known:
// "cancel" (the failed attempt's tasks ending) and "restart delay" (the
// restart strategy's) both count from the failure and overlap; "restart"
// is from the failure to the new attempt's start, the longer of the two
// plus reading the restore point. Then "slot wait", "deploy", "restore",
// "source re-open" (from the tasks' start to a source's first record) and
// "first checkpoint" (from there to the first checkpoint completed).
func (r Recovery) Steps() []RecoveryStep {
	var out []RecoveryStep
	step := func(name string, from, to time.Time) bool {
		if from.IsZero() || to.IsZero() {
			return false
		}
		out = append(out, RecoveryStep{name, to.Sub(from)})
		return true
	}
	step("cancel", r.Failed, r.Canceled)
	step("restart delay", r.Failed, r.NextAttempt)
	_ = step("restart", r.Failed, r.Restarted) && step("slot wait", r.Restarted, r.Slots) &&
		step("deploy", r.Slots, r.Deployed) && step("restore", r.Deployed, r.Opened) &&
		step("source re-open", r.Opened, r.FirstRecord) && step("first checkpoint", r.FirstRecord, r.Checkpoint)
	return out
}

// String is r's steps, e.g. "connection loss; cancel 1.16s, restart
// delay 1.02s, restart 1.17s, slot wait 0s, deploy 36ms, ...".
func (r Recovery) String() string {
	parts := make([]string, 0, 8)
	for _, s := range r.Steps() {
		parts = append(parts, s.Name+" "+s.Took.Round(time.Millisecond).String())
	}
	return string(r.Detection) + "; " + strings.Join(parts, ", ")
}

// maxRecoveries bounds the recoveries kept per job, maxRecoveryCheckpoints
// the checkpoints a recovery notes while its first one after the sources'
// first record is not known.
const (
	maxRecoveries          = 16
	maxRecoveryCheckpoints = 64
)

// recovery is a Recovery being timed: the new attempt's deployment gives
// the deploy, open and first-record times, its completed checkpoints the
// first one after that.
type recovery struct {
	Recovery
	dep    *remoteDeployment
	cps    []completedAt
	logged bool
}

// completedAt is a checkpoint the new attempt completed.
type completedAt struct {
	id checkpoint.ID
	at time.Time
}

// snapshot is the Recovery as far as known now.
func (r *recovery) snapshot() Recovery {
	out := r.Recovery
	if r.dep == nil {
		return out
	}
	out.Deployed, out.Opened, out.FirstRecord = r.dep.times()
	if out.FirstRecord.IsZero() {
		return out
	}
	for _, c := range r.cps {
		if c.at.After(out.FirstRecord) {
			out.Checkpoint, out.CheckpointID = c.at, c.id
			break
		}
	}
	return out
}

// failed starts timing a restart of rj for err, when the failed attempt's
// tasks have all ended.
func (rj *runningJob) failed(err error) {
	now := time.Now()
	r := &recovery{Recovery: Recovery{Cause: err.Error(), Detection: DetectedOther, Failed: now, Canceled: now}}
	var tf *taskFailure
	if errors.As(err, &tf) && !tf.at.IsZero() {
		r.Failed, r.Detection = tf.at, tf.detection
	}
	rj.mu.Lock()
	defer rj.mu.Unlock()
	rj.recoveries = append(rj.recoveries, r)
	if len(rj.recoveries) > maxRecoveries {
		rj.recoveries = slices.Delete(rj.recoveries, 0, len(rj.recoveries)-maxRecoveries)
	}
}

// timingLocked returns the restart being timed (nil: none); rj.mu is
// held.
func (rj *runningJob) timingLocked() *recovery {
	if len(rj.recoveries) == 0 {
		return nil
	}
	r := rj.recoveries[len(rj.recoveries)-1]
	if r.logged {
		return nil
	}
	return r
}

// recoveryStep records, for the restart being timed, that its next attempt
// reached a step: set updates the recovery.
func (rj *runningJob) recoveryStep(set func(r *recovery)) {
	rj.mu.Lock()
	defer rj.mu.Unlock()
	if r := rj.timingLocked(); r != nil {
		set(r)
	}
}

// checkpointCompleted notes checkpoint id of the attempt being timed and,
// once the recovery is complete, logs its steps.
func (rj *runningJob) checkpointCompleted(id checkpoint.ID, log *zap.Logger) {
	rj.mu.Lock()
	r := rj.timingLocked()
	if r == nil || r.dep == nil {
		rj.mu.Unlock()
		return
	}
	if len(r.cps) < maxRecoveryCheckpoints {
		r.cps = append(r.cps, completedAt{id, time.Now()})
	}
	snap := r.snapshot()
	if !snap.Done() {
		rj.mu.Unlock()
		return
	}
	r.logged = true
	rj.mu.Unlock()
	fields := []zap.Field{zap.Int("attempt", snap.Attempt), zap.String("detection", string(snap.Detection)),
		zap.Duration("total", snap.Checkpoint.Sub(snap.Failed)), zap.Uint64("checkpoint", uint64(snap.CheckpointID))}
	for _, s := range snap.Steps() {
		fields = append(fields, zap.Duration(strings.ReplaceAll(s.Name, " ", "_"), s.Took))
	}
	log.Info("job recovered: the new attempt completed a checkpoint after its sources read again", fields...)
}

// Recoveries returns the latest restarts of job id that this job manager
// ran (at most 16, oldest first, kept in memory while the job runs here),
// timed step by step; the last one may still be in progress. An unknown or
// ended job has none.
func (s *Server) Recoveries(id string) []Recovery {
	s.jobs.mu.Lock()
	rj := s.jobs.running[id]
	s.jobs.mu.Unlock()
	if rj == nil {
		return nil
	}
	rj.mu.Lock()
	defer rj.mu.Unlock()
	out := make([]Recovery, len(rj.recoveries))
	for i, r := range rj.recoveries {
		out[i] = r.snapshot()
	}
	return out
}
