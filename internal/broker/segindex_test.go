package broker

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestReconcileReproducesKfakesOwnIndexes pins kfake's segment index format
// that reconcileSegmentIndexes writes: on a data dir kfake wrote and closed
// cleanly (plain records, a committed and an aborted transaction, on two
// partitions), the entries rebuilt from the segments match kfake's own,
// and nothing is rebuilt. It fails if a kfake upgrade changes the format.
func TestReconcileReproducesKfakesOwnIndexes(t *testing.T) {
	dir := cleanDataDir(t, 2, func(ctx context.Context, client func(...kgo.Opt) *kgo.Client) {
		if err := client().ProduceSync(ctx, &kgo.Record{Value: []byte("plain")}, &kgo.Record{Partition: 1, Value: []byte("plain")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		txn := client(kgo.TransactionalID("x"))
		for _, commit := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort} {
			if err := txn.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte("a")}, &kgo.Record{Partition: 1, Value: []byte("b")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if err := txn.EndTransaction(ctx, commit); err != nil {
				t.Fatal(err)
			}
		}
	})

	dats, err := filepath.Glob(filepath.Join(dir, "partitions", "t-*", "*.dat"))
	if err != nil || len(dats) != 2 {
		t.Fatalf("segments of t: %v, %v; want 2", dats, err)
	}
	inTx := 0
	for _, dat := range dats {
		want, err := indexFor(dat)
		if err != nil {
			t.Fatal(err)
		}
		have, err := os.ReadFile(strings.TrimSuffix(dat, ".dat") + ".idx")
		if err != nil {
			t.Fatal(err)
		}
		if len(want) == 0 || !indexMatches(have, want) {
			t.Errorf("%s: index rebuilt from the segment\n%x\ndiffers from kfake's\n%x", dat, want, have)
		}
		for i := 0; i < len(want); i += idxEntrySize {
			inTx += int(want[i+14] & idxFlagInTx)
		}
	}
	if inTx == 0 {
		t.Errorf("no entry flags a transactional batch: the test no longer covers the flag")
	}
	rebuilt, err := reconcileSegmentIndexes(dir)
	if err != nil || len(rebuilt) > 0 {
		t.Errorf("reconcile of kfake's own indexes rebuilt %v (%v), want nothing", rebuilt, err)
	}
}

// A segment cut in the middle of a batch (a kill during the write) ends
// where kfake stops loading it: the torn batch gets no entry.
func TestIndexForStopsAtATornBatch(t *testing.T) {
	dir := cleanDataDir(t, 1, func(ctx context.Context, client func(...kgo.Opt) *kgo.Client) {
		cl := client()
		for _, v := range []string{"one", "two"} {
			if err := cl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	})
	dat := filepath.Join(dir, "partitions", "t-0", "0.dat")
	whole, err := indexFor(dat)
	if err != nil || len(whole) != 2*idxEntrySize {
		t.Fatalf("index of two batches: %d bytes, %v", len(whole), err)
	}
	raw, err := os.ReadFile(dat)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dat, raw[:len(raw)-3], 0o644); err != nil {
		t.Fatal(err)
	}
	torn, err := indexFor(dat)
	if err != nil || string(torn) != string(whole[:idxEntrySize]) {
		t.Fatalf("index of a segment whose second batch is torn: %x (%v), want the first entry %x", torn, err, whole[:idxEntrySize])
	}
}

// cleanDataDir starts a broker on a new data dir, creates topic t with the
// given partitions, lets fill write to it through clients made by client
// (default topic t, records to the partition they name), closes the broker
// cleanly and returns the dir.
func cleanDataDir(t *testing.T, partitions int32, fill func(ctx context.Context, client func(...kgo.Opt) *kgo.Client)) string {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	b, err := Start(ctx, DataDir(dir), Listen("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	var clients []*kgo.Client
	client := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.Addr()), kgo.DefaultProduceTopic("t"),
			kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, cl)
		return cl
	}
	if _, err := kadm.NewClient(client()).CreateTopic(ctx, partitions, 1, nil, "t"); err != nil {
		t.Fatal(err)
	}
	fill(ctx, client)
	for _, cl := range clients {
		cl.Close()
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}
