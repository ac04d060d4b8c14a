package kafkatxn

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker/brokerproc"
)

// TestRecoverRecommitsATransactionTheBrokerLostInACrash: the embedded broker
// crashes (SIGKILL) after a checkpoint's transaction was pre-committed and
// before it was committed. The broker lost the transaction; recovery must
// still make its records visible read_committed, exactly once, also when
// recovery from the same checkpoint runs a second time.
func TestRecoverRecommitsATransactionTheBrokerLostInACrash(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	p, addrs := processBroker(t, dir)
	w1, h := precommitted(t, addrs, rec(0, "a"), rec(1, "b"), rec(0, "c"), rec(1, "d"))
	if len(h.Partitions) != 2 || h.Partitions[0].Partition != 0 || h.Partitions[1].Partition != 1 {
		t.Fatalf("handle partitions = %+v, want partitions 0 and 1 of %s", h.Partitions, testTopic)
	}
	w1.crash()
	p.Kill(t)
	brokerproc.Start(t, dir, p.Addr)

	recoverTwice(t, ctx, addrs, h, [testPartitions][]string{{"a", "c"}, {"b", "d"}})
}

// TestRecoverCopiesOnlyThePartitionsATornCommitMissed: the embedded broker
// is killed in the middle of the EndTxn that commits a checkpoint's
// transaction, with the commit marker written to one of its partitions and
// not the other (kfake writes markers partition by partition and logs the
// end of the transaction after them). After the restart the other
// partition ends the transaction with a lost-state abort. Recovery must
// leave the committed partition alone and copy exactly the other one's
// records: each record visible read_committed once.
func TestRecoverCopiesOnlyThePartitionsATornCommitMissed(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	p, addrs := processBroker(t, dir)
	w1, h := precommitted(t, addrs, rec(0, "a"), rec(1, "b"), rec(0, "c"), rec(1, "d"))
	// The marker kfake's EndTxn writes to partition 0 before the kill.
	req := kmsg.NewPtrWriteTxnMarkersRequest()
	m := kmsg.NewWriteTxnMarkersRequestMarker()
	m.ProducerID, m.ProducerEpoch, m.Committed = h.ProducerID, h.Epoch, true
	mt := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
	mt.Topic, mt.Partitions = testTopic, []int32{0}
	m.Topics = append(m.Topics, mt)
	req.Markers = append(req.Markers, m)
	resp, err := req.RequestWith(ctx, newClient(t, addrs))
	if err != nil {
		t.Fatal(err)
	}
	for _, rm := range resp.Markers {
		for _, rt := range rm.Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					t.Fatalf("commit marker on %s/%d: %v", rt.Topic, rp.Partition, err)
				}
			}
		}
	}
	w1.crash()
	p.Kill(t)
	brokerproc.Start(t, dir, p.Addr)

	recoverTwice(t, ctx, addrs, h, [testPartitions][]string{{"a", "c"}, {"b", "d"}})
}

// recoverTwice runs recovery of h twice, each time with a fresh writer, and
// requires it to succeed with the test topic holding exactly want
// read_committed after each.
func recoverTwice(t *testing.T, ctx context.Context, addrs []string, h checkpoint.TxnHandle, want [testPartitions][]string) {
	t.Helper()
	for round := 1; round <= 2; round++ {
		w := newWriter(t, ctx, addrs)
		err := w.Recover(ctx, []checkpoint.TxnHandle{h})
		w.Close()
		if err != nil {
			t.Fatalf("recovery %d after the broker lost the transaction: %v", round, err)
		}
		if got := readCommitted(t, ctx, addrs); !equalParts(got, want) {
			t.Fatalf("after recovery %d, read committed:%s\nwant:%s", round, fmtParts(got), fmtParts(want))
		}
	}
}

// TestRecoverDoesNotRecommitATransactionItsBrokerAborted: on a broker that
// knows the transaction (no crash), an abort is final: recovery reports the
// loss and copies nothing.
func TestRecoverDoesNotRecommitATransactionItsBrokerAborted(t *testing.T) {
	ctx := testCtx(t)
	_, addrs := processBroker(t, t.TempDir())
	w1, h := precommitted(t, addrs, rec(0, "x"))
	if err := w1.Abort(ctx, 1); err != nil {
		t.Fatal(err)
	}
	w1.Close()
	w2 := newWriter(t, ctx, addrs)
	defer w2.Close()
	if err := w2.Recover(ctx, []checkpoint.TxnHandle{h}); !errors.Is(err, ErrTxnLost) {
		t.Fatalf("Recover of an aborted transaction = %v, want ErrTxnLost", err)
	}
	if got := readCommitted(t, ctx, addrs); len(got[0]) != 0 {
		t.Fatalf("an aborted transaction was re-committed:%s", fmtParts(got))
	}
}

// processBroker starts a broker process on dir with the test topic.
func processBroker(t *testing.T, dir string) (*brokerproc.Proc, []string) {
	t.Helper()
	p := brokerproc.Start(t, dir, "127.0.0.1:0")
	addrs := []string{p.Addr}
	if _, err := kadm.NewClient(newClient(t, addrs)).CreateTopic(testCtx(t), testPartitions, 1, nil, testTopic); err != nil {
		t.Fatal(err)
	}
	return p, addrs
}

// precommitted writes recs in one transaction of a fresh writer and
// pre-commits it as checkpoint 1.
func precommitted(t *testing.T, addrs []string, recs ...*kgo.Record) (*TxnWriter, checkpoint.TxnHandle) {
	t.Helper()
	ctx := testCtx(t)
	w := newWriter(t, ctx, addrs)
	if err := w.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := w.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	h, ok, err := w.PreCommit(ctx, 1)
	if err != nil || !ok {
		t.Fatalf("PreCommit = %v, %v", ok, err)
	}
	return w, h
}

// TestRecoverFailsNamingATransactionTheBrokerLostWithoutPartitions: a
// handle recorded before handles named their partitions cannot be
// re-committed; recovery must fail with ErrTxnLost naming the transaction
// and its checkpoint, never go on silently.
func TestRecoverFailsNamingATransactionTheBrokerLostWithoutPartitions(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	p, addrs := processBroker(t, dir)
	w1, h := precommitted(t, addrs, rec(0, "a"))
	w1.crash()
	p.Kill(t)
	brokerproc.Start(t, dir, p.Addr)

	h.Partitions = nil
	w := newWriter(t, ctx, addrs)
	defer w.Close()
	err := w.Recover(ctx, []checkpoint.TxnHandle{h})
	var le *LostTxnError
	if !errors.As(err, &le) || !errors.Is(err, ErrTxnLost) {
		t.Fatalf("Recover = %v, want a LostTxnError", err)
	}
	if msg := err.Error(); !strings.Contains(msg, h.TransactionalID) || !strings.Contains(msg, "checkpoint 1") {
		t.Fatalf("error %q does not name transaction %s of checkpoint 1", msg, h.TransactionalID)
	}
	if got := readCommitted(t, ctx, addrs); len(got[0]) != 0 {
		t.Fatalf("records of the lost transaction became visible:%s", fmtParts(got))
	}
}

// TestRecoverCompletesALegacyPartialRecopy: an earlier version of the
// broker-lost-transaction path tagged copies "<producer id>/<epoch>"
// without the original offset, and could commit only the tail of a copy.
// Recovery must recognise those copies by content and copy only the
// records that have none: every record once (the legacy tail first, then
// the missing head: order cannot be restored).
func TestRecoverCompletesALegacyPartialRecopy(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	p, addrs := processBroker(t, dir)
	w1, h := precommitted(t, addrs, rec(0, "a"), rec(1, "d"), rec(0, "b"), rec(0, "c"))
	w1.crash()
	p.Kill(t)
	brokerproc.Start(t, dir, p.Addr)

	// The legacy copy's committed tail: b and c of partition 0.
	cl := newClient(t, addrs, kgo.TransactionalID(h.TransactionalID), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	tag := []byte(strconv.FormatInt(h.ProducerID, 10) + "/" + strconv.Itoa(int(h.Epoch)))
	for _, v := range []string{"b", "c"} {
		r := rec(0, v)
		r.Headers = []kgo.RecordHeader{{Key: HeaderRecommittedFrom, Value: tag}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := EndTxn(ctx, cl, checkpoint.TxnHandle{TransactionalID: h.TransactionalID, ProducerID: pid, Epoch: epoch}, true); err != nil {
		t.Fatal(err)
	}
	cl.Close()

	recoverTwice(t, ctx, addrs, h, [testPartitions][]string{{"b", "c", "a"}, {"d"}})
}

// TestRecommittedTransactionReachesAShareGroupOnce: the copy-forward repair
// of a transaction the embedded broker lost leaves the original records in
// the log, aborted by the lost-state marker, and writes the copies in a new
// committed transaction. A share group reading read_committed (as Weir's
// source and session set it) is handed each record once, the copy; one left
// at Kafka's default read_uncommitted gets the aborted originals too, which
// is why the isolation level matters downstream of Weir.
func TestRecommittedTransactionReachesAShareGroupOnce(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	p, addrs := processBroker(t, dir)
	w1, h := precommitted(t, addrs, rec(0, "a"), rec(1, "b"), rec(0, "c"), rec(1, "d"))
	w1.crash()
	p.Kill(t)
	brokerproc.Start(t, dir, p.Addr)
	w := newWriter(t, ctx, addrs)
	if err := w.Recover(ctx, []checkpoint.TxnHandle{h}); err != nil {
		t.Fatal(err)
	}
	w.Close()

	for _, tc := range []struct {
		isolation string
		want      string
	}{
		{"read_committed", "a,b,c,d"},
		{"read_uncommitted", "a,a,b,b,c,c,d,d"},
	} {
		t.Run(tc.isolation, func(t *testing.T) {
			group := "g-" + tc.isolation
			alter := kmsg.NewPtrIncrementalAlterConfigsRequest()
			res := kmsg.NewIncrementalAlterConfigsRequestResource()
			res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
			for k, v := range map[string]string{"share.isolation.level": tc.isolation, "share.auto.offset.reset": "earliest"} {
				c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
				c.Name, c.Value = k, kmsg.StringPtr(v)
				res.Configs = append(res.Configs, c)
			}
			alter.Resources = append(alter.Resources, res)
			resp, err := alter.RequestWith(ctx, newClient(t, addrs))
			if err == nil {
				err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
			}
			if err != nil {
				t.Fatal(err)
			}
			cons := newClient(t, addrs, kgo.ShareGroup(group), kgo.ConsumeTopics(testTopic))
			want := strings.Split(tc.want, ",")
			var got []string
			for len(got) < len(want) {
				fs := cons.PollRecords(ctx, 100)
				if ctx.Err() != nil {
					t.Fatalf("share group (%s) got %v, want %v", tc.isolation, got, want)
				}
				for _, r := range fs.Records() {
					got = append(got, string(r.Value))
				}
			}
			slices.Sort(got)
			if strings.Join(got, ",") != tc.want {
				t.Fatalf("share group (%s) got %v after the re-commit, want %v", tc.isolation, got, want)
			}
		})
	}
}
