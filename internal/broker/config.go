package broker

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// ConfigDefault is one broker config Weir sets by default, with the reason.
type ConfigDefault struct {
	// Key is the broker config name, as in Apache Kafka.
	Key string
	// Value is the value Weir's embedded broker uses unless overridden.
	Value string
	// Kafka is Apache Kafka's (and kfake's) own default, for comparison.
	Kafka string
	// Why says why Weir changes (or keeps) it.
	Why string
}

// DefaultConfigs returns the broker configs the embedded broker starts with,
// each with Apache Kafka's default and the reason for Weir's value. They are
// chosen for developing share-group jobs on one machine. Config overrides
// them key by key.
//
// The returned slice is a fresh copy; changing it changes nothing.
func DefaultConfigs() []ConfigDefault {
	return []ConfigDefault{
		{
			Key: "share.record.lock.sweep.interval.ms", Value: "500", Kafka: "5000",
			Why: "how often expired acquisition locks are swept back to AVAILABLE; " +
				"500 ms puts an expired record back within half a second of expiry instead of up to 5 s later, " +
				"for the cost of one pass over the acquired records twice a second",
		},
		{
			Key: "group.share.heartbeat.interval.ms", Value: "1000", Kafka: "5000",
			Why: "share consumers learn a new assignment at their next heartbeat; " +
				"1 s means surviving members pick up a crashed member's partitions about a second after it is fenced",
		},
		{
			Key: "group.share.session.timeout.ms", Value: "10000", Kafka: "45000",
			Why: "a member that stops heartbeating (hung, partitioned) is fenced after this long, " +
				"which releases its records and reassigns its partitions; 10 s is still ten heartbeats " +
				"(a killed process is noticed at once: its connection closes and its records are released)",
		},
		{
			Key: "group.share.record.lock.duration.ms", Value: "30000", Kafka: "30000",
			Why: "kept at Kafka's default so jobs behave here as on Apache Kafka: lanes renew their locks, " +
				"crashes are handled by the connection close and the session timeout above, " +
				"and a shorter lock would make a slow checkpoint cycle lapse locks and burn the delivery count",
		},
		{
			Key: "group.share.partition.max.record.locks", Value: "10000", Kafka: "2000",
			Why: "caps the in-flight (acquired, not yet acknowledged) records per share partition; " +
				"exactly-once holds records until their checkpoint completes, so throughput per partition is " +
				"at most this cap per checkpoint cycle: 5x the default lets several lanes hold a full batch each",
		},
		{
			Key: "group.share.delivery.count.limit", Value: "10", Kafka: "5",
			Why: "every redelivery counts, including those caused by group churn: when a job restarts, its " +
				"lanes leave and join one by one and held records are released and acquired again, so a " +
				"record can burn several deliveries without ever failing; past the limit the broker archives " +
				"it. 10 leaves room for restarts; raise it on real clusters running exactly-once jobs too",
		},
	}
}

// defaultConfigMap returns DefaultConfigs as key -> value.
func defaultConfigMap() map[string]string {
	m := make(map[string]string)
	for _, d := range DefaultConfigs() {
		m[d.Key] = d.Value
	}
	return m
}

// configKind reports whether kfake accepts key as a broker config (its
// validBrokerConfigs at the pinned version) and whether the value must be an
// integer. An unknown key is refused at Start: kfake would store it silently
// and a typo would go unnoticed; a bad integer kfake would read as 0.
func configKind(key string) (known, numeric bool) {
	switch key {
	case "broker.id", "broker.rack", "compression.type", "log.dir",
		"log.message.timestamp.type", "sasl.enabled.mechanisms", "super.users":
		return true, false
	case "connections.max.reauth.ms",
		"default.replication.factor",
		"fetch.max.bytes",
		"max.incremental.fetch.session.cache.slots",
		"group.consumer.heartbeat.interval.ms",
		"group.consumer.session.timeout.ms",
		"group.max.size",
		"group.min.session.timeout.ms",
		"group.max.session.timeout.ms",
		"log.cleaner.backoff.ms",
		"transaction.max.timeout.ms",
		"transactional.id.expiration.ms",
		"log.retention.bytes",
		"log.retention.ms",
		"log.segment.bytes",
		"log.roll.ms",
		"message.max.bytes",
		"min.insync.replicas",
		"offsets.retention.minutes",
		"offset.retention.ms",
		"offsets.retention.check.interval.ms",
		"group.share.heartbeat.interval.ms",
		"group.share.session.timeout.ms",
		"group.share.delivery.count.limit",
		"group.share.record.lock.duration.ms",
		"share.record.lock.sweep.interval.ms",
		"group.share.partition.max.record.locks",
		"group.share.max.share.sessions",
		"group.share.max.size",
		"state.log.compact.bytes":
		return true, true
	}
	return false, false
}

// allConfigKeys lists every key configKind knows, for error messages.
func allConfigKeys() []string {
	return []string{
		"broker.id", "broker.rack", "compression.type", "connections.max.reauth.ms",
		"default.replication.factor", "fetch.max.bytes", "group.consumer.heartbeat.interval.ms",
		"group.consumer.session.timeout.ms", "group.max.session.timeout.ms", "group.max.size",
		"group.min.session.timeout.ms", "group.share.delivery.count.limit",
		"group.share.heartbeat.interval.ms", "group.share.max.share.sessions", "group.share.max.size",
		"group.share.partition.max.record.locks", "group.share.record.lock.duration.ms",
		"group.share.session.timeout.ms", "log.cleaner.backoff.ms", "log.dir",
		"log.message.timestamp.type", "log.retention.bytes", "log.retention.ms", "log.roll.ms",
		"log.segment.bytes", "max.incremental.fetch.session.cache.slots", "message.max.bytes",
		"min.insync.replicas", "offset.retention.ms", "offsets.retention.check.interval.ms",
		"offsets.retention.minutes", "sasl.enabled.mechanisms", "share.record.lock.sweep.interval.ms",
		"state.log.compact.bytes", "super.users", "transaction.max.timeout.ms",
		"transactional.id.expiration.ms",
	}
}

// KnownConfigs returns the broker config keys Config accepts, sorted.
func KnownConfigs() []string {
	ks := allConfigKeys()
	slices.Sort(ks)
	return ks
}

// ParseConfig parses one "key=value" flag value. The value may be empty
// (which resets the key to kfake's default) and may itself contain '='.
func ParseConfig(kv string) (key, value string, err error) {
	key, value, ok := strings.Cut(kv, "=")
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		return "", "", fmt.Errorf("%w: %q: want key=value", ErrInvalidConfig, kv)
	}
	return key, value, nil
}

// validateConfigs checks every key is known and every numeric value parses.
func validateConfigs(cfgs map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(cfgs)) {
		v := cfgs[k]
		known, numeric := configKind(k)
		if !known {
			return fmt.Errorf("%w: unknown broker config %q (known: %s)", ErrInvalidConfig, k, strings.Join(KnownConfigs(), ", "))
		}
		if v != "" && numeric {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("%w: %s=%q: not an integer", ErrInvalidConfig, k, v)
			}
			if lo, hi := configRange(k); n < lo || (hi > 0 && n > hi) {
				return fmt.Errorf("%w: %s=%d out of range %s", ErrInvalidConfig, k, n, fmtRange(lo, hi))
			}
		}
	}
	return nil
}

// configRange returns the valid range of a numeric config (hi 0: no upper
// bound): Apache Kafka's where it documents one (the share-group limits),
// -1 for "unlimited" retention settings, at least 1 for durations, sizes
// and counts that cannot be zero, else at least 0.
func configRange(key string) (lo, hi int64) {
	switch key {
	case "group.share.delivery.count.limit":
		return 2, 10
	case "group.share.record.lock.duration.ms":
		return 1000, 3600000
	case "log.retention.bytes", "log.retention.ms":
		return -1, 0
	case "broker.id", "connections.max.reauth.ms", "log.cleaner.backoff.ms", "max.incremental.fetch.session.cache.slots":
		return 0, 0
	}
	return 1, 0
}

// fmtRange prints a range as "[lo, hi]" or "[lo, ...)".
func fmtRange(lo, hi int64) string {
	if hi > 0 {
		return fmt.Sprintf("[%d, %d]", lo, hi)
	}
	return fmt.Sprintf("[%d, ...)", lo)
}
