package sharegroup

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// AckMode says when the source acknowledges what it read.
type AckMode uint8

const (
	// Transactional is exactly-once: records stay acquired until their
	// checkpoint completes; an ack marker rides in the checkpoint's Kafka
	// transaction; records are ACCEPTed after the commit. The default.
	Transactional AckMode = iota
	// AtLeastOnce ACCEPTs records when the checkpoint that covers them
	// completes. After a failure, records processed since the last completed
	// checkpoint are delivered again.
	AtLeastOnce
	// Implicit ACCEPTs records as soon as they are emitted. After a failure,
	// records emitted but not yet reflected in a completed checkpoint are
	// lost: at-most-once.
	Implicit
)

func (m AckMode) String() string {
	switch m {
	case Transactional:
		return "transactional"
	case AtLeastOnce:
		return "at-least-once"
	case Implicit:
		return "implicit"
	}
	return fmt.Sprintf("AckMode(%d)", m)
}

// ParseAckMode parses "transactional" (or "exactly-once"), "at-least-once"
// or "implicit".
func ParseAckMode(s string) (AckMode, error) {
	switch s {
	case "transactional", "exactly-once":
		return Transactional, nil
	case "at-least-once":
		return AtLeastOnce, nil
	case "implicit":
		return Implicit, nil
	}
	return 0, fmt.Errorf("%w: acknowledgement mode %q: want transactional, at-least-once or implicit", ErrInvalidConfig, s)
}

// ErrInvalidConfig is wrapped by errors about the options of a Source or a
// Session.
var ErrInvalidConfig = errors.New("invalid configuration")

// ErrNoShareGroups is returned when the broker does not speak the share-group
// APIs (KIP-932).
var ErrNoShareGroups = errors.New("broker does not support share groups (KIP-932, Apache Kafka 4.2+)")

// ErrRolledBack is wrapped by the error with which the source fails its task
// when a checkpoint covering records it holds was aborted: in transactional
// mode the job must roll back to the last completed checkpoint, as those
// records are already reflected in downstream state.
var ErrRolledBack = errors.New("checkpoint aborted while holding its records; rolling back")

// ErrRecordsSkipped is wrapped by the (unrecoverable) error with which the
// transactional source fails its job when the group's share start offset
// moved past records that no committed ack marker covers: the broker lost or
// reset the share-group state, or archived records, and those records were
// never processed. It names the group, the partitions and the offsets.
var ErrRecordsSkipped = errors.New("records skipped by the share group")

// ErrRestoreBehindAcks refuses (Source.VerifyRestore: at submit, or before
// a job's first attempt) a restore of a checkpoint or savepoint older than
// acknowledgements its share group committed since: those records are gone
// from the group, so the restored state would silently miss their effect
// (share groups cannot rewind).
var ErrRestoreBehindAcks = errors.New("savepoint older than the share group's committed acknowledgements")

// cfg is the configuration of a Source or a Session: the options they
// share, then each one's own.
type cfg struct {
	// Shared.
	brokers     []string
	topics      []string
	group       string
	ackLogTopic string
	batch       int // records per poll
	txnTimeout  time.Duration
	openWait    time.Duration // how long records wait on another transaction's open marker
	lockMargin  time.Duration // 0: a quarter of the lock duration, at most 5s; < 0 (tests): own clock off
	// testNoLockClock lets tests switch the holder's own lock clock off
	// (a negative lockMargin) to exercise what stands behind it.
	testNoLockClock bool
	resetEarliest   bool
	clientOpts      []kgo.Opt
	logger          *zap.Logger
	// checkEvery is how often the group's isolation level is checked (a
	// Source's subtask 0, a Session's Poll), and a Source's share start
	// offsets with it.
	checkEvery time.Duration

	// The framework Source's.
	mode           AckMode
	lanes          int
	maxDeliveries  int32
	maxRequeues    int
	requeueTopic   string
	dlqTopic       string
	txnPrefix      string
	grace          time.Duration
	observe        func(held map[acklog.TopicPartition]int, limit int)
	pollWait       time.Duration
	idleCommit     time.Duration // 0: off
	tombstoneEvery time.Duration
	renewTick      time.Duration // how often the renewer looks at the lanes
	stagger        time.Duration // a lane starts at most this long after the one before it
	// paused stops lock renewal: tests use it to play a process that is
	// paused (GC, partition) while it holds records.
	paused bool
	// frontierEvery is how often a subtask reads the group's frontier
	// (FrontierInterval); ownWatermarks switches the frontier off
	// (SubtaskWatermarks).
	frontierEvery time.Duration
	ownWatermarks bool
	// testAcquired, when set (tests), sees every batch a lane acquires,
	// admitted or not: it measures deliveries per record.
	testAcquired func(lane string, recs []*kgo.Record)

	// The Session's.
	txnID      string
	renewEvery time.Duration // 0: a third of the lock duration; < 0: never

	// Role-specific options given, for the misuse check.
	sourceOnly, sessionOnly []string
}

// Defaults of a Source.
const (
	// DefaultTransactionTimeout is the Source's default TransactionTimeout,
	// Kafka's default transaction.max.timeout.ms.
	DefaultTransactionTimeout = 15 * time.Minute
	// DefaultOpenMarkerWait is the Source's default OpenMarkerWait.
	DefaultOpenMarkerWait = 5 * time.Minute
	// DefaultMaxRequeues is the Source's default MaxRequeues: no bound.
	// Restarts, rollbacks and group churn re-queue healthy records, so a
	// re-queue is no processing failure; the job's restart strategy bounds
	// a record that fails its job every time.
	DefaultMaxRequeues = 0
	// DefaultFrontierInterval is the Source's default FrontierInterval.
	DefaultFrontierInterval = 250 * time.Millisecond
)

func sourceDefaults() cfg {
	return cfg{mode: Transactional, txnTimeout: DefaultTransactionTimeout, resetEarliest: true, maxRequeues: DefaultMaxRequeues,
		pollWait: 50 * time.Millisecond, tombstoneEvery: time.Minute, openWait: DefaultOpenMarkerWait,
		checkEvery: 5 * time.Second, renewTick: 100 * time.Millisecond, stagger: 250 * time.Millisecond,
		frontierEvery: DefaultFrontierInterval}
}

// Session defaults.
const (
	// DefaultSessionMaxRecords is a Session's default BatchSize.
	DefaultSessionMaxRecords = 500
	// DefaultSessionTransactionTimeout is a Session's default
	// TransactionTimeout.
	DefaultSessionTransactionTimeout = time.Minute
	// DefaultSessionOpenMarkerWait is a Session's default OpenMarkerWait.
	DefaultSessionOpenMarkerWait = 10 * time.Second
)

func sessionDefaults() cfg {
	return cfg{batch: DefaultSessionMaxRecords, txnTimeout: DefaultSessionTransactionTimeout,
		openWait: DefaultSessionOpenMarkerWait, resetEarliest: true, checkEvery: 5 * time.Second}
}

// Opt configures a Source (New) or a Session (NewSession). The options only
// one of them takes are a SourceOpt or a SessionOpt; giving one to the other
// is refused with ErrInvalidConfig.
type Opt interface{ apply(*cfg) }

// SourceOpt is an option only the framework Source (New) takes.
type SourceOpt interface {
	Opt
	sourceOpt()
}

// SessionOpt is an option only Session (NewSession) takes.
type SessionOpt interface {
	Opt
	sessionOpt()
}

type opt struct{ fn func(*cfg) }

func (o opt) apply(c *cfg) { o.fn(c) }

type sourceOpt struct {
	name string
	fn   func(*cfg)
}

func (o sourceOpt) apply(c *cfg) { o.fn(c); c.sourceOnly = append(c.sourceOnly, o.name) }
func (sourceOpt) sourceOpt()     {}

type sessionOpt struct {
	name string
	fn   func(*cfg)
}

func (o sessionOpt) apply(c *cfg) { o.fn(c); c.sessionOnly = append(c.sessionOnly, o.name) }
func (sessionOpt) sessionOpt()    {}

// Brokers sets the seed brokers, "host:port". Required.
func Brokers(seeds ...string) Opt { return opt{func(c *cfg) { c.brokers = slices.Clone(seeds) }} }

// Topics sets the topics the share group reads. Required; they must exist.
func Topics(topics ...string) Opt { return opt{func(c *cfg) { c.topics = slices.Clone(topics) }} }

// Group sets the share group. Required.
func Group(g string) Opt { return opt{func(c *cfg) { c.group = g }} }

// AckLogTopic sets the ack-log topic, overriding acklog.TopicFor(group). It
// is created (one partition, compacted) when missing. Every source and
// session of the group must use the same one.
func AckLogTopic(t string) Opt { return opt{func(c *cfg) { c.ackLogTopic = t }} }

// BatchSize sets the records one poll acquires (a Source's lane, or a
// Session's Poll). A Source's default (0) is the broker's per-partition
// in-flight cap (group.share.partition.max.record.locks, Kafka's default
// 2000), at most 10000: a lane holds its batch for a whole checkpoint cycle,
// so the batch sets how much one cycle moves. A Session's default is
// DefaultSessionMaxRecords. The broker clips larger values to the cap.
func BatchSize(n int) Opt { return opt{func(c *cfg) { c.batch = n }} }

// TransactionTimeout sets the timeout of the transactions that carry ack
// markers, overriding DefaultTransactionTimeout for a Source and
// DefaultSessionTransactionTimeout for a Session. A transaction open longer
// is aborted by the broker: for a Session from its first Produce to Commit,
// waits included, so it must exceed OpenMarkerWait.
func TransactionTimeout(d time.Duration) Opt { return opt{func(c *cfg) { c.txnTimeout = d }} }

// OpenMarkerWait bounds how long a record covered by another transaction's
// still-open ack marker waits, held (renewed, which costs no delivery),
// before that stale transaction is aborted by the handle the marker names
// and the record is judged again: an abort is safe when that transaction's
// owner is gone; if it had committed, the abort fails and the commit is
// seen. It overrides DefaultOpenMarkerWait for a Source and
// DefaultSessionOpenMarkerWait for a Session.
//
// A Source never aborts markers of its own job (its checkpoints decide
// them). Another Weir job's marker whose checkpoint completed but was not
// committed within the wait (that job down for longer) is aborted too:
// that job's recovery then fails loudly with a lost transaction.
func OpenMarkerWait(d time.Duration) Opt { return opt{func(c *cfg) { c.openWait = d }} }

// LockMargin sets how close to its lock's expiry a held record counts as
// lost, overriding a quarter of the broker's lock duration, at most 5s:
// records acquired with less than this left are released unprocessed, and a
// batch whose locks may have lapsed by the holder's own clock declines its
// checkpoint (a Session's Commit fails with ErrConflict).
func LockMargin(d time.Duration) Opt { return opt{func(c *cfg) { c.lockMargin = d }} }

// StartFromLatest leaves share.auto.offset.reset alone (a new group then
// starts at the end of its topics); by default it is set to earliest on the
// group (a group config) before the group first reads. (Whatever the
// options, share.isolation.level=read_committed is set on the group, and
// checked: see ErrReadUncommitted.)
func StartFromLatest() Opt { return opt{func(c *cfg) { c.resetEarliest = false }} }

// ClientOpts passes options (TLS, SASL, ...) to every franz-go client. They
// must not change what is consumed or produced.
func ClientOpts(opts ...kgo.Opt) Opt {
	return opt{func(c *cfg) { c.clientOpts = append(c.clientOpts, opts...) }}
}

// Logger sets the logger, overriding the operator's (Source) or a no-op
// logger (Session).
func Logger(l *zap.Logger) Opt { return opt{func(c *cfg) { c.logger = l }} }

// Mode sets a Source's acknowledgement mode, overriding Transactional.
func Mode(m AckMode) SourceOpt { return sourceOpt{"Mode", func(c *cfg) { c.mode = m }} }

// Lanes sets how many share-consumer clients each Source subtask runs,
// overriding partitions / parallelism (at least 1, at most 8). A lane holds
// one batch until its checkpoint completes, so lanes bound what a subtask
// holds; more lanes than partitions in the group wait on each other.
func Lanes(n int) SourceOpt { return sourceOpt{"Lanes", func(c *cfg) { c.lanes = n }} }

// MaxDeliveries sets, for the AtLeastOnce and Implicit modes, the delivery
// count at which a Source treats a record as poison: REJECTed and copied to
// the dead-letter topic instead of emitted. The default is one below the
// broker's group.share.delivery.count.limit (Kafka's default 5, so 4), the
// last delivery before the broker would archive the record. Every
// acquisition counts, restarts and rollbacks included. (Transactional mode
// re-queues instead: see MaxRequeues.)
func MaxDeliveries(n int) SourceOpt {
	return sourceOpt{"MaxDeliveries", func(c *cfg) { c.maxDeliveries = int32(n) }}
}

// MaxRequeues sets how often a transactional Source re-queues a record
// before it treats it as poison, overriding DefaultMaxRequeues (0: no
// bound). The broker counts a delivery at every acquisition (restarts,
// rollbacks and group churn too), so a redelivered record that no
// committed ack marker covers is not processed but copied, with a fresh
// delivery budget, to the retry topic in a transaction that also
// acknowledges the original (exactly once). A record re-queued this many
// times is dead-lettered. Every restart of a job can re-queue every record
// it held: a bound dead-letters healthy records of a job that restarts
// that often.
func MaxRequeues(n int) SourceOpt {
	return sourceOpt{"MaxRequeues", func(c *cfg) { c.maxRequeues = n }}
}

// RetryTopic sets the topic a transactional Source re-queues records to
// and reads besides its topics, overriding "<group>-retry" (created with
// one partition when missing).
func RetryTopic(t string) SourceOpt {
	return sourceOpt{"RetryTopic", func(c *cfg) { c.requeueTopic = t }}
}

// DeadLetterTopic sets where a Source sends poison and undecodable records,
// overriding "<group>-dlq" (created when missing).
func DeadLetterTopic(t string) SourceOpt {
	return sourceOpt{"DeadLetterTopic", func(c *cfg) { c.dlqTopic = t }}
}

// TransactionalIDPrefix sets the prefix of a Source's ack-marker
// transactional ids, overriding "weir-<job>-<operator uid>". It must not
// end with "-rq": the source's re-queue writer uses "<prefix>-rq", and a
// job with such a prefix would share another job's transactional ids.
func TransactionalIDPrefix(p string) SourceOpt {
	return sourceOpt{"TransactionalIDPrefix", func(c *cfg) { c.txnPrefix = p }}
}

// MarkerGrace sets how long after their creation resolved ack markers are
// kept before a Source tombstones them, overriding 10 x the lock duration.
func MarkerGrace(d time.Duration) SourceOpt {
	return sourceOpt{"MarkerGrace", func(c *cfg) { c.grace = d }}
}

// CommitWhenIdle makes a Source ask for a checkpoint when no batch has
// come for d while it holds records that no checkpoint covers yet. When the
// input goes quiet, what was read is then committed (its output visible
// downstream, its share locks released) within about d plus one checkpoint
// cycle, instead of at the next interval.
//
// It is off by default (0): a source that keeps up leaves the pace to the
// checkpoint interval, as in Flink. The cost is a checkpoint per quiet
// gap: records that trickle in slower than one batch per d are
// checkpointed about once per batch, bounded by the job's MinPause (by
// default the checkpoint interval: give the job a shorter runtime.MinPause
// for a long interval).
// It suits bursty or batch-like input whose end-to-end latency matters
// more than the number of checkpoints.
func CommitWhenIdle(d time.Duration) SourceOpt {
	return sourceOpt{"CommitWhenIdle", func(c *cfg) { c.idleCommit = d }}
}

// ObserveInFlight calls fn, on the task goroutine, each time the records
// held by a Source subtask change: held records per topic-partition
// (acquired, not yet acknowledged) and the broker's per-partition cap
// (group.share.partition.max.record.locks). It is the in-flight window
// metric; fn must return quickly.
func ObserveInFlight(fn func(held map[acklog.TopicPartition]int, limit int)) SourceOpt {
	return sourceOpt{"ObserveInFlight", func(c *cfg) { c.observe = fn }}
}

// FrontierInterval sets how often each Source subtask reads the group's
// frontier, which makes its watermark when the job has a
// runtime.WatermarkStrategy (docs/internals/event-time.md, "Watermarks
// from a share group"): the share start offset of every input partition
// (one DescribeShareGroupOffsets) and, for each partition whose start
// moved, the record there (one Fetch to each leader). The default,
// DefaultFrontierInterval, adds at most that much to the watermark's lag
// behind the group's progress.
func FrontierInterval(d time.Duration) SourceOpt {
	return sourceOpt{"FrontierInterval", func(c *cfg) { c.frontierEvery = d }}
}

// SubtaskWatermarks makes each Source subtask's watermark follow only the
// records it emitted, not the group's frontier: the rule before the
// frontier existed, kept to measure what the frontier costs (the
// sharegroup-watermark benchmark). A share group spreads every partition
// over every subtask, so a subtask's watermark then passes records that
// no subtask has fetched yet, and they are late: do not use it for
// event-time results.
func SubtaskWatermarks() SourceOpt {
	return sourceOpt{"SubtaskWatermarks", func(c *cfg) { c.ownWatermarks = true }}
}

// TransactionalID sets the transactional.id of a Session's producer,
// overriding a random "weir-session-<hex>". Give each concurrently running
// session its own; reusing the id of a dead session fences it and aborts
// its open transaction at once.
func TransactionalID(id string) SessionOpt {
	return sessionOpt{"TransactionalID", func(c *cfg) { c.txnID = id }}
}

// RenewEvery sets how often a Session renews the locks of its open batch in
// the background (AckRenew, no poll), overriding a third of the lock
// duration. A negative value disables renewal: a batch is then held for at
// most one lock duration.
func RenewEvery(d time.Duration) SessionOpt {
	return sessionOpt{"RenewEvery", func(c *cfg) { c.renewEvery = d }}
}

// validate checks the shared options.
func (c *cfg) validate(role string) error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, role, fmt.Sprintf(f, a...))
	}
	switch {
	case len(c.brokers) == 0:
		return bad("no brokers")
	case len(c.topics) == 0:
		return bad("no topics")
	case c.group == "":
		return bad("no group")
	case c.batch < 0 || c.batch > 1<<30:
		return bad("batch size %d out of [0, 2^30]", c.batch)
	case c.txnTimeout <= 0:
		return bad("transaction timeout %v <= 0", c.txnTimeout)
	case c.openWait <= 0:
		return bad("open-marker wait %v <= 0", c.openWait)
	case c.lockMargin < 0 && !c.testNoLockClock:
		return bad("lock margin %v < 0", c.lockMargin)
	}
	return nil
}

// validateSource checks a Source's options.
func (c *cfg) validateSource() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: source: %s", ErrInvalidConfig, fmt.Sprintf(f, a...))
	}
	if len(c.sessionOnly) > 0 {
		return bad("%s only configure a Session", strings.Join(c.sessionOnly, ", "))
	}
	if err := c.validate("source"); err != nil {
		return err
	}
	switch {
	case c.lanes < 0 || c.lanes > 64:
		return bad("lanes %d out of [0, 64]", c.lanes)
	case c.maxDeliveries != 0 && c.maxDeliveries < 2:
		return bad("max deliveries %d < 2", c.maxDeliveries)
	case c.maxRequeues < 0:
		return bad("max re-queues %d < 0", c.maxRequeues)
	case c.mode > Implicit:
		return bad("unknown mode %d", c.mode)
	case c.idleCommit < 0:
		return bad("idle-commit time %v < 0", c.idleCommit)
	case strings.HasSuffix(c.txnPrefix, requeuePrefixSuffix):
		return bad("transactional-id prefix %q ends with %q, the suffix of another job's re-queue writer", c.txnPrefix, requeuePrefixSuffix)
	case c.frontierEvery <= 0:
		return bad("frontier interval %v <= 0", c.frontierEvery)
	}
	return nil
}

// validateSession checks a Session's options.
func (c *cfg) validateSession() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: session: %s", ErrInvalidConfig, fmt.Sprintf(f, a...))
	}
	if len(c.sourceOnly) > 0 {
		return bad("%s only configure a Source", strings.Join(c.sourceOnly, ", "))
	}
	if err := c.validate("session"); err != nil {
		return err
	}
	switch {
	case c.batch < 1:
		return bad("batch size %d < 1", c.batch)
	case c.txnTimeout <= c.openWait:
		return bad("transaction timeout %v must exceed the open-marker wait %v", c.txnTimeout, c.openWait)
	}
	return nil
}
