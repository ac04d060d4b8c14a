package sharegroup

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

const childEnv = "WEIR_SHAREGROUP_CRASH_CHILD"

// TestCrashChild is the process that crashes: it runs only when re-executed
// by TestConsumerCrashMidTransaction. It acquires every record, writes its
// ack marker into a pre-committed transaction, says so, and waits to be
// killed.
func TestCrashChild(t *testing.T) {
	addr := os.Getenv(childEnv)
	if addr == "" {
		t.Skip("helper process for TestConsumerCrashMidTransaction")
	}
	s := openChildSource(t, addr, 1, 100)
	c := &sliceCollector{}
	for len(c.vals) < 50 {
		if err := s.Poll(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Snapshot(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("HOLDING %d\n", len(c.vals))
	time.Sleep(time.Minute) // killed long before
}

// openChildSource opens, in a helper process, the one subtask of a source
// reading topic "in" as group "g" from addr with lanes lanes of batch
// records.
func openChildSource(t *testing.T, addr string, lanes, batch int) *Source[string] {
	t.Helper()
	newSrc, err := New(func(r *kgo.Record) (string, error) { return string(r.Value), nil },
		Brokers(addr), Topics("in"), Group("g"), Lanes(lanes), BatchSize(batch))
	if err != nil {
		t.Fatal(err)
	}
	s := newSrc().(*Source[string])
	if err := s.Open(context.Background(), &runtime.OperatorContext{Job: "job", UID: "src", Parallelism: 1, Logger: zap.NewNop()}); err != nil {
		t.Fatal(err)
	}
	return s
}

// A consumer process killed mid-transaction (records acquired and emitted,
// marker pre-committed, nothing committed): after the restart its records
// come back and are processed exactly once, none lost.
func TestConsumerCrashMidTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	env := kafkatest.New(t, broker.Config("group.share.record.lock.duration.ms", "2000"),
		broker.Config("share.record.lock.sweep.interval.ms", "100"))
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 50)

	killChildHoldingRecords(t, env)

	// The restarted subtask: checkpoint 1 never completed, so nothing is
	// restored; recovery aborts the dead process's marker transaction.
	start := time.Now()
	b := openSource(t, env, 0, nil)
	got := pollFor(t, b, 50, 20*time.Second)
	seen := map[string]int{}
	for _, v := range got {
		seen[v]++
	}
	if len(got) != 50 || len(seen) != 50 {
		t.Fatalf("after the crash %d records (%d distinct) came back, want each of the 50 once", len(got), len(seen))
	}
	t.Logf("records back %v after the kill", time.Since(start))
}

// killChildHoldingRecords runs TestCrashChild in a child process against
// env, waits until it holds all 50 records of "in" with its ack marker
// pre-committed (transactional ids "weir-job-src-0-<n>"), and SIGKILLs it.
func killChildHoldingRecords(t *testing.T, env *kafkatest.Env) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+env.Addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	holding := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "HOLDING") {
				holding <- sc.Text()
			}
		}
		close(holding)
	}()
	select {
	case line, ok := <-holding:
		if !ok || line != "HOLDING 50" {
			t.Fatalf("child did not reach its crash point (%q)", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("child timed out")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}
