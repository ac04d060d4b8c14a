package broker_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/kafkatxn"
)

// TestACommitOfATransactionTheCrashLostIsRefused: a sink's transaction is
// open (pre-committed) when the broker is SIGKILLed, and the sink's commit
// comes after the restart (a notification in flight, or the recovery's
// commit of the restored handle). The restarted broker aborted the
// transaction, so the commit must fail, whatever the producer's previous
// transaction did: only a failure sends the writer to the
// broker-lost-transaction recovery, which re-commits the records.
func TestACommitOfATransactionTheCrashLostIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before are the transactions of the id before the lost one:
		// true commits, false aborts.
		before []bool
	}{
		{"first transaction of its id", nil},
		{"after a committed transaction", []bool{true}},
		{"after an aborted transaction", []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			p, dir := crashableWithTopic(ctx, t, 2)
			cl := txnClient(t, p.Addr, "sink-0", time.Minute)
			for _, commit := range tc.before {
				inTxn(ctx, t, cl, false, "earlier")
				if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
					t.Fatal(err)
				}
			}
			inTxn(ctx, t, cl, false, "lost")
			pid, epoch, err := cl.ProducerID(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p.Kill(t)
			p = brokerproc.Start(t, dir, p.Addr)

			h := checkpoint.TxnHandle{TransactionalID: "sink-0", ProducerID: pid, Epoch: epoch, Checkpoint: 1}
			err = kafkatxn.EndTxn(ctx, client(t, p.Addr), h, true)
			if err == nil {
				t.Fatalf("the commit of transaction (producer %d, epoch %d), which the crash aborted, succeeded after the restart", pid, epoch)
			}
			t.Logf("commit after the restart: %v", err)
		})
	}
}
