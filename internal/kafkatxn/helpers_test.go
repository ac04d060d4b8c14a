package kafkatxn

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/weirstream/weir/internal/broker/brokerproc"
)

const (
	testTopic      = "out"
	testPartitions = 3
)

func TestMain(m *testing.M) {
	brokerproc.Main() // a child process started by brokerproc.Start runs a broker here
	goleak.VerifyTestMain(m)
}

// newCluster starts an in-process single-broker kfake cluster with the
// test topic; it is closed when the test ends.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(testPartitions, testTopic)}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newWriter makes a writer on c that places records on r.Partition.
func newWriter(t testing.TB, ctx context.Context, addrs []string, opts ...Opt) *TxnWriter {
	t.Helper()
	base := []Opt{
		Brokers(addrs...),
		TransactionalIDPrefix("weir-test"),
		ClientOpts(kgo.RecordPartitioner(kgo.ManualPartitioner())),
	}
	w, err := NewTxnWriter(ctx, append(base, opts...)...)
	if err != nil {
		t.Fatalf("NewTxnWriter: %v", err)
	}
	return w
}

// crash simulates the death of the writer's process: every client is
// closed without ending any transaction (kgo's Close sends no EndTxn), so
// open and pre-committed transactions stay open at the broker, exactly as
// after a SIGKILL. The writer is unusable afterwards.
func (w *TxnWriter) crash() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	w.closeClients()
}

func rec(partition int32, value string) *kgo.Record {
	return &kgo.Record{Topic: testTopic, Partition: partition, Value: []byte(value)}
}

func newClient(t testing.TB, addrs []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// readCommitted reads the whole test topic read_committed and returns the
// values of each partition in offset order. It requires that no
// transaction is open (last stable offset == high watermark), which it
// checks first.
func readCommitted(t testing.TB, ctx context.Context, addrs []string) [testPartitions][]string {
	t.Helper()
	adm := kadm.NewClient(newClient(t, addrs))
	ends, err := adm.ListEndOffsets(ctx, testTopic)
	if err != nil {
		t.Fatalf("ListEndOffsets: %v", err)
	}
	stable, err := adm.ListCommittedOffsets(ctx, testTopic)
	if err != nil {
		t.Fatalf("ListCommittedOffsets: %v", err)
	}
	end := make(map[int32]int64)
	ends.Each(func(o kadm.ListedOffset) {
		end[o.Partition] = o.Offset
		if s, ok := stable.Lookup(testTopic, o.Partition); !ok || s.Offset != o.Offset {
			t.Fatalf("partition %d: last stable offset %d != high watermark %d: a transaction is still open", o.Partition, s.Offset, o.Offset)
		}
	})
	cl := newClient(t, addrs,
		kgo.ConsumeTopics(testTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)
	var out [testPartitions][]string
	next := make(map[int32]int64)
	done := func() bool {
		for p, e := range end {
			if next[p] < e {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s read_committed: %v (at %v, end %v)", testTopic, err, next, end)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			next[r.Partition] = r.Offset + 1
			if r.Attrs.IsControl() {
				return
			}
			out[r.Partition] = append(out[r.Partition], string(r.Value))
		})
	}
	return out
}

func fmtParts(ps [testPartitions][]string) string {
	s := ""
	for i, p := range ps {
		s += fmt.Sprintf("\n  p%d: %v", i, p)
	}
	return s
}
