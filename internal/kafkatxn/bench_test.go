package kafkatxn

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
)

// benchEpoch is the number of records per checkpoint epoch.
const benchEpoch = 10_000

// BenchmarkTxnWriter compares the exactly-once writer (one transaction per
// epoch of benchEpoch records, pre-commit and commit at every barrier) with
// plain idempotent kgo produce flushed at the same barriers, on the same
// in-process broker, 50-byte values over 3 partitions.
func BenchmarkTxnWriter(b *testing.B) {
	value := make([]byte, 50)
	ctx := context.Background()
	txnWriter := func(b *testing.B, opts ...Opt) {
		c := newCluster(b)
		w := newWriter(b, ctx, c.ListenAddrs(), append([]Opt{ClientOpts(kgo.ProducerLinger(time.Millisecond))}, opts...)...)
		defer w.Close()
		if err := w.Recover(ctx, nil); err != nil {
			b.Fatal(err)
		}
		id := checkpoint.ID(0)
		barrier := func() {
			id++
			if _, _, err := w.PreCommit(ctx, id); err != nil {
				b.Fatal(err)
			}
			if err := w.Commit(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if err := w.Write(ctx, &kgo.Record{Topic: testTopic, Partition: int32(i % testPartitions), Value: value}); err != nil {
				b.Fatal(err)
			}
			if (i+1)%benchEpoch == 0 {
				barrier()
			}
		}
		barrier()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	}
	// txn-writer locks in Write; txn-writer-owned is the sink's writer
	// (SingleGoroutine), which does not.
	b.Run("txn-writer", func(b *testing.B) { txnWriter(b) })
	b.Run("txn-writer-owned", func(b *testing.B) { txnWriter(b, SingleGoroutine()) })
	b.Run("plain-produce", func(b *testing.B) {
		c := newCluster(b)
		cl := newClient(b, c.ListenAddrs(), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(time.Millisecond))
		var failed error
		promise := func(_ *kgo.Record, err error) {
			if err != nil && failed == nil {
				failed = err
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			cl.Produce(ctx, &kgo.Record{Topic: testTopic, Partition: int32(i % testPartitions), Value: value}, promise)
			if (i+1)%benchEpoch == 0 {
				if err := cl.Flush(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := cl.Flush(ctx); err != nil || failed != nil {
			b.Fatal(err, failed)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	})
}
