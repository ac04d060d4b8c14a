package kafkatxn

import (
	"errors"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
)

// A handle committed long ago, whose transactional id has since begun
// another transaction (or expired), answers PRODUCER_FENCED (or
// INVALID_PRODUCER_ID_MAPPING) to a repeated commit. That is not a loss:
// Recover must not fail the job for it. A transaction the broker aborted
// (INVALID_TXN_STATE) is still reported lost.
func TestRecoverTellsAlreadyCommittedFromLost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		end      func(t *testing.T, w *TxnWriter, h checkpoint.TxnHandle, addrs []string)
		wantLost bool
		want     []string // committed values of partition 0
		// noPartitions plays a handle from a store that did not record
		// partitions: the commit cannot be verified, only assumed.
		noPartitions bool
	}{
		{"committed, then its id began another transaction", func(t *testing.T, w *TxnWriter, h checkpoint.TxnHandle, addrs []string) {
			ctx := testCtx(t)
			if err := w.Commit(ctx, 1); err != nil {
				t.Fatal(err)
			}
			// Another producer of the same id (a later use of the id)
			// moves its epoch on.
			cl := newClient(t, addrs, kgo.TransactionalID(h.TransactionalID), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err := cl.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			if err := cl.ProduceSync(ctx, rec(0, "later")).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
		}, false, []string{"x", "later"}, false},
		{"committed, then its id moved on; handle without partitions", func(t *testing.T, w *TxnWriter, h checkpoint.TxnHandle, addrs []string) {
			ctx := testCtx(t)
			if err := w.Commit(ctx, 1); err != nil {
				t.Fatal(err)
			}
			// Another producer of the same id (a later use of the id)
			// moves its epoch on.
			cl := newClient(t, addrs, kgo.TransactionalID(h.TransactionalID), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err := cl.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			if err := cl.ProduceSync(ctx, rec(0, "later")).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
		}, false, []string{"x", "later"}, true},
		{"aborted", func(t *testing.T, w *TxnWriter, _ checkpoint.TxnHandle, _ []string) {
			if err := w.Abort(testCtx(t), 1); err != nil {
				t.Fatal(err)
			}
		}, true, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := newCluster(t)
			addrs := c.ListenAddrs()
			w1, h := precommitOne(t, addrs, "x")
			tc.end(t, w1, h, addrs)
			w1.crash()
			wantUnverified := int64(0)
			if tc.noPartitions {
				h.Partitions, wantUnverified = nil, 1
			}

			w2 := newWriter(t, ctx, addrs)
			defer w2.Close()
			err := w2.Recover(ctx, []checkpoint.TxnHandle{h})
			if tc.wantLost {
				if !errors.Is(err, ErrTxnLost) || w2.LostTransactions() != 1 {
					t.Fatalf("Recover = %v, %d lost; want ErrTxnLost, 1 lost", err, w2.LostTransactions())
				}
				return
			}
			// Committed before: verified when the handle names its
			// partitions (their commit markers are in the log), else
			// assumed and counted (UnverifiedCommits); never copied.
			if err != nil || w2.LostTransactions() != 0 || w2.UnverifiedCommits() != wantUnverified {
				t.Fatalf("Recover = %v, %d lost, %d unverified; want nil, 0, %d: the transaction was committed before",
					err, w2.LostTransactions(), w2.UnverifiedCommits(), wantUnverified)
			}
			if got := readCommitted(t, ctx, addrs); !slices.Equal(got[0], tc.want) {
				t.Fatalf("partition 0 committed %q, want %q", got[0], tc.want)
			}
		})
	}
}

// precommitOne starts a writer on a fresh start, writes value to partition
// 0 and pre-commits it for checkpoint 1.
func precommitOne(t *testing.T, addrs []string, value string) (*TxnWriter, checkpoint.TxnHandle) {
	t.Helper()
	ctx := testCtx(t)
	w := newWriter(t, ctx, addrs)
	if err := w.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, rec(0, value)); err != nil {
		t.Fatal(err)
	}
	h, _, err := w.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return w, h
}
