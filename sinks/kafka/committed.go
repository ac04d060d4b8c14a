package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/kafkatxn/committed"
)

// ReadCommitted reads topic exactly as a read_committed consumer sees it, up
// to the last stable offsets listed when it starts, and returns the
// committed data records in partition, then offset order: the independent
// check of a sink's exactly-once output. seeds are the bootstrap brokers;
// opts are added to the reading client (TLS, SASL), but must not change the
// isolation level or the partitions read.
func ReadCommitted(ctx context.Context, seeds []string, topic string, opts ...kgo.Opt) ([]*kgo.Record, error) {
	return committed.Read(ctx, seeds, topic, opts...)
}
