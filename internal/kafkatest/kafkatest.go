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
// transactional id txnID, on a client made for it, and commits it, or aborts
// it when commit is false. It fails the test on error. The transaction ends
// with a raw EndTxn request carrying the producer id and epoch (what Weir's
// writer does: kgo's EndTransaction has been seen to abort a commit), so a
// committed transaction is committed.
func (e *Env) WriteTxn(t testing.TB, txnID string, commit bool, recs ...*kgo.Record) {
	t.Helper()
	e.OpenTxn(t, txnID, recs...)(commit)
}

// OpenTxn begins a transaction of transactional id txnID on a client made
// for it, writes recs (each with its Topic set) into it and leaves it open
// (timeout two minutes): read_committed readers and share groups reading
// read_committed stop at its first record until it ends. end commits it
// (true) or aborts it (false) and closes the client; call it once. Both fail
// the test on error.
func (e *Env) OpenTxn(t testing.TB, txnID string, recs ...*kgo.Record) (end func(commit bool)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.Addr), kgo.TransactionalID(txnID), kgo.TransactionTimeout(2*time.Minute),
		kgo.DisableClientMetrics())
	if err != nil {
		t.Fatalf("kafkatest: transactional client %q: %v", txnID, err)
	}
	fail := func(what string, err error) {
		t.Helper()
		cl.Close()
		t.Fatalf("kafkatest: transaction of %q: %s: %v", txnID, what, err)
	}
	if err := cl.BeginTransaction(); err != nil {
		fail("begin", err)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		fail("produce", err)
	}
	return func(commit bool) {
		t.Helper()
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
		defer cancel()
		pid, epoch, err := cl.ProducerID(ctx)
		if err != nil {
			fail("producer id", err)
		}
		req := kmsg.NewPtrEndTxnRequest()
		req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = txnID, pid, epoch, commit
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			fail(fmt.Sprintf("end (commit %v)", commit), err)
		}
	}
}
