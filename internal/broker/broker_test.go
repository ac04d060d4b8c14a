package broker_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/kafkatest"
)

func TestMain(m *testing.M) {
	brokerproc.Main()
	goleak.VerifyTestMain(m)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func start(t *testing.T, opts ...broker.Opt) *broker.Broker {
	t.Helper()
	b, err := broker.Start(ctxT(t), opts...)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func client(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func TestDefaultConfigsAreInEffect(t *testing.T) {
	env := kafkatest.New(t)
	rcs, err := env.Admin(t).DescribeBrokerConfigs(ctxT(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rcs.On("0", nil)
	if err != nil {
		t.Fatalf("broker 0 configs: %v", err)
	}
	got := make(map[string]string)
	for _, c := range rc.Configs {
		got[c.Key] = c.MaybeValue()
	}
	defaults := broker.DefaultConfigs()
	if len(defaults) == 0 {
		t.Fatal("no defaults")
	}
	for _, d := range defaults {
		if got[d.Key] != d.Value {
			t.Errorf("%s = %q, want default %q", d.Key, got[d.Key], d.Value)
		}
		if d.Why == "" || d.Kafka == "" {
			t.Errorf("%s: default undocumented", d.Key)
		}
	}
}

func TestConfigOverridesADefault(t *testing.T) {
	env := kafkatest.New(t, broker.Config("group.share.record.lock.duration.ms", "15000"))
	rcs, err := env.Admin(t).DescribeBrokerConfigs(ctxT(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rcs.On("0", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rc.Configs {
		if c.Key == "group.share.record.lock.duration.ms" {
			if c.MaybeValue() != "15000" {
				t.Fatalf("lock duration = %q, want 15000", c.MaybeValue())
			}
			return
		}
	}
	t.Fatal("lock duration not described")
}

func TestMetadataAdvertisesAReachableAddress(t *testing.T) {
	tests := []struct {
		name string
		opts []broker.Opt
		want func(bound string) string // the advertised host:port
	}{
		{"loopback", []broker.Opt{broker.Listen("127.0.0.1:0")}, func(b string) string { return b }},
		{"unspecified host advertises loopback", []broker.Opt{broker.Listen("0.0.0.0:0")}, func(b string) string {
			_, port, _ := net.SplitHostPort(b)
			return "127.0.0.1:" + port
		}},
		{"explicit advertise keeps the bound port", []broker.Opt{broker.Listen("127.0.0.1:0"), broker.Advertise("localhost")}, func(b string) string {
			_, port, _ := net.SplitHostPort(b)
			return "localhost:" + port
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := start(t, tt.opts...)
			want := tt.want(b.Addr())
			if !strings.HasPrefix(b.Addr(), "127.0.0.1:") && !strings.HasPrefix(b.Addr(), "localhost:") {
				t.Fatalf("Addr() = %q, not a reachable loopback address", b.Addr())
			}
			if b.Addr() != want {
				t.Fatalf("Addr() = %q, want %q", b.Addr(), want)
			}
			meta, err := kadm.NewClient(client(t, b.Addr())).BrokerMetadata(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(meta.Brokers) != 1 {
				t.Fatalf("metadata lists %d brokers, want 1", len(meta.Brokers))
			}
			mb := meta.Brokers[0]
			if got := net.JoinHostPort(mb.Host, strconv.Itoa(int(mb.Port))); got != want {
				t.Fatalf("metadata advertises %q, want %q", got, want)
			}
		})
	}
}

func TestAutoCreatedTopicsGetDefaultPartitions(t *testing.T) {
	b := start(t, broker.Partitions(3))
	cl := client(t, b.Addr(), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("auto"))
	if err := cl.ProduceSync(ctxT(t), kgo.StringRecord("x")).FirstErr(); err != nil {
		t.Fatalf("produce to a new topic: %v", err)
	}
	td, err := kadm.NewClient(cl).ListTopics(ctxT(t), "auto")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(td["auto"].Partitions); n != 3 {
		t.Fatalf("auto-created topic has %d partitions, want 3", n)
	}
}

func TestAutoCreateTopicsCanBeDisabled(t *testing.T) {
	b := start(t, broker.AutoCreateTopics(false))
	cl := client(t, b.Addr(), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("auto"))
	ctx, cancel := context.WithTimeout(ctxT(t), 2*time.Second)
	defer cancel()
	err := cl.ProduceSync(ctx, kgo.StringRecord("x")).FirstErr()
	if err == nil {
		t.Fatal("produce to a missing topic succeeded with auto-creation disabled")
	}
	if !errors.Is(err, kerr.UnknownTopicOrPartition) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want unknown topic", err)
	}
}

func TestStartRefusesBadSettings(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		opts    []broker.Opt
		wantIs  []error
		wantMsg string
	}{
		{"busy port", []broker.Opt{broker.Listen(busy.Addr().String())},
			[]error{broker.ErrListen, syscall.EADDRINUSE}, "cannot listen on " + busy.Addr().String() + ": address already in use"},
		{"data dir under a file", []broker.Opt{broker.DataDir(filepath.Join(notDir, "data"))},
			[]error{broker.ErrDataDir, syscall.ENOTDIR}, "cannot be created: not a directory"},
		{"unknown config", []broker.Opt{broker.Config("no.such.config", "1")},
			[]error{broker.ErrInvalidConfig}, `unknown broker config "no.such.config"`},
		{"non-integer config", []broker.Opt{broker.Config("group.share.record.lock.duration.ms", "30s")},
			[]error{broker.ErrInvalidConfig}, "not an integer"},
		{"zero partitions", []broker.Opt{broker.Partitions(0)},
			[]error{broker.ErrInvalidConfig}, "partitions must be at least 1"},
		{"advertise without host", []broker.Opt{broker.Advertise(":9092")},
			[]error{broker.ErrInvalidConfig}, "has no host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := broker.Start(ctxT(t), tt.opts...)
			if err == nil {
				b.Close()
				t.Fatal("Start succeeded")
			}
			for _, target := range tt.wantIs {
				if !errors.Is(err, target) {
					t.Errorf("errors.Is(%v, %v) = false", err, target)
				}
			}
			if !strings.Contains(err.Error(), tt.wantMsg) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line containing %q", err, tt.wantMsg)
			}
		})
	}
}

func TestUnwritableDataDirIsRefused(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root can write to a read-only directory; covered by the not-a-directory case")
	}
	dir := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	_, err := broker.Start(ctxT(t), broker.DataDir(dir))
	if !errors.Is(err, broker.ErrDataDir) || !strings.Contains(err.Error(), "is not writable") {
		t.Fatalf("err = %v, want ErrDataDir not writable", err)
	}
}

func TestDataDirIsLockedWhileABrokerRuns(t *testing.T) {
	dir := t.TempDir()
	first := start(t, broker.DataDir(dir))
	_, err := broker.Start(ctxT(t), broker.DataDir(dir))
	if !errors.Is(err, broker.ErrDataDirLocked) {
		t.Fatalf("second broker on the same dir: err = %v, want ErrDataDirLocked", err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	again := start(t, broker.DataDir(dir))
	if err := again.Close(); err != nil {
		t.Fatalf("close after restart: %v", err)
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	b := start(t, broker.DataDir(t.TempDir()))
	first := b.Close()
	if first != nil {
		t.Fatalf("first close: %v", first)
	}
	if err := b.Close(); err != first {
		t.Fatalf("second close = %v, want the first result %v", err, first)
	}
}

// TestStateSurvivesRestart produces plain records, a committed transaction
// and a transaction left open, restarts the broker on the same data dir and
// port, commits the open transaction with a raw EndTxn from its stored handle
// (what Weir's recovery does), and reads everything back read_committed.
func TestStateSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)

	b1, err := broker.Start(ctx, broker.DataDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	addr := b1.Addr()
	adm := kadm.NewClient(client(t, addr))
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, "t"); err != nil {
		t.Fatal(err)
	}

	plain, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.ProduceSync(ctx, kgo.StringRecord("plain")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	plain.Close()

	txnOpts := []kgo.Opt{kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("t"), kgo.TransactionTimeout(time.Minute)}
	committed, err := kgo.NewClient(append(txnOpts, kgo.TransactionalID("committed"))...)
	if err != nil {
		t.Fatal(err)
	}
	if err := committed.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := committed.ProduceSync(ctx, kgo.StringRecord("in-committed-txn")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := committed.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	committed.Close()

	pending, err := kgo.NewClient(append(txnOpts, kgo.TransactionalID("pending"))...)
	if err != nil {
		t.Fatal(err)
	}
	if err := pending.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := pending.ProduceSync(ctx, kgo.StringRecord("in-pending-txn")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pid, epoch, err := pending.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if err := b1.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	pending.Close() // after the broker: it must not end the transaction

	b2 := start(t, broker.DataDir(dir), broker.Listen(addr))
	env := &kafkatest.Env{Addr: b2.Addr(), Broker: b2}
	if got := valuesOf(env.ReadCommitted(t, "t")); got != "in-committed-txn,plain" {
		t.Fatalf("after restart, read committed = %q, want the plain record and the committed transaction", got)
	}

	req := kmsg.NewPtrEndTxnRequest()
	req.TransactionalID = "pending"
	req.ProducerID = pid
	req.ProducerEpoch = epoch
	req.Commit = true
	resp, err := req.RequestWith(ctx, client(t, b2.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		t.Fatalf("commit the pending transaction after restart: %v", err)
	}
	if got := valuesOf(env.ReadCommitted(t, "t")); got != "in-committed-txn,in-pending-txn,plain" {
		t.Fatalf("after committing the restored transaction, read committed = %q", got)
	}
}

// valuesOf returns the sorted record values, comma separated.
func valuesOf(recs []*kgo.Record) string {
	vs := make([]string, 0, len(recs))
	for _, r := range recs {
		vs = append(vs, string(r.Value))
	}
	slices.Sort(vs)
	return strings.Join(vs, ",")
}
