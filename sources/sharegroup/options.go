package sharegroup

import (
	"errors"
	"fmt"
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

// ErrInvalidConfig is wrapped by errors about the source's options.
var ErrInvalidConfig = errors.New("sharegroup: invalid configuration")

// ErrNoShareGroups is returned when the broker does not speak the share-group
// APIs (KIP-932).
var ErrNoShareGroups = errors.New("sharegroup: broker does not support share groups (KIP-932, Apache Kafka 4.2+)")

// ErrRolledBack is wrapped by the error with which the source fails its task
// when a checkpoint covering records it holds was aborted: in transactional
// mode the job must roll back to the last completed checkpoint, as those
// records are already reflected in downstream state.
var ErrRolledBack = errors.New("sharegroup: checkpoint aborted while holding its records; rolling back")

// ErrRecordsSkipped is wrapped by the (unrecoverable) error with which the
// transactional source fails its job when the group's share start offset
// moved past records that no committed ack marker covers: the broker lost or
// reset the share-group state, or archived records, and those records were
// never processed. It names the group, the partitions and the offsets.
var ErrRecordsSkipped = errors.New("sharegroup: records skipped by the share group")

type cfg struct {
	brokers        []string
	topics         []string
	group          string
	mode           AckMode
	lanes          int
	batch          int
	maxDeliveries  int32
	dlqTopic       string
	ackLogTopic    string
	txnPrefix      string
	txnTimeout     time.Duration
	resetEarliest  bool
	pollWait       time.Duration
	lockMargin     time.Duration
	tombstoneEvery time.Duration
	grace          time.Duration
	openWait       time.Duration // how long set-aside records wait on a foreign open marker
	checkEvery     time.Duration // share start offset check (subtask 0)
	renewTick      time.Duration // how often the renewer looks at the lanes
	clientOpts     []kgo.Opt
	logger         *zap.Logger
	observe        func(held map[acklog.TopicPartition]int, limit int)
	// paused stops lock renewal: tests use it to play a process that is
	// paused (GC, partition) while it holds records.
	paused bool
}

func defaultCfg() cfg {
	return cfg{mode: Transactional, txnTimeout: 15 * time.Minute, resetEarliest: true,
		pollWait: 50 * time.Millisecond, tombstoneEvery: time.Minute, openWait: DefaultOpenMarkerWait,
		checkEvery: 5 * time.Second, renewTick: 100 * time.Millisecond}
}

// DefaultOpenMarkerWait is the default for OpenMarkerWait.
const DefaultOpenMarkerWait = 5 * time.Minute

// OpenMarkerWait bounds how long a record covered by another job's
// still-open ack marker is held (and renewed, which costs no delivery)
// before that stale transaction is aborted by its recorded handle and the
// record redelivered, overriding DefaultOpenMarkerWait. Markers of the
// source's own job are never aborted this way: its checkpoints decide them.
// Aborting another job's marker is safe when that job is gone (crashed and
// not restarted, or cancelled before Weir aborted on cancel); if it was
// alive, its checkpoint has had this long to complete and commit, and a
// commit that comes later fails loudly as a lost transaction in that job.
func OpenMarkerWait(d time.Duration) Opt { return func(c *cfg) { c.openWait = d } }

// Opt configures a Source.
type Opt func(*cfg)

// Brokers sets the seed brokers.
func Brokers(seeds ...string) Opt { return func(c *cfg) { c.brokers = seeds } }

// Topics sets the topics the share group reads.
func Topics(topics ...string) Opt { return func(c *cfg) { c.topics = topics } }

// Group sets the share group.
func Group(g string) Opt { return func(c *cfg) { c.group = g } }

// Mode sets the acknowledgement mode (default Transactional).
func Mode(m AckMode) Opt { return func(c *cfg) { c.mode = m } }

// Lanes sets how many share-consumer clients each subtask runs (default:
// partitions / parallelism, at least 1, at most 8). A lane holds one batch
// until its checkpoint completes, so lanes bound what a subtask holds;
// more lanes than partitions in the group wait on each other.
func Lanes(n int) Opt { return func(c *cfg) { c.lanes = n } }

// BatchSize sets the records one lane acquires per poll. The default (0)
// is the broker's per-partition in-flight cap
// (group.share.partition.max.record.locks, Kafka's default 2000), at most
// 10000: a lane holds its batch for a whole checkpoint cycle, so the batch
// sets how much one cycle moves (the broker clips larger values to the cap
// anyway).
func BatchSize(n int) Opt { return func(c *cfg) { c.batch = n } }

// MaxDeliveries sets the delivery count at which a record is treated as
// poison: REJECTed and copied to the dead-letter topic instead of emitted.
// The default is one below the broker's group.share.delivery.count.limit
// (Kafka's default 5, so 4), the last delivery before the broker would
// archive the record. Redeliveries caused by group churn (lanes leaving and
// joining when a job restarts) count too: raise the broker's limit for
// exactly-once jobs.
func MaxDeliveries(n int) Opt { return func(c *cfg) { c.maxDeliveries = int32(n) } }

// DeadLetterTopic sets where poison and undecodable records go (default
// "<group>-dlq", created when missing).
func DeadLetterTopic(t string) Opt { return func(c *cfg) { c.dlqTopic = t } }

// AckLogTopic sets the ack-log topic (default acklog.TopicFor(group)).
func AckLogTopic(t string) Opt { return func(c *cfg) { c.ackLogTopic = t } }

// TransactionalIDPrefix sets the prefix of the transactional ids of the
// ack-marker transactions (default "weir-<job>-<operator uid>").
func TransactionalIDPrefix(p string) Opt { return func(c *cfg) { c.txnPrefix = p } }

// TransactionTimeout sets the ack-marker transactions' timeout (default 15m).
func TransactionTimeout(d time.Duration) Opt { return func(c *cfg) { c.txnTimeout = d } }

// StartFromLatest makes a new group start at the end of its topics; the
// default sets share.auto.offset.reset=earliest on the group before it reads.
func StartFromLatest() Opt { return func(c *cfg) { c.resetEarliest = false } }

// LockMargin sets how long before a lock's expiry a lane considers it at
// risk, overriding a quarter of the broker's lock duration, at most 5s: an
// epoch whose locks may have lapsed declines its checkpoint, and records
// whose lock has less left than this when polled are released unprocessed.
func LockMargin(d time.Duration) Opt { return func(c *cfg) { c.lockMargin = d } }

// MarkerGrace sets how long after their creation resolved ack markers are
// kept before they are tombstoned (default 10 x the lock duration).
func MarkerGrace(d time.Duration) Opt { return func(c *cfg) { c.grace = d } }

// ClientOpts passes options (TLS, SASL, ...) to every franz-go client.
func ClientOpts(opts ...kgo.Opt) Opt {
	return func(c *cfg) { c.clientOpts = append(c.clientOpts, opts...) }
}

// ObserveInFlight calls fn, on the task goroutine, each time the records
// held by this subtask change: held records per topic-partition (acquired,
// not yet acknowledged) and the broker's per-partition cap
// (group.share.partition.max.record.locks). It is the in-flight window
// metric; fn must return quickly.
func ObserveInFlight(fn func(held map[acklog.TopicPartition]int, limit int)) Opt {
	return func(c *cfg) { c.observe = fn }
}

// Logger sets the logger (default: the operator's).
func Logger(l *zap.Logger) Opt { return func(c *cfg) { c.logger = l } }

func (c *cfg) validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(f, a...)) }
	switch {
	case len(c.brokers) == 0:
		return bad("no brokers")
	case len(c.topics) == 0:
		return bad("no topics")
	case c.group == "":
		return bad("no group")
	case c.lanes < 0 || c.lanes > 64:
		return bad("lanes %d out of [0, 64]", c.lanes)
	case c.batch < 0:
		return bad("batch size %d < 0", c.batch)
	case c.maxDeliveries != 0 && c.maxDeliveries < 2:
		return bad("max deliveries %d < 2", c.maxDeliveries)
	case c.mode > Implicit:
		return bad("unknown mode %d", c.mode)
	case c.openWait <= 0:
		return bad("open-marker wait %v <= 0", c.openWait)
	}
	return nil
}
