package kafkatxn

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestKfakeTransactionFacts measures the broker behaviour the writer relies
// on (summarised in recover.go), so a kfake upgrade that changes it fails
// here first.
func TestKfakeTransactionFacts(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t)
	addrs := c.ListenAddrs()
	admin := newClient(t, addrs)
	adm := kadm.NewClient(admin)

	endTxn := func(id string, pid int64, epoch int16, commit bool) error {
		req := kmsg.NewPtrEndTxnRequest()
		req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = id, pid, epoch, commit
		resp, err := req.RequestWith(ctx, admin)
		if err != nil {
			t.Fatalf("EndTxn: %v", err)
		}
		return kerr.ErrorForCode(resp.ErrorCode)
	}
	openTxn := func(id string, timeout time.Duration) (*kgo.Client, int64, int16) {
		p := newClient(t, addrs, kgo.TransactionalID(id), kgo.TransactionTimeout(timeout),
			kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := p.ProduceSync(ctx, rec(0, id)).FirstErr(); err != nil {
			t.Fatal(err)
		}
		pid, epoch, err := p.ProducerID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p, pid, epoch
	}
	ongoing := func() map[string]bool {
		l, err := adm.ListTransactions(ctx, nil, []string{"Ongoing"})
		if err != nil {
			t.Fatalf("ListTransactions: %v", err)
		}
		m := make(map[string]bool)
		for id := range l {
			m[id] = true
		}
		return m
	}

	// A raw EndTxn commits; repeating it succeeds; the epoch bumped by one.
	p, pid, epoch := openTxn("fact-a", time.Minute)
	if !ongoing()["fact-a"] {
		t.Fatal("ListTransactions(Ongoing) does not list an open transaction")
	}
	for i := range 2 {
		if err := endTxn("fact-a", pid, epoch, true); err != nil {
			t.Fatalf("raw EndTxn commit #%d = %v, want success", i+1, err)
		}
	}
	if ongoing()["fact-a"] {
		t.Fatal("committed transaction still listed as Ongoing")
	}
	if pid2, epoch2, _ := p.ProducerID(ctx); pid2 != pid || epoch2 != epoch {
		t.Logf("note: the client does not see the raw EndTxn bump: %d/%d", pid2, epoch2)
	}
	// Once the id runs a new transaction, the old handle is fenced.
	p2, pid2, epoch2 := openTxn("fact-a", time.Minute) // InitProducerID: epoch+2
	if pid2 != pid || epoch2 <= epoch {
		t.Fatalf("re-init gave %d/%d after %d/%d", pid2, epoch2, pid, epoch)
	}
	if err := endTxn("fact-a", pid, epoch, true); !errors.Is(err, kerr.ProducerFenced) {
		t.Fatalf("commit of an old handle after reuse = %v, want PRODUCER_FENCED", err)
	}
	// EndTxn through kgo bumps the epoch by exactly one (KIP-890).
	if err := p2.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	if _, e, _ := p2.ProducerID(ctx); e != epoch2+1 {
		t.Fatalf("epoch after EndTxn = %d, want %d", e, epoch2+1)
	}

	// InitProducerID on an id with an open transaction aborts it.
	_, pidB, epochB := openTxn("fact-b", time.Minute)
	init := kmsg.NewPtrInitProducerIDRequest()
	id := "fact-b"
	init.TransactionalID, init.TransactionTimeoutMillis, init.ProducerID, init.ProducerEpoch = &id, 60000, -1, -1
	if resp, err := init.RequestWith(ctx, admin); err != nil || resp.ErrorCode != 0 {
		t.Fatalf("InitProducerID: %v %v", err, resp)
	}
	if ongoing()["fact-b"] {
		t.Fatal("InitProducerID did not abort the open transaction")
	}
	if err := endTxn("fact-b", pidB, epochB, true); err == nil {
		t.Fatal("commit after fence succeeded")
	}

	// A transaction the broker timed out answers INVALID_TXN_STATE.
	_, pidC, epochC := openTxn("fact-c", 100*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for ongoing()["fact-c"] && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := endTxn("fact-c", pidC, epochC, true); !errors.Is(err, kerr.InvalidTxnState) {
		t.Fatalf("commit after timeout = %v, want INVALID_TXN_STATE", err)
	}

	// The last stable offset is free again: everything open was ended.
	got := readCommitted(t, ctx, addrs)
	if len(got[0]) != 2 || got[0][0] != "fact-a" || got[0][1] != "fact-a" {
		t.Fatalf("committed data = %v, want the two fact-a transactions", got[0])
	}
}
