package kafkatxn

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"

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
	p := brokerproc.Start(t, dir, "127.0.0.1:0")
	addrs := []string{p.Addr}
	if _, err := kadm.NewClient(newClient(t, addrs)).CreateTopic(ctx, testPartitions, 1, nil, testTopic); err != nil {
		t.Fatal(err)
	}
	w1 := newWriter(t, ctx, addrs)
	if err := w1.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"a", "b", "c", "d"} {
		if err := w1.Write(ctx, rec(int32(i%2), v)); err != nil {
			t.Fatal(err)
		}
	}
	h, ok, err := w1.PreCommit(ctx, 1)
	if err != nil || !ok {
		t.Fatalf("PreCommit = %v, %v", ok, err)
	}
	if len(h.Partitions) != 2 || h.Partitions[0].Partition != 0 || h.Partitions[1].Partition != 1 {
		t.Fatalf("handle partitions = %+v, want partitions 0 and 1 of %s", h.Partitions, testTopic)
	}
	w1.crash()
	p.Kill(t)
	p = brokerproc.Start(t, dir, p.Addr)

	for round := 1; round <= 2; round++ {
		w := newWriter(t, ctx, addrs)
		err := w.Recover(ctx, []checkpoint.TxnHandle{h})
		w.Close()
		if err != nil {
			t.Fatalf("recovery %d after the broker lost the transaction: %v", round, err)
		}
		got := readCommitted(t, ctx, addrs)
		if strings.Join(got[0], ",") != "a,c" || strings.Join(got[1], ",") != "b,d" || len(got[2]) != 0 {
			t.Fatalf("after recovery %d, read committed:%s\nwant p0 [a c], p1 [b d]", round, fmtParts(got))
		}
	}
}

// TestRecoverDoesNotRecommitATransactionItsBrokerAborted: on a broker that
// knows the transaction (no crash), an abort is final: recovery reports the
// loss and copies nothing.
func TestRecoverDoesNotRecommitATransactionItsBrokerAborted(t *testing.T) {
	ctx := testCtx(t)
	p := brokerproc.Start(t, t.TempDir(), "127.0.0.1:0")
	addrs := []string{p.Addr}
	if _, err := kadm.NewClient(newClient(t, addrs)).CreateTopic(ctx, testPartitions, 1, nil, testTopic); err != nil {
		t.Fatal(err)
	}
	w1 := newWriter(t, ctx, addrs)
	if err := w1.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := w1.Write(ctx, rec(0, "x")); err != nil {
		t.Fatal(err)
	}
	h, _, err := w1.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
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
