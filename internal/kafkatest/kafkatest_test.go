package kafkatest_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/weirstream/weir/internal/kafkatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), kafkatest.DefaultTimeout)
	t.Cleanup(cancel)
	return ctx
}

func produceSync(ctx context.Context, t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func TestProducedRecordsAreConsumedInOrder(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "lines", 1, nil)
	ctx := ctxT(t)

	prod := env.Client(t, kgo.DefaultProduceTopic("lines"))
	const n = 100
	for i := range n {
		produceSync(ctx, t, prod, kgo.StringRecord(strconv.Itoa(i)))
	}

	cons := env.Client(t, kgo.ConsumeTopics("lines"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []string
	for len(got) < n {
		fs := cons.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("poll: %v (got %d of %d)", err, len(got), n)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	for i, v := range got {
		if v != strconv.Itoa(i) {
			t.Fatalf("record %d = %q, want %q", i, v, strconv.Itoa(i))
		}
	}
}

// txnProducer returns a transactional client producing to topic.
func txnProducer(t *testing.T, env *kafkatest.Env, topic, txnID string) *kgo.Client {
	return env.Client(t,
		kgo.DefaultProduceTopic(topic),
		kgo.TransactionalID(txnID),
		kgo.TransactionTimeout(time.Minute),
	)
}

func runTxn(ctx context.Context, t *testing.T, cl *kgo.Client, commit bool, values ...string) {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("begin: %v", err)
	}
	for _, v := range values {
		// Round-robin over partitions via nil keys would be random;
		// a key picks the partition deterministically.
		produceSync(ctx, t, cl, &kgo.Record{Key: []byte(v), Value: []byte(v)})
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("end transaction (commit=%v): %v", commit, err)
	}
}

func values(recs []*kgo.Record) map[string]int {
	m := make(map[string]int)
	for _, r := range recs {
		m[string(r.Value)]++
	}
	return m
}

func TestReadCommittedReturnsExactlyTheCommittedRecords(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "out", 3, nil)
	ctx := ctxT(t)

	txn := txnProducer(t, env, "out", "committer")
	runTxn(ctx, t, txn, true, "c1", "c2", "c3", "c4")
	runTxn(ctx, t, txn, false, "a1", "a2", "a3")
	plain := env.Client(t, kgo.DefaultProduceTopic("out"))
	produceSync(ctx, t, plain, kgo.StringRecord("p1"))
	// The last thing in each touched partition is an abort marker: the
	// reader must count it as a position or it would never finish.
	runTxn(ctx, t, txn, false, "a4", "a5", "a6", "a7", "a8")

	got := values(env.ReadCommitted(t, "out"))
	want := map[string]int{"c1": 1, "c2": 1, "c3": 1, "c4": 1, "p1": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("read committed = %v, want %v", got, want)
	}
}

func TestReadCommittedStopsAtAnOpenTransaction(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "out", 1, nil)
	ctx := ctxT(t)

	txn := txnProducer(t, env, "out", "committer")
	runTxn(ctx, t, txn, true, "before")

	open := txnProducer(t, env, "out", "open")
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produceSync(ctx, t, open, kgo.StringRecord("pending"))
	// Committed after the open transaction began: behind the last stable
	// offset, so not visible yet.
	runTxn(ctx, t, txn, true, "after")

	got := values(env.ReadCommitted(t, "out"))
	if want := map[string]int{"before": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("with an open transaction, read committed = %v, want %v", got, want)
	}

	if err := open.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	got = values(env.ReadCommitted(t, "out"))
	if want := map[string]int{"before": 1, "pending": 1, "after": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after commit, read committed = %v, want %v", got, want)
	}
}

// TestReadCommittedFinishesPastAnAbortedTailBelowTheStableOffset: the
// records right below the last stable offset listed at the start belong to
// a transaction aborted after another began (its marker lies past that
// offset, behind the other's records), so they are never delivered. Once
// the other transaction ends, the read must finish, with neither.
func TestReadCommittedFinishesPastAnAbortedTailBelowTheStableOffset(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "out", 1, nil)
	ctx := ctxT(t)

	aborted := txnProducer(t, env, "out", "aborted")
	if err := aborted.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produceSync(ctx, t, aborted, kgo.StringRecord("aborted"))
	open := txnProducer(t, env, "out", "open")
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produceSync(ctx, t, open, kgo.StringRecord("pending"))
	if err := aborted.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	// The last stable offset is now that of "pending", right after the
	// aborted record; the abort marker comes after "pending".
	type result struct {
		recs []*kgo.Record
		err  error
	}
	done := make(chan result, 1)
	go func() {
		recs, err := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "out")
		done <- result{recs, err}
	}()
	time.Sleep(500 * time.Millisecond) // the read has listed the offsets and is fetching
	if err := open.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || len(r.recs) != 0 {
			t.Fatalf("read committed = %v, %v; want no records (the aborted one, and one committed after the read started)", values(r.recs), r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("read committed did not finish 10 s after the transaction pinning its last stable offset ended")
	}
}

func TestReadCommittedOrdersByPartitionThenOffset(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "out", 4, nil)
	ctx := ctxT(t)

	cl := env.Client(t, kgo.DefaultProduceTopic("out"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i := range 40 {
		produceSync(ctx, t, cl, &kgo.Record{Partition: int32(i % 4), Value: []byte(strconv.Itoa(i))})
	}
	recs := env.ReadCommitted(t, "out")
	if len(recs) != 40 {
		t.Fatalf("read %d records, want 40", len(recs))
	}
	for i := 1; i < len(recs); i++ {
		a, b := recs[i-1], recs[i]
		if a.Partition > b.Partition || (a.Partition == b.Partition && a.Offset >= b.Offset) {
			t.Fatalf("records out of order at %d: p%d@%d then p%d@%d", i, a.Partition, a.Offset, b.Partition, b.Offset)
		}
	}
}

func TestReadCommittedOfEmptyTopicReturnsNothing(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "empty", 2, nil)
	if recs := env.ReadCommitted(t, "empty"); len(recs) != 0 {
		t.Fatalf("read %d records from an empty topic", len(recs))
	}
}

func TestReadCommittedOfUnknownTopicFails(t *testing.T) {
	env := kafkatest.New(t)
	_, err := kafkatest.ReadCommitted(ctxT(t), []string{env.Addr}, "no-such-topic")
	if !errors.Is(err, kafkatest.ErrUnknownTopic) {
		t.Fatalf("err = %v, want ErrUnknownTopic", err)
	}
}
