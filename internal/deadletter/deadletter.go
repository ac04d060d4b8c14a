// Package deadletter owns the dead-letter path both Kafka sources share
// (the share-group source and the partition source): the copy of a poison
// record with its reason and origin in headers, and its write through the
// source's (transactional) writer, logged. It knows no operator and no
// runtime; neither source imports the other (docs/architecture.md).
package deadletter

import (
	"context"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Headers of a dead-lettered record.
const (
	HeaderError         = "weir.error"
	HeaderDeliveryCount = "weir.delivery.count"
	HeaderTopic         = "weir.source.topic"
	HeaderPartition     = "weir.source.partition"
	HeaderOffset        = "weir.source.offset"
)

// Record copies r for the dead-letter topic, with the reason and r's
// origin in headers (its own headers kept first).
func Record(r *kgo.Record, topic, reason string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: append(append([]kgo.RecordHeader(nil), r.Headers...),
		kgo.RecordHeader{Key: HeaderError, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDeliveryCount, Value: []byte(strconv.Itoa(int(r.DeliveryCount())))},
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: HeaderOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))})}
}

// Writer writes a record, in the writer's current transaction if it has
// one (kafkatxn.TxnWriter).
type Writer interface {
	Write(ctx context.Context, r *kgo.Record) error
}

// Send copies r to topic through w with cause as its reason (and the
// job's last task failure, restartCause, if any), logging it at warn level.
func Send(ctx context.Context, w Writer, log *zap.Logger, r *kgo.Record, topic string, cause error, restartCause string) error {
	reason := cause.Error()
	if restartCause != "" {
		reason += "; last task failure: " + restartCause
	}
	d := Record(r, topic, reason)
	log.Warn("record sent to the dead-letter topic", zap.String("topic", r.Topic), zap.Int32("partition", r.Partition),
		zap.Int64("offset", r.Offset), zap.String("dlq", topic), zap.String("reason", reason))
	if err := w.Write(ctx, d); err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	return nil
}
