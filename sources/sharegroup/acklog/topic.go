package acklog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// ErrBadTopic is wrapped by the errors about an ack-log topic that cannot
// serve: an illegal name, a missing topic, or more than one partition (the
// total order of markers, on which the conflict check rests, needs exactly
// one).
var ErrBadTopic = errors.New("bad ack-log topic")

// TopicPrefix starts every topic name TopicFor returns.
const TopicPrefix = "__weir-acklog-"

// maxTopicLen is Kafka's limit on topic name length.
const maxTopicLen = 249

// TopicFor returns the default ack-log topic of a share group:
// TopicPrefix followed by the group name, escaped so that the result is a
// legal Kafka topic name and distinct groups get distinct topics. Letters,
// digits and '-' are kept; every other byte (including '_' and '.', which
// Kafka treats as colliding) becomes '_' and two upper-case hex digits. A
// name longer than Kafka's 249 characters is cut and ends in '-' and 16 hex
// digits of the group's SHA-256.
func TopicFor(group string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.WriteString(TopicPrefix)
	for i := 0; i < len(group); i++ {
		c := group[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-':
			b.WriteByte(c)
		default:
			b.WriteByte('_')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0x0f])
		}
	}
	name := b.String()
	if len(name) <= maxTopicLen {
		return name
	}
	sum := sha256.Sum256([]byte(group))
	suffix := "-" + hex.EncodeToString(sum[:8])
	return name[:maxTopicLen-len(suffix)] + suffix
}

// validTopic reports why name is not a legal Kafka topic name, or nil.
func validTopic(name string) error {
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%w: illegal topic name %q", ErrBadTopic, name)
	}
	if len(name) > maxTopicLen {
		return fmt.Errorf("%w: topic name is %d characters, Kafka allows %d", ErrBadTopic, len(name), maxTopicLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%w: topic name %q has illegal character %q", ErrBadTopic, name, c)
		}
	}
	return nil
}

// DeleteRetention is the delete.retention.ms EnsureTopic gives an ack-log
// it creates: how long compaction keeps a tombstone after its marker is
// gone. The savepoint restore check judges a later committed
// acknowledgement from its marker or, once the marker was collected, from
// its tombstone (which names the marker's offset and outcome); when both
// are gone the check no longer sees it, and a savepoint older than that
// may pass. Kafka's default (1 day) would let a savepoint kept over a long
// weekend through; 7 days is the horizon Kafka gives records by default
// (retention.ms), at the cost of a week of small tombstones in the ack-log
// (read once when a source opens its index).
const DeleteRetention = 7 * 24 * time.Hour

// ErrShortDeleteRetention is wrapped by CheckDeleteRetention's error about
// an ack-log whose tombstones compaction removes sooner than
// DeleteRetention.
var ErrShortDeleteRetention = errors.New("ack-log delete.retention.ms shorter than Weir's")

// EnsureTopic makes sure the ack-log topic exists with exactly one
// partition. A missing topic is created with one partition, the broker's
// default replication factor, cleanup.policy=compact (markers are keyed
// per marker and deleted by tombstones) and delete.retention.ms of
// DeleteRetention. An existing topic with more than one partition is
// refused with an error wrapping ErrBadTopic; its other configs are left
// alone (CheckDeleteRetention says whether its tombstones last long
// enough). It is idempotent and safe to call concurrently.
func EnsureTopic(ctx context.Context, adm *kadm.Client, topic string) error {
	if err := validTopic(topic); err != nil {
		return err
	}
	exists, err := checkTopic(ctx, adm, topic)
	if err != nil || exists {
		return err
	}
	resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact"),
		"delete.retention.ms": kadm.StringPtr(strconv.FormatInt(DeleteRetention.Milliseconds(), 10))}, topic)
	if err == nil {
		err = resp.Err
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		// Created concurrently: check what was created.
		exists, err := checkTopic(ctx, adm, topic)
		if err == nil && !exists {
			err = fmt.Errorf("topic %q reported as existing but not in metadata", topic)
		}
		return err
	default:
		if resp.ErrMessage != "" {
			return fmt.Errorf("create topic %q: %w (%s)", topic, err, resp.ErrMessage)
		}
		return fmt.Errorf("create topic %q: %w", topic, err)
	}
}

// checkTopic reports whether topic exists, and an error wrapping ErrBadTopic
// if it exists with a partition count other than one.
func checkTopic(ctx context.Context, adm *kadm.Client, topic string) (bool, error) {
	n, err := partitionCount(ctx, adm, topic)
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return false, nil
	case err != nil:
		return false, err
	case n != 1:
		return true, fmt.Errorf("%w: topic %q has %d partitions, the ack-log needs exactly 1 (markers must be totally ordered)", ErrBadTopic, topic, n)
	}
	return true, nil
}

// partitionCount returns the number of partitions of topic, or an error
// wrapping kerr.UnknownTopicOrPartition when it does not exist. It bypasses
// kadm's metadata cache (which may still say "unknown" right after a create,
// or hold an old partition count) by asking for authorized operations.
func partitionCount(ctx context.Context, adm *kadm.Client, topic string) (int, error) {
	tds, err := adm.ListTopics(kadm.WithAuthorizedOps(ctx), topic)
	if err != nil {
		return 0, fmt.Errorf("describe topic %q: %w", topic, err)
	}
	td, ok := tds[topic]
	if !ok {
		return 0, fmt.Errorf("describe topic %q: %w", topic, kerr.UnknownTopicOrPartition)
	}
	if td.Err != nil {
		return 0, fmt.Errorf("describe topic %q: %w", topic, td.Err)
	}
	return len(td.Partitions), nil
}

// CheckDeleteRetention reads the ack-log topic's delete.retention.ms
// (DescribeConfigs) and returns it, with an error wrapping
// ErrShortDeleteRetention when it is shorter than DeleteRetention (an
// ack-log created by an older Weir, by hand, or altered since): the
// savepoint restore check then sees later acknowledgements only that far
// back. A source warns and runs on: the setting bounds that check's
// horizon, not the exactly-once of the running job.
func CheckDeleteRetention(ctx context.Context, adm *kadm.Client, topic string) (time.Duration, error) {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("describe configs of %q: %w", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return 0, fmt.Errorf("describe configs of %q: %w", topic, err)
	}
	for _, c := range rc.Configs {
		if c.Key != "delete.retention.ms" || c.Value == nil {
			continue
		}
		ms, err := strconv.ParseInt(c.MaybeValue(), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("topic %q: delete.retention.ms %q: %w", topic, c.MaybeValue(), err)
		}
		d := time.Duration(ms) * time.Millisecond
		if d < DeleteRetention {
			return d, fmt.Errorf("%w: topic %q keeps tombstones %v, Weir needs %v: the savepoint restore check sees later acknowledgements only that far back, so an older savepoint may pass it; set it with kafka-configs --alter --entity-type topics --entity-name %s --add-config delete.retention.ms=%d",
				ErrShortDeleteRetention, topic, d, DeleteRetention, topic, DeleteRetention.Milliseconds())
		}
		return d, nil
	}
	return 0, fmt.Errorf("topic %q: the broker reports no delete.retention.ms", topic)
}
