// Package kafkatest owns the test harness around Weir's embedded broker: an
// in-process broker per test on 127.0.0.1 with a free port, clients that are
// closed on cleanup, topic creation, and exact read_committed reads of a
// topic up to its last stable offsets.
//
// It must not mock Kafka: everything goes through the real protocol to a real
// (embedded) broker, started by internal/broker with the same defaults as
// `streamctl broker`. It must not import any Weir package except
// internal/broker, so every package can use it in its tests.
package kafkatest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/broker"
)

// DefaultTimeout bounds each helper call made through an Env.
const DefaultTimeout = 30 * time.Second

// Env is one embedded broker started for one test.
type Env struct {
	// Addr is the broker's host:port, for kgo.SeedBrokers.
	Addr string
	// Broker is the running broker; it is closed on cleanup.
	Broker *broker.Broker
}

// New starts an in-process broker on 127.0.0.1 with a free port (options may
// override it) and closes it when the test and its subtests finish. It fails
// the test if the broker cannot start or fails to persist on close.
func New(t testing.TB, opts ...broker.Opt) *Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	opts = append([]broker.Opt{broker.Listen("127.0.0.1:0")}, opts...)
	b, err := broker.Start(ctx, opts...)
	if err != nil {
		t.Fatalf("kafkatest: start broker: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("kafkatest: close broker: %v", err)
		}
	})
	return &Env{Addr: b.Addr(), Broker: b}
}

// Client returns a kgo client seeded with the broker, closed on cleanup.
// Options are applied after the seed, so they may add to or override it.
func (e *Env) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.Addr)}, opts...)...)
	if err != nil {
		t.Fatalf("kafkatest: new client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Admin returns an admin client for the broker, closed on cleanup.
func (e *Env) Admin(t testing.TB) *kadm.Client {
	t.Helper()
	return kadm.NewClient(e.Client(t))
}

// CreateTopic creates a topic with the given partitions (-1 for the broker
// default) and topic configs (nil for none), and fails the test on error,
// including when the topic already exists.
func (e *Env) CreateTopic(t testing.TB, name string, partitions int32, configs map[string]*string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	resp, err := e.Admin(t).CreateTopic(ctx, partitions, 1, configs, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("kafkatest: create topic %q: %v", name, err)
	}
}

// ReadCommitted returns every record of topic visible to a read_committed
// reader when the call starts (see the package-level ReadCommitted), and
// fails the test on error.
func (e *Env) ReadCommitted(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	recs, err := ReadCommitted(ctx, []string{e.Addr}, topic)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	return recs
}

// ErrUnknownTopic is returned by ReadCommitted for a topic that does not exist.
var ErrUnknownTopic = errors.New("unknown topic")

// ReadCommitted reads topic from its log start offsets up to the last stable
// offsets (the read_committed end offsets) listed when it starts, and returns
// the committed data records in partition order, then offset order: exactly
// what a read_committed consumer sees, no control records, no aborted
// records, nothing produced or committed after the call started. Records of a
// transaction still open when it starts, and everything after them in their
// partition, are not read: the last stable offset stops before them.
//
// It reads until every partition's position reaches its last stable offset,
// counting transaction markers (control records) as positions, so it neither
// stops early nor waits for records that will never come. It gives up with
// ctx's error. (On a compacted topic whose last record below the last stable
// offset was compacted away, it cannot tell it is done and runs into ctx.)
//
// seeds are the bootstrap brokers; opts are added to the reading client
// (e.g. SASL), but must not change the isolation level or the partitions read.
func ReadCommitted(ctx context.Context, seeds []string, topic string, opts ...kgo.Opt) ([]*kgo.Record, error) {
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
