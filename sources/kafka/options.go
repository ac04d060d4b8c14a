package kafka

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// ErrInvalidConfig is wrapped by errors about the options of a source.
var ErrInvalidConfig = errors.New("invalid configuration")

// ErrReadUncommitted is wrapped by the (unrecoverable) error with which a
// source fails its job when its client would read records of open and
// aborted transactions: ClientOpts that set read_uncommitted are refused.
var ErrReadUncommitted = errors.New("the Kafka source reads committed records only")

// ErrTopicGone is wrapped by the error with which a source fails its task
// when a topic it was reading (by Topics, or one that matched TopicRegex)
// was deleted, or lost partitions it read: the offsets in its state would
// be meaningless for a topic created again under the same name.
var ErrTopicGone = errors.New("topic deleted while read")

// ErrUnknownTopic is wrapped by the error with which a bounded source
// fails its task when a topic it was given (Topics) does not exist: it
// would end at once having read nothing. An unbounded source waits for the
// topic instead (discovery finds it once created).
var ErrUnknownTopic = errors.New("unknown topic")

// ErrOffsetOutOfRange is wrapped by the error with which a source fails its
// task when a partition's position left the log (its records were deleted
// by retention, or the log was truncated) and OnOutOfRange(FailOnOutOfRange)
// is set. By default the source resets to the log start instead, counting
// and logging what it skipped.
var ErrOffsetOutOfRange = errors.New("offset out of range")

// Opt configures a source (kgo's style).
type Opt interface{ apply(*cfg) }

type opt struct{ fn func(*cfg) }

func (o opt) apply(c *cfg) { o.fn(c) }

// DefaultDiscoveryInterval is how often a source looks for new partitions
// and new topics matching its regular expression unless DiscoveryInterval
// says otherwise: Flink's KafkaSource default
// (partition.discovery.interval.ms, 5 minutes) is long for a job that
// should pick up a topic's new partitions before its producers fill them;
// 30 s costs one metadata request per subtask every 30 s.
const DefaultDiscoveryInterval = 30 * time.Second

// OutOfRangePolicy says what a source does when a partition's position is
// no longer in the log (OnOutOfRange).
type OutOfRangePolicy uint8

const (
	// ResetToEarliest resumes at the partition's log start, counts the
	// records skipped (kafka_recordsSkipped_total) and logs them at error
	// level. The default.
	ResetToEarliest OutOfRangePolicy = iota
	// FailOnOutOfRange fails the job (ErrOffsetOutOfRange, unrecoverable):
	// nothing is skipped without someone deciding it.
	FailOnOutOfRange
)

// cfg is a source's configuration.
type cfg struct {
	brokers    []string
	topics     []string
	regex      string
	re         *regexp.Regexp
	group      string
	start      Offset
	stop       *Offset // nil: unbounded
	discovery  time.Duration
	dlqTopic   string
	txnPrefix  string
	txnTimeout time.Duration
	outOfRange OutOfRangePolicy
	maxPoll    int
	clientOpts []kgo.Opt
	logger     *zap.Logger
}

func defaults() cfg {
	return cfg{start: Earliest(), discovery: DefaultDiscoveryInterval, txnTimeout: 15 * time.Minute, maxPoll: 10000}
}

// Brokers sets the seed brokers (required).
func Brokers(seeds ...string) Opt { return opt{func(c *cfg) { c.brokers = slices.Clone(seeds) }} }

// Topics sets the topics to read. Topics and TopicRegex are exclusive; one
// is required.
func Topics(topics ...string) Opt { return opt{func(c *cfg) { c.topics = slices.Clone(topics) }} }

// TopicRegex reads every topic whose whole name matches re (Go syntax,
// anchored at both ends), including topics created while the job runs
// (found at the next discovery). Internal topics (starting with "__") never
// match.
func TopicRegex(re string) Opt { return opt{func(c *cfg) { c.regex = re }} }

// Group names the consumer group to which a source commits the offsets of
// every completed checkpoint, for lag monitoring only (as Flink does): it
// never changes what is read, except through StartAt(Committed(...)) on a
// fresh start. Without it nothing is committed.
func Group(g string) Opt { return opt{func(c *cfg) { c.group = g }} }

// StartAt sets where a fresh start (no restored state for the partition)
// reads from; default Earliest(). Partitions discovered after the first
// discovery of a run start at the earliest offset (as Flink's), whatever
// StartAt says: their records were written after the job started.
func StartAt(o Offset) Opt { return opt{func(c *cfg) { c.start = o }} }

// StopAt makes the source bounded: each partition is read up to the offset
// o gives (exclusive), then the source ends its input
// (runtime.ErrEndOfInput) and the job finishes once its final checkpoint
// completed. o is Latest() (the last stable offsets when the partition is
// first read), AtTimestamp (the first offset at or after the time) or
// AtOffsets (a partition missing from the map is read to its latest offset).
// A bounded source discovers partitions once, at its start.
func StopAt(o Offset) Opt { return opt{func(c *cfg) { oo := o; c.stop = &oo }} }

// DiscoveryInterval sets how often a subtask looks for new partitions of
// its topics and new topics matching TopicRegex (default
// DefaultDiscoveryInterval; a bounded source discovers once).
func DiscoveryInterval(d time.Duration) Opt { return opt{func(c *cfg) { c.discovery = d }} }

// DeadLetterTopic sets where records that fail to decode go (created with
// one partition when missing), default "<group>-dlq", or "<first
// topic>-dlq" without a group. They are written inside a Kafka transaction
// per checkpoint, committed when the checkpoint completes: exactly once.
func DeadLetterTopic(t string) Opt { return opt{func(c *cfg) { c.dlqTopic = t }} }

// TransactionalIDPrefix sets the prefix of the dead-letter writer's
// transactional ids (default "weir-<job>-<uid>").
func TransactionalIDPrefix(p string) Opt { return opt{func(c *cfg) { c.txnPrefix = p }} }

// TransactionTimeout sets the dead-letter writer's transaction timeout
// (default 15 minutes, as the Kafka sink's); it must exceed the job's checkpoint timing
// (checked when the source opens).
func TransactionTimeout(d time.Duration) Opt { return opt{func(c *cfg) { c.txnTimeout = d }} }

// OnOutOfRange sets what happens when a partition's position is no longer
// in the log (default ResetToEarliest).
func OnOutOfRange(p OutOfRangePolicy) Opt { return opt{func(c *cfg) { c.outOfRange = p }} }

// MaxPollRecords bounds the records one Poll emits (default 10000).
func MaxPollRecords(n int) Opt { return opt{func(c *cfg) { c.maxPoll = n }} }

// ClientOpts adds options to the source's kgo clients (TLS, SASL, fetch
// sizes). An option that sets the isolation level to read_uncommitted is
// refused when the source opens (ErrReadUncommitted); consumer-group and
// topic options are the source's own and must not be given.
func ClientOpts(opts ...kgo.Opt) Opt {
	return opt{func(c *cfg) { c.clientOpts = append(c.clientOpts, opts...) }}
}

// Logger sets the logger (default the operator's).
func Logger(l *zap.Logger) Opt { return opt{func(c *cfg) { c.logger = l }} }

// offsetKind says how an Offset is found.
type offsetKind uint8

const (
	offsetEarliest offsetKind = iota
	offsetLatest
	offsetTimestamp
	offsetCommitted
	offsetExact
)

func (k offsetKind) String() string {
	return [...]string{"earliest", "latest", "timestamp", "committed", "offsets"}[k]
}

// Offset says where a source starts (StartAt) or stops (StopAt) reading a
// partition.
type Offset struct {
	kind     offsetKind
	ts       time.Time
	offsets  map[string]map[int32]int64
	fallback *Offset
}

// Earliest is each partition's log start.
func Earliest() Offset { return Offset{kind: offsetEarliest} }

// Latest is each partition's last stable offset (read_committed's end of
// the log) when the source first reads it.
func Latest() Offset { return Offset{kind: offsetLatest} }

// AtTimestamp is each partition's first offset whose record timestamp is
// at or after t (the log end if there is none).
func AtTimestamp(t time.Time) Offset { return Offset{kind: offsetTimestamp, ts: t} }

// Committed (StartAt only) is the offsets the consumer group (Group)
// committed; a partition without one starts at fallback.
func Committed(fallback Offset) Offset {
	f := fallback
	return Offset{kind: offsetCommitted, fallback: &f}
}

// AtOffsets gives each partition's offset (topic, partition, offset). At
// StartAt a partition missing from the map starts at the earliest offset;
// at StopAt it is read to its latest.
func AtOffsets(m map[string]map[int32]int64) Offset {
	c := make(map[string]map[int32]int64, len(m))
	for t, ps := range m {
		c[t] = maps.Clone(ps)
	}
	return Offset{kind: offsetExact, offsets: c}
}

// String names the offset, for logs and errors.
func (o Offset) String() string {
	switch o.kind {
	case offsetTimestamp:
		return "timestamp " + o.ts.UTC().Format(time.RFC3339Nano)
	case offsetCommitted:
		return "committed (fallback " + o.fallback.String() + ")"
	}
	return o.kind.String()
}

// validate checks the options.
func (c *cfg) validate() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: kafka source: %s", ErrInvalidConfig, fmt.Sprintf(f, a...))
	}
	switch {
	case len(c.brokers) == 0:
		return bad("no brokers")
	case len(c.topics) == 0 && c.regex == "":
		return bad("no topics: give Topics or TopicRegex")
	case len(c.topics) > 0 && c.regex != "":
		return bad("Topics and TopicRegex are exclusive")
	case slices.Contains(c.topics, ""):
		return bad("an empty topic name")
	case c.discovery <= 0:
		return bad("discovery interval %v <= 0", c.discovery)
	case c.txnTimeout <= 0:
		return bad("transaction timeout %v <= 0", c.txnTimeout)
	case c.maxPoll < 1:
		return bad("max poll records %d < 1", c.maxPoll)
	case c.outOfRange > FailOnOutOfRange:
		return bad("unknown out-of-range policy %d", c.outOfRange)
	case c.start.kind == offsetCommitted && c.group == "":
		return bad("StartAt(Committed(...)) needs a Group")
	case c.start.kind == offsetCommitted && c.start.fallback.kind == offsetCommitted:
		return bad("Committed's fallback cannot be Committed")
	}
	if c.stop != nil {
		switch c.stop.kind {
		case offsetEarliest, offsetCommitted:
			return bad("StopAt(%s): stop at Latest(), AtTimestamp or AtOffsets", c.stop)
		}
	}
	if c.regex != "" {
		re, err := regexp.Compile("^(?:" + c.regex + ")$")
		if err != nil {
			return bad("topic regex %q: %v", c.regex, err)
		}
		c.re = re
	}
	if c.dlqTopic == "" {
		switch {
		case c.group != "":
			c.dlqTopic = c.group + "-dlq"
		case len(c.topics) > 0:
			c.dlqTopic = c.topics[0] + "-dlq"
		default:
			return bad("TopicRegex without Group: give DeadLetterTopic")
		}
	}
	return nil
}
