// Package kafkatest owns the test harness around Weir's embedded broker: an
// in-process broker per test on 127.0.0.1 with a free port, clients that are
// closed on cleanup, topic creation, and exact read_committed reads of a
// topic up to its last stable offsets.
//
// It must not mock Kafka: everything goes through the real protocol to a real
// (embedded) broker, started by internal/broker with the same defaults as
// `streamctl broker`. It must not import any Weir package except
// internal/broker and sinks/kafka/committed, so every package can use it in
// its tests.
package kafkatest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/kafkatxn/committed"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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
var ErrUnknownTopic = committed.ErrUnknownTopic

// ReadCommitted is committed.Read: exactly what a read_committed
// consumer sees of topic, up to the last stable offsets listed at the start.
func ReadCommitted(ctx context.Context, seeds []string, topic string, opts ...kgo.Opt) ([]*kgo.Record, error) {
	return committed.Read(ctx, seeds, topic, opts...)
}

// WriteTxn writes recs (each with its Topic set) in one transaction of
// transactional id txnID (WriteTxn, the package function) and commits it, or
// aborts it when commit is false. It fails the test on error.
func (e *Env) WriteTxn(t testing.TB, txnID string, commit bool, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	if err := WriteTxn(ctx, []string{e.Addr}, txnID, commit, recs...); err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
}

// OpenTxn begins a transaction of transactional id txnID, writes recs into
// it and leaves it open (BeginTxn). end commits it (true) or aborts it
// (false); call it once, from the test's goroutine. Both fail the test on
// error.
func (e *Env) OpenTxn(t testing.TB, txnID string, recs ...*kgo.Record) (end func(commit bool)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	x, err := BeginTxn(ctx, []string{e.Addr}, txnID, recs...)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	return func(commit bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
		defer cancel()
		if err := x.End(ctx, commit); err != nil {
			t.Fatalf("kafkatest: %v", err)
		}
	}
}

// WriteTxn writes recs (each with its Topic set) in one transaction of
// transactional id txnID and commits it, or aborts it when commit is false
// (BeginTxn, then End).
func WriteTxn(ctx context.Context, seeds []string, txnID string, commit bool, recs ...*kgo.Record) error {
	x, err := BeginTxn(ctx, seeds, txnID, recs...)
	if err != nil {
		return err
	}
	return x.End(ctx, commit)
}

// Txn is an open transaction of test input (BeginTxn).
type Txn struct {
	cl *kgo.Client
	id string
}

// BeginTxn begins a transaction of transactional id txnID on a client made
// for it, writes recs (each with its Topic set) into it and leaves it open
// (timeout two minutes): read_committed readers, and share groups reading
// read_committed, stop at its first record on each partition until it ends.
func BeginTxn(ctx context.Context, seeds []string, txnID string, recs ...*kgo.Record) (*Txn, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.TransactionalID(txnID), kgo.TransactionTimeout(2*time.Minute),
		kgo.DisableClientMetrics())
	if err != nil {
		return nil, fmt.Errorf("transactional client %q: %w", txnID, err)
	}
	if err := cl.BeginTransaction(); err != nil {
		cl.Close()
		return nil, fmt.Errorf("transaction of %q: begin: %w", txnID, err)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		cl.Close()
		return nil, fmt.Errorf("transaction of %q: produce: %w", txnID, err)
	}
	return &Txn{cl: cl, id: txnID}, nil
}

// End commits (commit) or aborts the transaction and closes its client. It
// ends it with a raw EndTxn request carrying the producer id and epoch, as
// Weir's writer does (kgo's EndTransaction has been seen to abort a
// commit), so a committed transaction is committed.
func (x *Txn) End(ctx context.Context, commit bool) error {
	defer x.cl.Close()
	pid, epoch, err := x.cl.ProducerID(ctx)
	if err != nil {
		return fmt.Errorf("transaction of %q: producer id: %w", x.id, err)
	}
	req := kmsg.NewPtrEndTxnRequest()
	req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = x.id, pid, epoch, commit
	resp, err := req.RequestWith(ctx, x.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("transaction of %q: end (commit %v): %w", x.id, commit, err)
	}
	return nil
}

// Unfinished lists what the broker still holds open: the transactional ids
// in Ongoing, PrepareCommit or PrepareAbort, and each partition of topics
// whose last stable offset is below its high watermark (a read_committed
// reader does not see all of it yet). Empty means every transaction ended.
func Unfinished(ctx context.Context, adm *kadm.Client, topics ...string) ([]string, error) {
	txns, err := adm.ListTransactions(ctx, nil, []string{"Ongoing", "PrepareCommit", "PrepareAbort"})
	if err != nil {
		return nil, fmt.Errorf("list transactions: %w", err)
	}
	var open []string
	for _, id := range txns.TransactionalIDs() {
		open = append(open, "transaction "+id)
	}
	for _, topic := range topics {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return nil, fmt.Errorf("high watermarks of %s: %w", topic, err)
		}
		stable, err := adm.ListCommittedOffsets(ctx, topic)
		if err != nil {
			return nil, fmt.Errorf("last stable offsets of %s: %w", topic, err)
		}
		ends.Each(func(o kadm.ListedOffset) {
			if s, ok := stable.Lookup(topic, o.Partition); !ok || s.Offset != o.Offset {
				open = append(open, fmt.Sprintf("%s[%d]: last stable offset %d < high watermark %d", topic, o.Partition, s.Offset, o.Offset))
			}
		})
	}
	return open, nil
}

// RequireNothingOpen fails the test unless Unfinished finds nothing open:
// no transaction, and every partition of topics readable read_committed up
// to its high watermark.
func (e *Env) RequireNothingOpen(t testing.TB, topics ...string) {
	t.Helper()
	open, err := Unfinished(t.Context(), e.Admin(t), topics...)
	if err != nil {
		t.Fatal(err)
	}
	if len(open) > 0 {
		t.Fatalf("still open at the broker: %v", open)
	}
}
