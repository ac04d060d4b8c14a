package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
)

// streamctlBin is the streamctl binary built once by TestMain; tests run it
// as a separate process. It is written only by TestMain, before any test.
var streamctlBin string

// TestMain builds streamctl once for the process tests and checks for leaked
// goroutines after all tests.
func TestMain(m *testing.M) {
	// The tests wait on processes (clusters, brokers, fixed waits past a
	// record lock) far more than they compute: four at once.
	proctest.DefaultParallel(4)
	os.Exit(proctest.Main(m, ".", "streamctl", &streamctlBin,
		// The HA tests' in-process etcd (server and client) keeps
		// package-level goroutines (its log and the gRPC resolver) beyond
		// Close.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run")))
}

// brokerProc is a `streamctl broker` process.
type brokerProc struct {
	*brokerproc.Proc
	addr string
}

// startBroker starts `streamctl broker args...` and waits for its listening
// line, which must name a loopback address. The process is killed on cleanup
// if still running.
func startBroker(t *testing.T, args ...string) *brokerProc {
	t.Helper()
	p := brokerproc.Run(t, exec.Command(streamctlBin, append([]string{"broker"}, args...)...))
	if !regexp.MustCompile(`^127\.0\.0\.1:\d+$`).MatchString(p.Addr) {
		t.Fatalf("broker listening on %q, want 127.0.0.1:PORT", p.Addr)
	}
	return &brokerProc{Proc: p, addr: p.Addr}
}

// stop sends SIGTERM and checks the broker exits 0 without more stdout.
func (p *brokerProc) stop(t *testing.T) {
	t.Helper()
	p.Stop(t)
	if out := p.Stdout(); out != "" {
		t.Fatalf("broker wrote more to stdout: %q", out)
	}
}

func TestBrokerServesClientsAndKeepsStateAcrossRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	p := startBroker(t, "--listen", "127.0.0.1:0", "--data-dir", dir, "--partitions", "3")

	// Produce plain records to an auto-created topic.
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("plain"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 10 {
		if err := cl.ProduceSync(ctx, kgo.StringRecord(fmt.Sprint("p", i))).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	topics, err := kadm.NewClient(cl).ListTopics(ctx, "plain")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(topics["plain"].Partitions); n != 3 {
		t.Fatalf("auto-created topic has %d partitions, want --partitions 3", n)
	}

	// Consume them with a consumer group (committing offsets).
	cons, err := kgo.NewClient(kgo.SeedBrokers(p.addr), kgo.ConsumeTopics("plain"), kgo.ConsumerGroup("g"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < 10 {
		fs := cons.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("consume: %v", err)
		}
		got += fs.NumRecords()
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit offsets: %v", err)
	}
	cons.Close()

	// A committed transaction on another topic.
	txn, err := kgo.NewClient(kgo.SeedBrokers(p.addr), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("txn"),
		kgo.TransactionalID("t1"))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := txn.ProduceSync(ctx, kgo.StringRecord(fmt.Sprint("t", i))).FirstErr(); err != nil {
			t.Fatalf("transactional produce: %v", err)
		}
	}
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit: %v", err)
	}
	before, err := kafkatest.ReadCommitted(ctx, []string{p.addr}, "txn")
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 5 {
		t.Fatalf("before restart, read committed %d records, want 5", len(before))
	}

	p.stop(t)
	p2 := startBroker(t, "--listen", "127.0.0.1:0", "--data-dir", dir)

	for topic, want := range map[string]int{"plain": 10, "txn": 5} {
		recs, err := kafkatest.ReadCommitted(ctx, []string{p2.addr}, topic)
		if err != nil {
			t.Fatalf("after restart, read %s: %v", topic, err)
		}
		if len(recs) != want {
			t.Errorf("after restart, %s has %d committed records, want %d", topic, len(recs), want)
		}
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(p2.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	offs, err := kadm.NewClient(adm).FetchOffsets(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	var committed int64
	offs.Each(func(o kadm.OffsetResponse) { committed += o.At })
	if committed != 10 {
		t.Errorf("after restart, group g has committed offsets summing to %d, want 10", committed)
	}
	p2.stop(t)
}

func TestBrokerRefusesUnusableSetupsWithOneErrorLine(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"busy port", []string{"--listen", busy.Addr().String()},
			"Error: cannot listen on " + busy.Addr().String() + ": address already in use"},
		{"data dir under a file", []string{"--listen", "127.0.0.1:0", "--data-dir", filepath.Join(file, "data")},
			"Error: data dir " + filepath.Join(file, "data") + " cannot be created: not a directory"},
	}
	if os.Geteuid() != 0 { // root writes anywhere
		ro := filepath.Join(t.TempDir(), "ro")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		tests = append(tests, struct {
			name string
			args []string
			want string
		}{"read-only data dir", []string{"--listen", "127.0.0.1:0", "--data-dir", ro}, "Error: data dir " + ro + " is not writable: permission denied"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(streamctlBin, append([]string{"broker"}, tt.args...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("run: %v, want exit code 1; stderr:\n%s", err, stderr.String())
			}
			if got := strings.TrimSuffix(stderr.String(), "\n"); got != tt.want {
				t.Errorf("stderr = %q, want exactly one line %q", stderr.String(), tt.want)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

// A broker bound to all interfaces, or told to advertise an address that
// does not resolve, says what it bound and what it advertises; stdout's line
// stays the address clients are told.
func TestBrokerReportsBoundAndAdvertisedAddresses(t *testing.T) {
	t.Parallel()
	p := brokerproc.Run(t, exec.Command(streamctlBin, "broker", "--listen", "0.0.0.0:0", "--advertise", "no-such-host.invalid"))
	if !regexp.MustCompile(`^no-such-host\.invalid:\d+$`).MatchString(p.Addr) {
		t.Fatalf("broker listening on %q, want the advertised no-such-host.invalid:PORT", p.Addr)
	}
	_, port, _ := strings.Cut(p.Addr, ":")
	p.Stop(t)
	errOut := p.Stderr()
	for _, want := range []string{"bound", ":" + port, "advertised", "does not resolve"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}
