// Package committed reads Kafka topics exactly as read_committed consumers
// see them, up to the last stable offsets: the independent check of
// exactly-once output that tests, the demo and users run.
//
// It owns nothing else and imports no Weir package.
package committed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrUnknownTopic is returned by ReadCommitted for a topic that does not exist.
var ErrUnknownTopic = errors.New("unknown topic")

// Read reads topic from its log start offsets up to the last stable
// offsets (the read_committed end offsets) listed when it starts, and returns
// the committed data records in partition order, then offset order: exactly
// what a read_committed consumer sees, no control records, no aborted
// records, nothing produced or committed after the call started. Records of a
// transaction still open when it starts, and everything after them in their
// partition, are not read: the last stable offset stops before them.
//
// It reads until every partition's position reaches its last stable offset,
// counting transaction markers (control records) as positions, and a record
// at or past that offset as reaching it, so it neither stops early nor
// waits for records that will never come. (Aborted records right below the
// offset, whose abort marker is past it, are never delivered: the marker,
// or anything after it, is, once the transaction that pinned the offset
// ended.) It gives up with
// ctx's error. (On a compacted topic whose last record below the last stable
// offset was compacted away, it cannot tell it is done and runs into ctx.)
//
// seeds are the bootstrap brokers; opts are added to the reading client
// (e.g. SASL), but must not change the isolation level or the partitions read.
func Read(ctx context.Context, seeds []string, topic string, opts ...kgo.Opt) ([]*kgo.Record, error) {
	adm, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("read committed %q: new client: %w", topic, err)
	}
	defer adm.Close()
	admin := kadm.NewClient(adm)

	starts, err := listOffsets(ctx, topic, admin.ListStartOffsets)
	if err != nil {
		return nil, fmt.Errorf("read committed %q: list start offsets: %w", topic, err)
	}
	ends, err := listOffsets(ctx, topic, admin.ListCommittedOffsets)
	if err != nil {
		return nil, fmt.Errorf("read committed %q: list last stable offsets: %w", topic, err)
	}

	// Only partitions with something below their last stable offset.
	from := make(map[int32]kgo.Offset)
	end := make(map[int32]int64)
	for p, lso := range ends {
		start := starts[p]
		if start < lso {
			from[p] = kgo.NewOffset().At(start)
			end[p] = lso
		}
	}
	if len(from) == 0 {
		return nil, nil
	}

	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Commit and abort markers are delivered so the position can
		// reach a last stable offset that sits right after one.
		kgo.KeepControlRecords(),
	)...)...)
	if err != nil {
		return nil, fmt.Errorf("read committed %q: new consumer: %w", topic, err)
	}
	defer cl.Close()

	pos := make(map[int32]int64, len(from))
	for p := range from {
		pos[p] = starts[p]
	}
	var recs []*kgo.Record
	remaining := len(from)
	for remaining > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read committed %q: %d partitions not read to their last stable offset (positions %v, want %v): %w",
				topic, remaining, pos, end, err)
		}
		for _, fe := range fs.Errors() {
			if errors.Is(fe.Err, context.Canceled) || errors.Is(fe.Err, context.DeadlineExceeded) {
				continue // reported through ctx.Err above
			}
			return nil, fmt.Errorf("read committed %q: fetch partition %d: %w", fe.Topic, fe.Partition, fe.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			lso, ok := end[r.Partition]
			if ok && r.Offset >= lso && pos[r.Partition] < lso {
				// A partition's records come in offset order, so all
				// below lso were delivered or dropped as aborted: an
				// aborted tail right below lso whose marker lies past it
				// (its transaction ended after the offsets were listed,
				// another one still open then) is never delivered.
				pos[r.Partition] = lso
				remaining--
				return
			}
			if !ok || r.Offset >= lso || r.Offset < pos[r.Partition] {
				return // past the snapshot, or a redelivery
			}
			pos[r.Partition] = r.Offset + 1
			if pos[r.Partition] == lso {
				remaining--
			}
			if !r.Attrs.IsControl() {
				recs = append(recs, r)
			}
		})
	}
	slices.SortStableFunc(recs, func(a, b *kgo.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	return recs, nil
}

// listOffsets returns partition -> offset for topic, or an error if any
// partition (or the topic) failed.
func listOffsets(ctx context.Context, topic string, list func(context.Context, ...string) (kadm.ListedOffsets, error)) (map[int32]int64, error) {
	los, err := list(ctx, topic)
	if err != nil {
		return nil, err
	}
	ps, ok := los[topic]
	if !ok || len(ps) == 0 {
		return nil, ErrUnknownTopic
	}
	out := make(map[int32]int64, len(ps))
	for p, lo := range ps {
		if lo.Err != nil {
			if p < 0 {
				return nil, fmt.Errorf("%w: %w", ErrUnknownTopic, lo.Err)
			}
			return nil, fmt.Errorf("partition %d: %w", p, lo.Err)
		}
		out[p] = lo.Offset
	}
	return out, nil
}

// Reached reports whether topic holds at least n committed records. It first
// sums the last stable offsets (an upper bound: transaction markers take
// offsets too) and reads the records only when that bound reaches n, so
// polling it while output grows stays cheap.
func Reached(ctx context.Context, seeds []string, topic string, n int, opts ...kgo.Opt) (bool, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	if err != nil {
		return false, err
	}
	defer cl.Close()
	ends, err := listOffsets(ctx, topic, kadm.NewClient(cl).ListCommittedOffsets)
	if err != nil {
		return false, err
	}
	var bound int64
	for _, o := range ends {
		bound += o
	}
	if bound < int64(n) {
		return false, nil
	}
	recs, err := Read(ctx, seeds, topic, opts...)
	return len(recs) >= n, err
}
