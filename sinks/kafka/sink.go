package kafka

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/runtime"
)

// SinkOpt configures a Sink beyond the TxnWriter options.
type SinkOpt interface{ apply(*sinkCfg) }

// sinkOpt is a SinkOpt from a function.
type sinkOpt func(*sinkCfg)

func (o sinkOpt) apply(c *sinkCfg) { o(c) }

type sinkCfg struct {
	tolerateLoss      bool
	checkpointTimeout time.Duration
	restartBudget     time.Duration
}

// TolerateLostTransactions makes a sink whose restored transactions were
// lost (aborted by the broker's transaction timeout) log the loss and go on,
// instead of failing the job. Losing them loses records: opt in knowingly.
func TolerateLostTransactions() SinkOpt { return sinkOpt(func(c *sinkCfg) { c.tolerateLoss = true }) }

// CheckpointTimeouts raises the checkpoint timeout and restart budget
// (the worst-case time to notice a failure, restart and recover) that an
// exactly-once sink assumes beyond what the executor reports
// (runtime.OperatorContext.Checkpointing), e.g. for a cluster whose
// failover takes longer. NewSink already fails unless the transaction
// timeout exceeds their sum. Without it, Open checks against the
// executor's checkpoint timing alone.
func CheckpointTimeouts(checkpointTimeout, restartBudget time.Duration) SinkOpt {
	return sinkOpt(func(c *sinkCfg) { c.checkpointTimeout, c.restartBudget = checkpointTimeout, restartBudget })
}

// NewSink returns a runtime sink factory writing the records serialize
// makes. Every subtask gets its own TxnWriter: transactional ids
// "<prefix>-<subtask>-<pool index>", the prefix defaulting to
// "weir-<job>-<operator uid>" (characters outside [A-Za-z0-9._-] replaced
// by '_').
//
// Checkpoint n's barrier pre-commits the subtask's transaction; its
// completion commits it; a restore commits the restored checkpoint's
// transactions again (idempotent) and aborts lingering ones. An aborted
// checkpoint's transaction stays pending and is committed with the next
// completed checkpoint (as Flink's KafkaSink does), so an aborted checkpoint
// loses nothing.
//
// Failpoints: the sink fires sink.after-precommit after every pre-commit
// (before the snapshot goes back to the task, which then acks) and
// sink.after-commit after each transaction's commit returned, through the
// runtime's OperatorContext.Failpoints; a *failpoint.Set given with the
// Failpoints option is used only when the runtime gives none.
//
// NewSink refuses (with an error wrapping ErrInvalidConfig) options that
// cannot work, and, with CheckpointTimeouts, a transaction timeout not
// longer than checkpoint timeout plus restart budget. Each subtask's Open
// (exactly-once), before any record is read, refuses with an unrecoverable
// error a transaction timeout that does not exceed the job's
// checkpoint.Timing.MaxTransactionLifetime (kafkatxn.CheckTransactionTimeout)
// or that exceeds the brokers' transaction.max.timeout.ms.
func NewSink[T any](serialize func(T) (*kgo.Record, error), opts []Opt, sopts ...SinkOpt) (func() runtime.Sink[T], error) {
	// Subtask and prefix are filled in per subtask; validate the rest now.
	c, err := kafkatxn.Inspect(opts...)
	if err != nil {
		return nil, err
	}
	if serialize == nil {
		return nil, fmt.Errorf("%w: no serialize function", ErrInvalidConfig)
	}
	var sc sinkCfg
	for _, o := range sopts {
		o.apply(&sc)
	}
	if c.Guarantee == ExactlyOnce && (sc.checkpointTimeout != 0 || sc.restartBudget != 0) {
		switch {
		case sc.checkpointTimeout <= 0 || sc.restartBudget < 0:
			return nil, fmt.Errorf("%w: checkpoint timeout %v must be positive and restart budget %v not negative",
				ErrInvalidConfig, sc.checkpointTimeout, sc.restartBudget)
		case c.TransactionTimeout <= sc.checkpointTimeout+sc.restartBudget:
			return nil, fmt.Errorf("%w: transaction timeout %v must exceed checkpoint timeout %v + restart budget %v = %v, or a pre-committed transaction may be aborted by the broker before recovery commits it (data loss)",
				ErrInvalidConfig, c.TransactionTimeout, sc.checkpointTimeout, sc.restartBudget, sc.checkpointTimeout+sc.restartBudget)
		}
	}
	return func() runtime.Sink[T] {
		return &Sink[T]{opts: opts, prefixSet: c.PrefixSet, ser: serialize, sc: sc,
			guarantee: c.Guarantee, txnTimeout: c.TransactionTimeout, ownFP: c.Failpoints}
	}, nil
}

// Sink is one subtask of a Kafka sink. Build it with NewSink.
type Sink[T any] struct {
	opts       []Opt
	prefixSet  bool
	ser        func(T) (*kgo.Record, error)
	sc         sinkCfg
	guarantee  DeliveryGuarantee
	txnTimeout time.Duration
	ownFP      *failpoint.Set // from the Failpoints option
	fp         runtime.Failpointer
	w          *kafkatxn.TxnWriter
	log        *zap.Logger
}

var unsafePrefix = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// CommitRestored implements runtime.RestoreCommitter: before any subtask of
// the job opens, subtask 0 commits every completed transaction of the sink
// (the restored checkpoint's and those of newer checkpoints skipped as
// corrupt, of every subtask) and the orphaned ones the runtime hands it, so
// no subtask's recovery fences a transaction that must be committed.
func (s *Sink[T]) CommitRestored(ctx context.Context, oc *runtime.OperatorContext) error {
	if err := s.connect(ctx, oc); err != nil {
		return err
	}
	return s.tolerate(s.w.CommitRestored(ctx, append(slices.Clone(oc.CommitHandles), oc.OrphanHandles...)))
}

// connect creates the subtask's writer once.
func (s *Sink[T]) connect(ctx context.Context, oc *runtime.OperatorContext) error {
	if s.w != nil {
		return nil
	}
	s.log = oc.Logger
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.fp = oc.Failpoints
	if s.fp == nil && s.ownFP != nil {
		s.fp = s.ownFP
	}
	opts := append([]Opt{Logger(s.log)}, s.opts...)
	if !s.prefixSet {
		opts = append(opts, TransactionalIDPrefix(unsafePrefix.ReplaceAllString("weir-"+oc.Job+"-"+oc.UID, "_")))
	}
	// The sink fires the failpoints itself (see NewSink), so that the
	// runtime's Failpointer reaches them; the writer fires none. The task
	// goroutine makes every call but the metrics' Pending and
	// LostTransactions (CommitRestored runs before the task starts), so
	// Write takes no lock.
	opts = append(opts, kafkatxn.Subtask(oc.Subtask, oc.Parallelism), Failpoints(nil), kafkatxn.SingleGoroutine())
	w, err := kafkatxn.NewTxnWriter(ctx, opts...)
	if errors.Is(err, ErrInvalidConfig) {
		return runtime.Unrecoverable(err) // a restart cannot fix a configuration
	}
	if err != nil {
		return err
	}
	s.w = w
	return nil
}

// tolerate turns lost transactions into a logged error when the user opted
// in (TolerateLostTransactions); otherwise a lost transaction (its topic or
// partition gone too, ErrTxnTopicGone, or not) fails the job for good: no
// restart can commit it.
func (s *Sink[T]) tolerate(err error) error {
	if errors.Is(err, ErrTxnLost) && s.sc.tolerateLoss {
		s.log.Error("kafka sink: continuing after LOST transactions (TolerateLostTransactions)", zap.Error(err))
		return nil
	}
	if errors.Is(err, ErrTxnLost) {
		// Every restart would find the same transaction lost (and one
		// whose topic or partition is gone, ErrTxnTopicGone, too): fail
		// the job with the cause instead of restarting.
		return runtime.Unrecoverable(err)
	}
	return err
}

// Open implements runtime.Sink: it connects, checks the transaction
// timeout against the brokers (exactly-once), commits the restored
// checkpoint's transactions (those CommitRestored did not) and aborts
// lingering ones (TxnWriter.Recover).
func (s *Sink[T]) Open(ctx context.Context, oc *runtime.OperatorContext) error {
	if err := s.connect(ctx, oc); err != nil {
		return err
	}
	w := s.w
	runtime.TransactionMetrics(oc.Metrics(), func() int { return len(w.Pending()) }, w.LostTransactions)
	if s.guarantee == ExactlyOnce {
		if err := s.checkTimeouts(ctx, oc.Checkpointing); err != nil {
			return runtime.Unrecoverable(err) // a restart cannot fix a configuration
		}
	}
	return s.tolerate(s.w.Recover(ctx, oc.CommitHandles))
}

// checkTimeouts refuses a transaction timeout the brokers would refuse or
// that a pre-committed transaction could outlive under the job's checkpoint
// timing (kafkatxn.CheckTransactionTimeout). The CheckpointTimeouts option
// can only raise the executor's figures. If the brokers' maximum cannot be
// read (e.g. no DescribeConfigs permission), it logs a warning and lets the
// brokers refuse a bad timeout at InitProducerID.
func (s *Sink[T]) checkTimeouts(ctx context.Context, t checkpoint.Timing) error {
	if s.sc.checkpointTimeout > 0 {
		t.Timeout = max(t.Timeout, s.sc.checkpointTimeout)
		t.RestartBudget = max(t.RestartBudget, s.sc.restartBudget)
	}
	err := kafkatxn.CheckTransactionTimeout(ctx, s.w.Admin(), s.txnTimeout, t)
	if err == nil || errors.Is(err, ErrInvalidConfig) {
		return err
	}
	s.log.Warn("kafka sink: cannot read the brokers' transaction.max.timeout.ms; not checked", zap.Error(err))
	return nil
}

// LostTransactions counts this subtask's pre-committed transactions that
// the broker could no longer commit (see TxnWriter.LostTransactions).
func (s *Sink[T]) LostTransactions() int64 {
	if s.w == nil {
		return 0
	}
	return s.w.LostTransactions()
}

// NotifyJobCanceled implements checkpoint.CancelListener: the job ends for
// good. The sink commits the transactions its last completed checkpoint
// covers (their notification may have been lost) and aborts every later
// pre-committed one, so a cancelled job leaves no transaction open to hold
// back read_committed readers of the output until the transaction timeout.
// (Close aborts the open one.)
func (s *Sink[T]) NotifyJobCanceled(ctx context.Context, last checkpoint.ID) error {
	if s.w == nil {
		return nil
	}
	if err := s.w.EndJob(ctx, last); err != nil {
		return fmt.Errorf("kafka sink: cancel: %w", err)
	}
	return nil
}

// Write implements runtime.Sink.
func (s *Sink[T]) Write(ctx context.Context, v T) error {
	r, err := s.ser(v)
	if err != nil {
		return fmt.Errorf("kafka sink: serialize: %w", err)
	}
	return s.w.Write(ctx, r)
}

// Snapshot implements runtime.Sink: flush and pre-commit; the snapshot names
// every transaction still pending. Then it fires sink.after-precommit.
func (s *Sink[T]) Snapshot(ctx context.Context, id checkpoint.ID) (runtime.OperatorState, error) {
	if _, _, err := s.w.PreCommit(ctx, id); err != nil {
		return runtime.OperatorState{}, err
	}
	st := runtime.OperatorState{Handles: s.w.Pending()}
	if err := s.inject(failpoint.SinkAfterPrecommit); err != nil {
		return runtime.OperatorState{}, err
	}
	return st, nil
}

// NotifyCheckpointComplete implements checkpoint.Listener: it commits every
// transaction pre-committed for a checkpoint <= id, in checkpoint order,
// firing sink.after-commit after each commit returned.
func (s *Sink[T]) NotifyCheckpointComplete(ctx context.Context, id checkpoint.ID) error {
	for _, h := range s.w.Pending() {
		if h.Checkpoint > id {
			break
		}
		if err := s.w.Commit(ctx, h.Checkpoint); err != nil {
			return err
		}
		if err := s.inject(failpoint.SinkAfterCommit); err != nil {
			return err
		}
	}
	// Commit(id) also frees the ids that checkpoint id no longer names.
	return s.w.Commit(ctx, id)
}

// NotifyCheckpointAborted implements checkpoint.Listener: the aborted
// checkpoint's transaction stays pending for the next completed checkpoint.
func (s *Sink[T]) NotifyCheckpointAborted(context.Context, checkpoint.ID) error { return nil }

// CarriesAbortedCheckpoints implements checkpoint.AbortCarrier: an aborted
// checkpoint's transaction stays pending, is named by the next snapshot and
// committed with the next completed checkpoint.
func (s *Sink[T]) CarriesAbortedCheckpoints() {}

// Close implements runtime.Sink. Exactly once, it aborts the open
// transaction (records not yet pre-committed) and leaves pre-committed ones
// for the next Recover. Otherwise it first waits, for at most
// closeFlushTimeout, until the records written so far are acknowledged
// (best effort: an error is logged), since closing a kgo client drops what
// it still buffers.
func (s *Sink[T]) Close() error {
	if s.w == nil {
		return nil
	}
	if s.guarantee != ExactlyOnce {
		ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
		if err := s.w.Flush(ctx); err != nil {
			s.log.Warn("kafka sink: flush on close failed; buffered records may be lost", zap.Error(err))
		}
		cancel()
	}
	s.w.Close()
	return nil
}

// closeFlushTimeout bounds the flush of a non-transactional sink on Close.
const closeFlushTimeout = 5 * time.Second

func (s *Sink[T]) inject(name string) error {
	if s.fp == nil {
		return nil
	}
	return s.fp.Inject(name)
}

var _ checkpoint.CancelListener = (*Sink[int])(nil)
