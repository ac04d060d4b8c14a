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
	// delay and recovery. It covers Failover.Total() when Failover is set.
	RestartBudget time.Duration
	// Failover, when set, is what RestartBudget is made of, term by term,
	// so that a refusal can name each one.
	Failover Failover
}

// Failover is the worst-case time from a failure to the restored job
// having committed its transactions, term by term. On a cluster every term
// counts: a task manager that hangs (SIGSTOP, a partition) is seen only
// after the heartbeat timeout, the next attempt may wait for free slots up
// to the slot timeout, the restart strategy may delay it up to its largest
// delay, and the restore itself may take up to a checkpoint timeout.
type Failover struct {
	// Detection is how long a failure may go unseen (the heartbeat
	// timeout on a cluster; 0 in one process).
	Detection time.Duration
	// SlotWait is the longest an attempt waits for free slots (0 in one
	// process).
	SlotWait time.Duration
	// RestartDelay is the restart strategy's largest delay.
	RestartDelay time.Duration
	// Recovery bounds the restore that commits the restored checkpoint's
	// transactions.
	Recovery time.Duration
}

// Total is the sum of the terms.
func (f Failover) Total() time.Duration {
	return f.Detection + f.SlotWait + f.RestartDelay + f.Recovery
}

// String names every term with its value.
func (f Failover) String() string {
	return fmt.Sprintf("failure detection (heartbeat timeout) %v + slot wait %v + largest restart delay %v + recovery %v",
		f.Detection, f.SlotWait, f.RestartDelay, f.Recovery)
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
	case t.Failover.Detection < 0 || t.Failover.SlotWait < 0 || t.Failover.RestartDelay < 0 || t.Failover.Recovery < 0:
		return fmt.Errorf("%w: failover terms %s must not be negative", ErrInvalidConfig, t.Failover)
	case t.RestartBudget < t.Failover.Total():
		return fmt.Errorf("%w: restart budget %v must cover its terms, %s = %v",
			ErrInvalidConfig, t.RestartBudget, t.Failover, t.Failover.Total())
	}
	return nil
}

// String renders the formula with its values, for error messages, the
// restart budget's terms included when Failover is set.
func (t Timing) String() string {
	budget := fmt.Sprint(t.RestartBudget)
	if t.Failover != (Failover{}) {
		budget = fmt.Sprintf("%v (%s)", t.RestartBudget, t.Failover)
	}
	return fmt.Sprintf("(%d tolerated failed checkpoints + 1) x (max(interval %v, min pause %v) + checkpoint timeout %v) + restart budget %s = %v",
		t.TolerableFailures, t.Interval, t.MinPause, t.Timeout, budget, t.MaxTransactionLifetime())
}
