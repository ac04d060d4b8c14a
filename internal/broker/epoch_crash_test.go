package broker_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/kafkatxn"
)

// TestATransactionTheBrokerLostCannotBeContinuedAfterAnotherCrash: a crash
// loses a transaction whose producer is still running. However the crashes
// fall, that producer must never commit any part of the lost transaction:
// a Kafka coordinator that aborted a transaction fences its epoch for good.
// After the last crash the producer goes on producing into what it
// believes is its transaction and commits; read_committed must show
// nothing of it, neither the records after the crash (its tail) nor those
// before (its head, which the crash aborted).
//
// kfake fences a lost transaction's epoch in memory only, and before the
// fix (fenceOrphans) the restarted broker accepted the producer again:
//   - "crashed twice": a second crash came before anything persisted a
//     newer epoch, so the broker was back at the lost transaction's epoch
//     (a broker-lost-transaction copy interrupted so commits its tail);
//   - "ended, then its next transaction crashed": the producer ended the
//     lost transaction (as a sink aborts an aborted checkpoint's
//     transaction), got the unpersisted epoch from EndTxn's retry answer
//     and began its next transaction at it, which a second crash lost: the
//     bump landed on that epoch. The tail committed without its head, and
//     a later re-commit of the handle copied the head behind the tail (the
//     process test's duplicates).
func TestATransactionTheBrokerLostCannotBeContinuedAfterAnotherCrash(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lose begins a transaction on cl with a record on partition 0
		// and loses it in broker crashes; it returns the broker running.
		lose func(t *testing.T, p *brokerproc.Proc, dir string, cl *kgo.Client, produce func(int32, string) error) *brokerproc.Proc
	}{
		{"crashed twice", func(t *testing.T, p *brokerproc.Proc, dir string, cl *kgo.Client, produce func(int32, string) error) *brokerproc.Proc {
			if err := cl.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			if err := produce(0, "head"); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				p.Kill(t)
				p = brokerproc.Start(t, dir, p.Addr)
			}
			return p
		}},
		{"ended, then its next transaction crashed", func(t *testing.T, p *brokerproc.Proc, dir string, cl *kgo.Client, produce func(int32, string) error) *brokerproc.Proc {
			ctx := ctxT(t)
			if err := cl.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			if err := produce(0, "lost-1"); err != nil {
				t.Fatal(err)
			}
			pid, epoch, err := cl.ProducerID(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p.Kill(t)
			p = brokerproc.Start(t, dir, p.Addr)
			// TxnWriter.Abort: a raw EndTxn, then kgo's end to resync.
			abortErr := kafkatxn.EndTxn(ctx, cl, checkpoint.TxnHandle{TransactionalID: "sink-0-0", ProducerID: pid, Epoch: epoch}, false)
			syncErr := cl.EndTransaction(ctx, kgo.TryAbort)
			t.Logf("abort of the lost transaction (producer %d, epoch %d): %v; client resync: %v", pid, epoch, abortErr, syncErr)
			if err := cl.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			if err := produce(0, "head"); err != nil {
				t.Fatal(err)
			}
			p.Kill(t)
			return brokerproc.Start(t, dir, p.Addr)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			p, dir := crashableWithTopic(ctx, t, 2)
			cl := client(t, p.Addr, kgo.TransactionalID("sink-0-0"), kgo.TransactionTimeout(time.Minute),
				kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RetryTimeout(10*time.Second))
			produce := func(partition int32, v string) error {
				return cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Partition: partition, Value: []byte(v)}).FirstErr()
			}
			p = tc.lose(t, p, dir, cl, produce)

			tail := produce(1, "tail")
			commit := cl.EndTransaction(ctx, kgo.TryCommit)
			t.Logf("the lost transaction continued: tail %v, commit %v", tail, commit)
			recs, err := kafkatest.ReadCommitted(ctx, []string{p.Addr}, "t")
			if err != nil {
				t.Fatal(err)
			}
			if got := valuesOf(recs); got != "" {
				t.Fatalf("read committed = %q: the producer of a transaction the broker lost continued and committed it, want nothing", got)
			}
		})
	}
}
