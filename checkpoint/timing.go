package checkpoint

import (
	"fmt"
	"time"
)

// Timing is the checkpoint configuration a job runs with, as far as the
// lifetime of a pre-committed transaction depends on it. Executors hand it
// to every operator (runtime.OperatorContext.Checkpointing), so that a
// transactional operator can refuse, at job start, a transaction timeout the
// broker could enforce before the job commits.
type Timing struct {
	// Interval is the trigger period, MinPause the least time between the
	// end of one checkpoint and the next trigger, Timeout the time after
	// which an incomplete checkpoint is aborted.
	Interval, Timeout, MinPause time.Duration
	// TolerableFailures is how many consecutive failed checkpoints the job
	// carries on after without rolling back (the effective number, after
	// the executor's rules: see AbortCarrier).
	TolerableFailures int
	// RestartBudget is the worst-case time from a failure to the restored
	// job having committed its transactions: failure detection, restart
	// delay and recovery.
	RestartBudget time.Duration
}

// IsZero reports whether t was not set (an executor that gives none).
func (t Timing) IsZero() bool { return t == Timing{} }

// MaxTransactionLifetime is the longest a transaction begun for one epoch
// can stay open before a completed checkpoint, or the restore after a
// failure, commits it:
//
//	(TolerableFailures + 1) x (max(Interval, MinPause) + Timeout) + RestartBudget
//
// A transaction begins with its epoch's first record, at most one trigger
// period (max(Interval, MinPause)) before the barrier that pre-commits it;
// its checkpoint may take up to Timeout. A tolerated failed checkpoint
// carries the transaction to the next one (AbortCarrier), at most
// TolerableFailures times; then a checkpoint completes (its notification
// may be lost) or the job fails over, and the restore commits within
// RestartBudget.
func (t Timing) MaxTransactionLifetime() time.Duration {
	period := max(t.Interval, t.MinPause) + t.Timeout
	return time.Duration(t.TolerableFailures+1)*period + t.RestartBudget
}

// Validate refuses a timing that cannot describe a job.
func (t Timing) Validate() error {
	switch {
	case t.Timeout <= 0:
		return fmt.Errorf("%w: checkpoint timeout %v must be positive", ErrInvalidConfig, t.Timeout)
	case t.Interval < 0 || t.MinPause < 0 || t.TolerableFailures < 0:
		return fmt.Errorf("%w: interval %v, min pause %v and tolerable failures %d must not be negative",
			ErrInvalidConfig, t.Interval, t.MinPause, t.TolerableFailures)
	case t.RestartBudget < 0:
		return fmt.Errorf("%w: restart budget %v must not be negative", ErrInvalidConfig, t.RestartBudget)
	}
	return nil
}

// String renders the formula with its values, for error messages.
func (t Timing) String() string {
	return fmt.Sprintf("(%d tolerated failed checkpoints + 1) x (max(interval %v, min pause %v) + checkpoint timeout %v) + restart budget %v = %v",
		t.TolerableFailures, t.Interval, t.MinPause, t.Timeout, t.RestartBudget, t.MaxTransactionLifetime())
}
