package kafka

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatxn"
)

// The sink's writer is kafkatxn.TxnWriter, shared with the share-group
// source. These names are its configuration as the sink's users see it.

// Opt configures the transactional writer of each sink subtask.
type Opt = kafkatxn.Opt

// DeliveryGuarantee is the delivery guarantee of a sink.
type DeliveryGuarantee = kafkatxn.DeliveryGuarantee

const (
	// ExactlyOnce writes each checkpoint epoch of a subtask in one Kafka
	// transaction, pre-committed on the barrier and committed when the
	// checkpoint completes. Readers must use read_committed.
	ExactlyOnce = kafkatxn.ExactlyOnce
	// AtLeastOnce writes without transactions and flushes on every barrier,
	// so everything before a completed checkpoint is durable; a restart may
	// write records again.
	AtLeastOnce = kafkatxn.AtLeastOnce
	// None writes without transactions and does not flush on barriers.
	None = kafkatxn.None
)

// Errors of the sink, matchable with errors.Is.
var (
	// ErrInvalidConfig is wrapped by errors about a configuration that
	// cannot work (bad options, transaction timeout shorter than recovery).
	ErrInvalidConfig = kafkatxn.ErrInvalidConfig
	// ErrTxnLost is wrapped by Open's error when pre-committed transactions
	// of the restored checkpoint can no longer be committed: records lost.
	// The job fails without restarting (unless TolerateLostTransactions).
	ErrTxnLost = kafkatxn.ErrTxnLost
	// ErrTxnTopicGone is wrapped, next to ErrTxnLost, when such a
	// transaction's topic was deleted or lost the partition it wrote to:
	// no restart can bring its records back.
	ErrTxnTopicGone = kafkatxn.ErrTxnTopicGone
)

// CheckTransactionTimeout refuses a transaction timeout that a
// pre-committed transaction could outlive under a job's checkpoint timing,
// or that the brokers refuse; for a job submission path to refuse a job
// before it starts (Open runs it too).
func CheckTransactionTimeout(ctx context.Context, admin *kadm.Client, txnTimeout time.Duration, t checkpoint.Timing) error {
	return kafkatxn.CheckTransactionTimeout(ctx, admin, txnTimeout, t)
}

// ValidateTimeouts is CheckTransactionTimeout for a job known only by its
// checkpoint timeout and restart budget.
func ValidateTimeouts(ctx context.Context, admin *kadm.Client, txnTimeout, checkpointTimeout, restartBudget time.Duration) error {
	return kafkatxn.ValidateTimeouts(ctx, admin, txnTimeout, checkpointTimeout, restartBudget)
}

// BrokerMaxTransactionTimeout reads the smallest transaction.max.timeout.ms
// of the brokers.
func BrokerMaxTransactionTimeout(ctx context.Context, admin *kadm.Client) (time.Duration, error) {
	return kafkatxn.BrokerMaxTransactionTimeout(ctx, admin)
}

// ParseGuarantee parses "exactly-once", "at-least-once" or "none".
func ParseGuarantee(s string) (DeliveryGuarantee, error) { return kafkatxn.ParseGuarantee(s) }

// Brokers sets the seed brokers, "host:port". Required.
func Brokers(seeds ...string) Opt { return kafkatxn.Brokers(seeds...) }

// TransactionalIDPrefix sets the prefix of the transactional ids,
// "<prefix>-<subtask>-<poolIndex>", overriding "weir-<job>-<operator uid>".
// It must be unique per sink of a job and stable across restarts of the job.
func TransactionalIDPrefix(prefix string) Opt { return kafkatxn.TransactionalIDPrefix(prefix) }

// PoolSize sets how many transactional ids each subtask cycles through,
// overriding kafkatxn.DefaultPoolSize (5); at least 3.
func PoolSize(n int) Opt { return kafkatxn.PoolSize(n) }

// TransactionTimeout sets the transaction timeout of the producers,
// overriding 15 minutes. It must exceed the job's
// checkpoint.Timing.MaxTransactionLifetime (checked in Open) and must not
// exceed the brokers' transaction.max.timeout.ms.
func TransactionTimeout(d time.Duration) Opt { return kafkatxn.TransactionTimeout(d) }

// Guarantee sets the delivery guarantee, overriding ExactlyOnce.
func Guarantee(g DeliveryGuarantee) Opt { return kafkatxn.Guarantee(g) }

// ClientOpts passes options to every kgo client the sink creates (TLS,
// SASL, compression, partitioner, linger, ...). Options the sink sets itself
// (seed brokers, transactional id, transaction timeout) win.
func ClientOpts(opts ...kgo.Opt) Opt { return kafkatxn.ClientOpts(opts...) }

// Logger sets the logger, overriding the operator's.
func Logger(l *zap.Logger) Opt { return kafkatxn.Logger(l) }

// Failpoints sets the failpoints the sink fires (sink.after-precommit,
// sink.after-commit) when the runtime gives none.
func Failpoints(s *failpoint.Set) Opt { return kafkatxn.Failpoints(s) }
