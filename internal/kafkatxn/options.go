package kafkatxn

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/failpoint"
)

// DeliveryGuarantee is the delivery guarantee of a sink.
type DeliveryGuarantee uint8

const (
	// ExactlyOnce writes each checkpoint epoch of a subtask in one Kafka
	// transaction, pre-committed on the barrier and committed when the
	// checkpoint completes. Readers must use read_committed.
	ExactlyOnce DeliveryGuarantee = iota
	// AtLeastOnce writes without transactions and flushes on every barrier,
	// so everything before a completed checkpoint is durable; a restart may
	// write records again.
	AtLeastOnce
	// None writes without transactions and does not flush on barriers.
	None
)

// String returns the name used in job parameters ("exactly-once", ...).
func (g DeliveryGuarantee) String() string {
	switch g {
	case ExactlyOnce:
		return "exactly-once"
	case AtLeastOnce:
		return "at-least-once"
	case None:
		return "none"
	}
	return fmt.Sprintf("DeliveryGuarantee(%d)", uint8(g))
}

// ParseGuarantee parses "exactly-once", "at-least-once" or "none".
func ParseGuarantee(s string) (DeliveryGuarantee, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "exactly-once", "exactly_once":
		return ExactlyOnce, nil
	case "at-least-once", "at_least_once":
		return AtLeastOnce, nil
	case "none":
		return None, nil
	}
	return 0, fmt.Errorf("%w: unknown guarantee %q (want exactly-once, at-least-once or none)", ErrInvalidConfig, s)
}

// Defaults of a TxnWriter.
const (
	// DefaultPoolSize is the number of transactional ids per subtask. A
	// subtask needs, in steady state, one id for the open transaction, one
	// for the transaction pre-committed and awaiting its notification, and
	// one whose transaction was committed but is still named by the latest
	// completed checkpoint (it is reused only once a later checkpoint
	// completes). The spare two let notifications lag behind by two
	// checkpoints; beyond that Write or PreCommit report ErrPoolExhausted
	// (a snapshot never names more than PoolSize-1 ids, so a restore always
	// has an id to write with). Producers are created lazily, so unused ids
	// cost nothing.
	DefaultPoolSize = 5
	// MinPoolSize is the smallest pool that can run a steady state.
	MinPoolSize = 3
	// DefaultTransactionTimeout matches Kafka's default
	// transaction.max.timeout.ms (15 minutes).
	DefaultTransactionTimeout = 15 * time.Minute
	// MaxTransactionalIDPrefixLen bounds the prefix so that
	// "<prefix>-<subtask>-<index>" stays well inside Kafka's limits.
	MaxTransactionalIDPrefixLen = 200
)

// ErrInvalidConfig is wrapped by errors about a configuration that cannot
// work (bad options, transaction timeout shorter than recovery, ...).
var ErrInvalidConfig = errors.New("invalid configuration")

type cfg struct {
	brokers     []string
	prefix      string
	subtask     int
	parallelism int
	poolSize    int
	txnTimeout  time.Duration
	guarantee   DeliveryGuarantee
	clientOpts  []kgo.Opt
	logger      *zap.Logger
	failpoints  *failpoint.Set
	// singleGoroutine: one goroutine makes every state-changing call
	// (SingleGoroutine).
	singleGoroutine bool
	// recommitHook, when set (by tests only), runs during a
	// broker-lost-transaction re-commit (markers.go) after each
	// partition's copies were produced (one flush), with the number of
	// partitions produced so far; after the last, it runs before the
	// commit. A test crashes the broker there.
	recommitHook func(partitions int)
}

func defaultCfg() cfg {
	return cfg{
		parallelism: 1,
		poolSize:    DefaultPoolSize,
		txnTimeout:  DefaultTransactionTimeout,
		guarantee:   ExactlyOnce,
		logger:      zap.NewNop(),
	}
}

func (c *cfg) validate() error {
	if len(c.brokers) == 0 {
		return fmt.Errorf("%w: no seed brokers (use Brokers)", ErrInvalidConfig)
	}
	if c.parallelism < 1 || c.subtask < 0 || c.subtask >= c.parallelism {
		return fmt.Errorf("%w: subtask %d of parallelism %d", ErrInvalidConfig, c.subtask, c.parallelism)
	}
	if c.guarantee > None {
		return fmt.Errorf("%w: unknown guarantee %d", ErrInvalidConfig, c.guarantee)
	}
	if c.guarantee != ExactlyOnce {
		return nil
	}
	if err := ValidateTransactionalIDPrefix(c.prefix); err != nil {
		return err
	}
	if c.poolSize < MinPoolSize {
		return fmt.Errorf("%w: pool size %d < %d", ErrInvalidConfig, c.poolSize, MinPoolSize)
	}
	if c.txnTimeout < time.Millisecond || c.txnTimeout.Milliseconds() > 1<<31-1 {
		return fmt.Errorf("%w: transaction timeout %v out of range", ErrInvalidConfig, c.txnTimeout)
	}
	return nil
}

// ValidateTransactionalIDPrefix checks a transactional id prefix: it must be
// non-empty, at most MaxTransactionalIDPrefixLen bytes, and made of ASCII
// letters, digits, '.', '_' and '-' (the characters legal in topic names, so
// ids survive every tool and ACL pattern unquoted).
func ValidateTransactionalIDPrefix(prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: empty transactional id prefix (use TransactionalIDPrefix)", ErrInvalidConfig)
	}
	if len(prefix) > MaxTransactionalIDPrefixLen {
		return fmt.Errorf("%w: transactional id prefix is %d bytes, max %d", ErrInvalidConfig, len(prefix), MaxTransactionalIDPrefixLen)
	}
	for i := 0; i < len(prefix); i++ {
		b := prefix[i]
		switch {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9', b == '.', b == '_', b == '-':
		default:
			return fmt.Errorf("%w: transactional id prefix %q has illegal character %q", ErrInvalidConfig, prefix, b)
		}
	}
	return nil
}

// Opt configures a TxnWriter.
type Opt interface{ apply(*cfg) }

type opt struct{ fn func(*cfg) }

func (o opt) apply(c *cfg) { o.fn(c) }

// Brokers sets the seed brokers, "host:port". Required.
func Brokers(seeds ...string) Opt {
	return opt{func(c *cfg) { c.brokers = append(c.brokers[:0:0], seeds...) }}
}

// TransactionalIDPrefix sets the prefix of the transactional ids,
// "<prefix>-<subtask>-<poolIndex>". It must be unique per sink of a job and
// stable across restarts of the job (Recover finds lingering transactions by
// it). Required for ExactlyOnce.
func TransactionalIDPrefix(prefix string) Opt {
	return opt{func(c *cfg) { c.prefix = prefix }}
}

// Subtask sets this writer's subtask index and the sink's parallelism,
// default 0 of 1.
func Subtask(index, parallelism int) Opt {
	return opt{func(c *cfg) { c.subtask, c.parallelism = index, parallelism }}
}

// PoolSize sets how many transactional ids this subtask cycles through,
// default DefaultPoolSize, at least MinPoolSize.
func PoolSize(n int) Opt {
	return opt{func(c *cfg) { c.poolSize = n }}
}

// TransactionTimeout sets the transaction timeout of the producers, default
// 15 minutes. It must exceed the checkpoint timeout plus the worst-case time
// to restart and recover (see ValidateTimeouts), and must not exceed the
// brokers' transaction.max.timeout.ms.
func TransactionTimeout(d time.Duration) Opt {
	return opt{func(c *cfg) { c.txnTimeout = d }}
}

// Guarantee sets the delivery guarantee, default ExactlyOnce.
func Guarantee(g DeliveryGuarantee) Opt {
	return opt{func(c *cfg) { c.guarantee = g }}
}

// ClientOpts passes options to every kgo client the writer creates (TLS,
// SASL, compression, partitioner, linger, ...). Options that the writer
// sets itself (seed brokers, transactional id, transaction timeout) are
// applied after these and win.
func ClientOpts(opts ...kgo.Opt) Opt {
	return opt{func(c *cfg) { c.clientOpts = append(c.clientOpts, opts...) }}
}

// Logger sets the logger, default a no-op logger.
func Logger(l *zap.Logger) Opt {
	return opt{func(c *cfg) {
		if l != nil {
			c.logger = l
		}
	}}
}

// Failpoints sets the failpoints the writer fires (sink.after-precommit,
// sink.after-commit), default none.
func Failpoints(s *failpoint.Set) Opt {
	return opt{func(c *cfg) { c.failpoints = s }}
}

// SingleGoroutine declares that one goroutine at a time (a sink's task
// goroutine) makes every call of the writer but Pending, LostTransactions,
// UnverifiedCommits, Admin and Guarantee, which may come from anywhere: a
// later call is ordered after an earlier one (same goroutine, or handed on
// with a happens-before edge). Write then takes no lock while a
// transaction is open and the writer is usable: it only reads state that
// the owner itself changes. Without it, every method may be called
// concurrently (and Write locks).
func SingleGoroutine() Opt {
	return opt{func(c *cfg) { c.singleGoroutine = true }}
}

// Settings is what a connector needs to know of a set of writer options
// before any subtask exists.
type Settings struct {
	Guarantee          DeliveryGuarantee
	TransactionTimeout time.Duration
	PrefixSet          bool           // TransactionalIDPrefix was given
	Failpoints         *failpoint.Set // from the Failpoints option
}

// Inspect applies opts and validates everything but the per-subtask parts
// (the subtask and, when none was given, the prefix), so that a job with
// options that cannot work is refused when it is built.
func Inspect(opts ...Opt) (Settings, error) {
	c := defaultCfg()
	for _, o := range opts {
		o.apply(&c)
	}
	probe := c
	if probe.prefix == "" {
		probe.prefix = "probe"
	}
	if err := probe.validate(); err != nil {
		return Settings{}, err
	}
	return Settings{Guarantee: c.guarantee, TransactionTimeout: c.txnTimeout, PrefixSet: c.prefix != "", Failpoints: c.failpoints}, nil
}
