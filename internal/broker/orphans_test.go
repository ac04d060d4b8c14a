package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestOrphanScanFindsOpenTransactionsBehindASlowFetch: the repair after a
// crash must find every transaction the crash left open however slowly the
// broker answers its scan. A loaded broker (the chaos suite's, restarted
// with the records of many rounds) took longer than the scan's idle wait
// to answer the first fetch; the scan took that for "read to the end" and
// found nothing, no lost-state marker was written, and recovering jobs
// failed with "transaction ... of checkpoint N lost" (chaos seed
// 2976612995, rounds 19, 28 and 36). Here every fetch of the scan is held
// past the idle wait once: each open transaction (one per partition, after
// committed and aborted ones, and one on two partitions) is still found, on
// every partition, and nothing else is.
func TestOrphanScanFindsOpenTransactionsBehindASlowFetch(t *testing.T) {
	ctx := t.Context()
	b, err := Start(ctx, Listen("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	client := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.Addr()), kgo.DefaultProduceTopic("t"),
			kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	const partitions = 4
	if _, err := kadm.NewClient(client()).CreateTopic(ctx, partitions, 1, nil, "t"); err != nil {
		t.Fatal(err)
	}
	// txn produces 50 records on each of parts in a transaction of id,
	// ended as end says ("commit", "abort", "open": left open), and
	// returns its producer id.
	txn := func(id, end string, parts ...int32) int64 {
		cl := client(kgo.TransactionalID(id), kgo.TransactionTimeout(time.Minute))
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			for range 50 {
				if err := cl.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if end != "open" {
			if err := cl.EndTransaction(ctx, end == "commit"); err != nil {
				t.Fatal(err)
			}
		}
		pid, _, err := cl.ProducerID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	txn("committed", "commit", 0, 1, 2, 3)
	txn("aborted", "abort", 0, 1, 2, 3)
	want := map[int64]map[int32]bool{}
	for p := range int32(partitions) {
		want[txn(fmt.Sprintf("open-%d", p), "open", p)] = map[int32]bool{p: true}
	}
	want[txn("open-two", "open", 1, 3)] = map[int32]bool{1: true, 3: true}

	// The broker holds each connection's first fetch past the scan's
	// idle wait, as a loaded broker does.
	b.Cluster().ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		b.Cluster().KeepControl()
		b.Cluster().SleepControl(func() { time.Sleep(scanIdle + time.Second) })
		b.Cluster().DropControl()
		return nil, nil, false
	})
	scan := client()
	orphans, _, err := findOrphans(ctx, scan)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]map[int32]bool{}
	for _, o := range orphans {
		got[o.ProducerID] = map[int32]bool{}
		for p := range o.FirstOffsets["t"] {
			got[o.ProducerID][p] = true
		}
	}
	if len(got) != len(want) {
		t.Errorf("found %d open transactions %v, want %d %v", len(got), got, len(want), want)
	}
	for pid, ps := range want {
		for p := range ps {
			if !got[pid][p] {
				t.Errorf("open transaction of producer %d on t/%d not found (found %v)", pid, p, got)
			}
		}
		if len(got[pid]) != len(ps) {
			t.Errorf("producer %d: found on partitions %v, want %v", pid, got[pid], ps)
		}
	}
}
