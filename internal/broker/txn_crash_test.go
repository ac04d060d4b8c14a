package broker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/kafkatxn"
)

// crashableWithTopic starts a broker process on a new data dir and creates
// topic t with the given partitions on it.
func crashableWithTopic(ctx context.Context, t *testing.T, partitions int32) (p *brokerproc.Proc, dir string) {
	t.Helper()
	dir = t.TempDir()
	p = brokerproc.Start(t, dir, "127.0.0.1:0")
	if _, err := kadm.NewClient(client(t, p.Addr)).CreateTopic(ctx, partitions, 1, nil, "t"); err != nil {
		t.Fatal(err)
	}
	return p, dir
}

func txnClient(t *testing.T, addr, txnID string, timeout time.Duration) *kgo.Client {
	return client(t, addr, kgo.DefaultProduceTopic("t"), kgo.TransactionalID(txnID), kgo.TransactionTimeout(timeout))
}

func inTxn(ctx context.Context, t *testing.T, cl *kgo.Client, commit bool, values ...string) {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		if err := cl.ProduceSync(ctx, kgo.StringRecord(v)).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if commit {
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSameTransactionalIDCommitsAfterACrashLeftItsTransactionOpen: a sink
// reuses its transactional ids after a restart; a transaction it commits
// then must be visible to read_committed, and the orphan must stay hidden,
// also after a second crash.
func TestSameTransactionalIDCommitsAfterACrashLeftItsTransactionOpen(t *testing.T) {
	ctx := ctxT(t)
	p, dir := crashableWithTopic(ctx, t, 1)
	inTxn(ctx, t, txnClient(t, p.Addr, "sink-0", time.Minute), true, "before")
	inTxn(ctx, t, txnClient(t, p.Addr, "sink-1", time.Minute), false, "orphan")
	p.Kill(t)

	p = brokerproc.Start(t, dir, p.Addr)
	inTxn(ctx, t, txnClient(t, p.Addr, "sink-1", time.Minute), true, "after")
	readCommittedIs(t, p.Addr, "after,before", "after a crash and a commit of the same transactional id")

	// The orphan stays aborted after another crash: its abort is on disk.
	p.Kill(t)
	p = brokerproc.Start(t, dir, p.Addr)
	readCommittedIs(t, p.Addr, "after,before", "after a second crash")
	if !strings.Contains(p.Stderr(), "did not stop cleanly") {
		t.Errorf("no unclean-stop warning; stderr:\n%s", p.Stderr())
	}
}

func readCommittedIs(t *testing.T, addr, want, when string) {
	t.Helper()
	recs, err := kafkatest.ReadCommitted(ctxT(t), []string{addr}, "t")
	if err != nil {
		t.Fatal(err)
	}
	if got := valuesOf(recs); got != want {
		t.Fatalf("read committed %s = %q, want %q", when, got, want)
	}
}

// TestOrphanedTransactionIsReportedAndAborted: a transaction a crash left
// open is reported and aborted at the next start; read_committed moves past
// it and its producer's next transaction is visible.
func TestOrphanedTransactionIsReportedAndAborted(t *testing.T) {
	ctx := ctxT(t)
	var pid int64
	p := crashed(t, func(addr string) {
		if _, err := kadm.NewClient(client(t, addr)).CreateTopic(ctx, 1, 1, nil, "t"); err != nil {
			t.Fatal(err)
		}
		cl := txnClient(t, addr, "sink-1", time.Minute)
		inTxn(ctx, t, cl, false, "orphan")
		pid, _, _ = cl.ProducerID(ctx)
	})
	if !strings.Contains(p.Stderr(), fmt.Sprintf("producer %d epoch 0 on t/0", pid)) {
		t.Errorf("the unclean-stop warning does not name the aborted transaction of producer %d; stderr:\n%s", pid, p.Stderr())
	}
	// A plain record after the orphan is readable read_committed.
	if err := client(t, p.Addr, kgo.DefaultProduceTopic("t")).ProduceSync(ctx, kgo.StringRecord("plain")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	readCommittedIs(t, p.Addr, "plain", "after a crash")
}

func TestLostStateCoordinatorEpochMatchesKafkatxn(t *testing.T) {
	if broker.LostStateCoordinatorEpoch != kafkatxn.LostStateCoordinatorEpoch {
		t.Fatalf("broker writes lost-state markers with coordinator epoch %d, kafkatxn looks for %d",
			broker.LostStateCoordinatorEpoch, kafkatxn.LostStateCoordinatorEpoch)
	}
}

// TestAKillBetweenABatchAndItsIndexEntryCannotExposeAnAbortedTransaction:
// kfake appends a batch to a segment and then its index entry, in two
// writes. A kill between them (here: the entry of a commit marker removed
// after a SIGKILL) used to shift every later entry of the segment by one
// at the next start, so after the following crash a transaction's data
// batch loaded as not transactional and read_committed readers saw its
// aborted records. The unclean start rebuilds the index before kfake loads
// it.
func TestAKillBetweenABatchAndItsIndexEntryCannotExposeAnAbortedTransaction(t *testing.T) {
	ctx := ctxT(t)
	p, dir := crashableWithTopic(ctx, t, 1)
	inTxn(ctx, t, txnClient(t, p.Addr, "a", time.Minute), true, "committed")
	p.Kill(t)
	idx := filepath.Join(dir, "partitions", "t-0", "0.idx")
	raw, err := os.ReadFile(idx)
	if err != nil || len(raw) < 15 {
		t.Fatalf("segment index %s: %d bytes, %v", idx, len(raw), err)
	}
	if err := os.WriteFile(idx, raw[:len(raw)-15], 0o644); err != nil { // the commit marker's entry
		t.Fatal(err)
	}

	p = brokerproc.Start(t, dir, p.Addr)
	// Stderr is copied from its pipe apart from the listening line on
	// stdout: the report may reach the test after it.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(p.Stderr(), "t-0/0.idx"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the unclean start did not report rebuilding t-0/0.idx; stderr:\n%s", p.Stderr())
			break
		}
	}
	cl := txnClient(t, p.Addr, "b", time.Minute)
	inTxn(ctx, t, cl, false, "aborted") // one batch
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	readCommittedIs(t, p.Addr, "committed", "after the abort")
	p.Kill(t)
	p = brokerproc.Start(t, dir, p.Addr)
	readCommittedIs(t, p.Addr, "committed", "after another crash")
}
