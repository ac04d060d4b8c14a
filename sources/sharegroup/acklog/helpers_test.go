package acklog

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// tp0 is the share partition most tests acknowledge offsets of.
var tp0 = TopicPartition{Topic: "input", Partition: 0}

// fixture is one in-process kfake broker for one test.
type fixture struct {
	t     testing.TB
	c     *kfake.Cluster
	seeds []string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &fixture{t: t, c: c, seeds: c.ListenAddrs()}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (f *fixture) client(opts ...kgo.Opt) *kgo.Client {
	f.t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(f.seeds...)}, opts...)...)
	if err != nil {
		f.t.Fatalf("client: %v", err)
	}
	f.t.Cleanup(cl.Close)
	return cl
}

func (f *fixture) admin() *kadm.Client { return kadm.NewClient(f.client()) }

// ackTopic creates an ack-log topic with EnsureTopic.
func (f *fixture) ackTopic(name string) string {
	f.t.Helper()
	if err := EnsureTopic(testCtx(f.t), f.admin(), name); err != nil {
		f.t.Fatalf("EnsureTopic(%q): %v", name, err)
	}
	return name
}

func (f *fixture) index(topic string) *Index {
	f.t.Helper()
	ix, err := NewIndex(testCtx(f.t), f.seeds, topic)
	if err != nil {
		f.t.Fatalf("NewIndex: %v", err)
	}
	f.t.Cleanup(ix.Close)
	return ix
}

// txnWriter is a transactional producer writing markers to one ack-log.
type txnWriter struct {
	f     *fixture
	cl    *kgo.Client
	id    string
	topic string
	pid   int64
}

func (f *fixture) writer(topic, txnID string) *txnWriter {
	f.t.Helper()
	cl := f.client(kgo.TransactionalID(txnID), kgo.TransactionTimeout(10*time.Second))
	pid, _, err := cl.ProducerID(testCtx(f.t))
	if err != nil {
		f.t.Fatalf("ProducerID(%s): %v", txnID, err)
	}
	return &txnWriter{f: f, cl: cl, id: txnID, topic: topic, pid: pid}
}

func (w *txnWriter) begin() {
	w.f.t.Helper()
	if err := w.cl.BeginTransaction(); err != nil {
		w.f.t.Fatalf("%s: begin: %v", w.id, err)
	}
}

// marker builds a marker of this writer's producer id for offsets of tp0.
func (w *txnWriter) marker(checkpoint uint64, rs ...Range) Marker {
	return Marker{
		Group: "g", Member: w.id, Checkpoint: checkpoint,
		TransactionalID: w.id, ProducerID: w.pid,
		Ranges:    map[TopicPartition][]Range{tp0: rs},
		CreatedAt: time.Now(),
	}
}

// write produces m (in the open transaction) and returns its entry.
func (w *txnWriter) write(m Marker) Entry {
	w.f.t.Helper()
	r := m.Record(w.topic)
	if err := w.cl.ProduceSync(testCtx(w.f.t), r).FirstErr(); err != nil {
		w.f.t.Fatalf("%s: produce marker: %v", w.id, err)
	}
	return Entry{Marker: m, Offset: r.Offset, Status: Open, ProducerEpoch: r.ProducerEpoch}
}

// end commits or aborts the open transaction.
func (w *txnWriter) end(commit bool) {
	w.f.t.Helper()
	try := kgo.TryAbort
	if commit {
		try = kgo.TryCommit
	}
	if err := w.cl.EndTransaction(testCtx(w.f.t), try); err != nil {
		w.f.t.Fatalf("%s: end transaction (commit=%v): %v", w.id, commit, err)
	}
}

// txn writes one marker in a transaction of its own, ended as st says
// (Open leaves it open), and returns its entry.
func (w *txnWriter) txn(st Status, checkpoint uint64, rs ...Range) Entry {
	w.f.t.Helper()
	w.begin()
	e := w.write(w.marker(checkpoint, rs...))
	if st != Open {
		w.end(st == Committed)
	}
	return e
}

func catchUpToEnd(t testing.TB, ix *Index) {
	t.Helper()
	if err := ix.CatchUpToEnd(testCtx(t)); err != nil {
		t.Fatalf("CatchUpToEnd: %v", err)
	}
}

func wantStatus(t testing.TB, ix *Index, e Entry, want Status) {
	t.Helper()
	got, ok := ix.Status(e.Offset)
	if !ok {
		t.Fatalf("Status(%d): no marker, want %v", e.Offset, want)
	}
	if got.Status != want {
		t.Fatalf("Status(%d) = %v, want %v", e.Offset, got.Status, want)
	}
	if got.Marker.ProducerID != e.Marker.ProducerID || got.Marker.Checkpoint != e.Marker.Checkpoint {
		t.Fatalf("Status(%d) = marker pid %d cp %d, want pid %d cp %d", e.Offset,
			got.Marker.ProducerID, got.Marker.Checkpoint, e.Marker.ProducerID, e.Marker.Checkpoint)
	}
}

func offsetsOf(es []Entry) []int64 {
	out := make([]int64, 0, len(es))
	for _, e := range es {
		out = append(out, e.Offset)
	}
	return out
}
