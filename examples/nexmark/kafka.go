package nexmark

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// WriteToKafka writes the generator's events 0 to cfg.Events-1 (which must
// be bounded) to topic as JSON values (MarshalEvent), each with its event
// time as the record timestamp, creating the topic when missing
// (partitions < 1: the broker's default). It returns once every record is
// acknowledged. progress, when set, is called with the count written so far
// every 100000 events.
func WriteToKafka(ctx context.Context, brokers []string, topic string, partitions int32, g *Generator, progress func(written int64)) error {
	n := g.Config().Events
	if n <= 0 {
		return fmt.Errorf("nexmark: generate needs a bounded number of events, got %d", n)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		return fmt.Errorf("nexmark: kafka client: %w", err)
	}
	defer cl.Close()
	if partitions < 1 {
		partitions = -1
	}
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("nexmark: create topic %q: %w", topic, err)
	}
	failed := make(chan error, 1)
	for i := range n {
		if i%100_000 == 0 && i > 0 && progress != nil {
			progress(i)
		}
		e := g.Event(i)
		v, err := MarshalEvent(e)
		if err != nil {
			return err
		}
		cl.Produce(ctx, &kgo.Record{Topic: topic, Value: v, Timestamp: time.UnixMilli(e.Time())}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case failed <- err:
				default:
				}
			}
		})
		select {
		case err := <-failed:
			return fmt.Errorf("nexmark: produce event %d: %w", i, err)
		default:
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("nexmark: flush: %w", err)
	}
	select {
	case err := <-failed:
		return fmt.Errorf("nexmark: produce: %w", err)
	default:
	}
	if progress != nil {
		progress(n)
	}
	return nil
}
