package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
	weirruntime "github.com/weirstream/weir/runtime"
)

// localCluster runs "streamctl local" in-process until the test ends.
type localCluster struct {
	broker, jm string
	out, errs  *proctest.Buffer
}

func startLocal(t *testing.T, args ...string) *localCluster {
	t.Helper()
	return startLocalWith(t, testRegistry(t), args...)
}

// startLocalWith is startLocal with the job types of reg.
func startLocalWith(t *testing.T, reg *weirruntime.Registry, args ...string) *localCluster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &localCluster{out: &proctest.Buffer{}, errs: &proctest.Buffer{}}
	done := make(chan error, 1)
	go func() {
		root := newRootCmd(reg, c.out, c.errs)
		root.SetArgs(append([]string{"local", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--broker-port", "0"}, args...))
		done <- root.ExecuteContext(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("local: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("local did not stop within 60s")
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("local stderr:\n%s", c.errs.String())
		}
	})
	// Jobs are submitted after "cluster ready": before it a task manager
	// may not have registered its slots yet.
	re := regexp.MustCompile(`(?m)^(?:broker listening on|using broker) (\S+)\n(?s:.*?)^jobmanager listening on (\S+)\n(?s:.*)^cluster ready: `)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := re.FindStringSubmatch(c.out.String()); m != nil {
			c.broker, c.jm = m[1], m[2]
			return c
		}
		select {
		case err := <-done:
			t.Fatalf("local ended: %v\n%s", err, c.errs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("local printed no addresses and no readiness in 30s: %q", c.out.String())
		}
	}
}

// cli runs one client command against the cluster.
func (c *localCluster) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, _, err := runCLI(t, append(args, "--jobmanager", c.jm)...)
	return out, err
}

func (c *localCluster) status(t *testing.T, id string) jobJSON {
	t.Helper()
	out, err := c.cli(t, "status", id, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var j jobJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("status --output json: %v: %q", err, out)
	}
	return j
}

// submitWordcount submits wordcount (parallelism 2, lines -> counts) and
// returns what submit printed, trimmed.
func (c *localCluster) submitWordcount(t *testing.T, interval string) string {
	t.Helper()
	id, err := c.cli(t, "submit", "wordcount", "--parallelism", "2", "--checkpoint-interval", interval,
		"--set", "brokers="+c.broker, "--set", "input=lines", "--set", "output=counts")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(id)
}

func produceLines(t *testing.T, brokers, topic string, lines []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(lines))
	for i, l := range lines {
		recs[i] = kgo.StringRecord(l)
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func testLines(n int, salt string) []string {
	words := strings.Fields("alpha beta gamma delta epsilon zeta eta theta")
	lines := make([]string, n)
	for i := range lines {
		lines[i] = fmt.Sprintf("%s %s %s%d", words[i%len(words)], words[(i*3)%len(words)], salt, i%37)
	}
	return lines
}

// waitCounted waits until the job's output holds every expected count
// read_committed, then verifies every record: each word counted 1..n, no
// duplicate, no gap.
func waitCounted(t *testing.T, brokers, output string, want map[string]int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		rep, err := wordcount.Verify(t.Context(), []string{brokers}, output, want)
		if err == nil && rep.OK() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("output %s not exactly-once after 90s: %v %v", output, rep, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// A job submitted to a local cluster runs on its task managers, counts
// every word exactly once, and a cancel ends it CANCELED.
func TestSubmittedWordcountRunsExactlyOnceOnTheTaskManagers(t *testing.T) {
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2")
	lines := testLines(600, "w")
	produceLines(t, c.broker, "lines", lines)
	id := c.submitWordcount(t, "200ms")
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(id) {
		t.Fatalf("submit printed %q, want a job id alone", id)
	}
	want := wordcount.Expected(lines)
	waitCounted(t, c.broker, "counts", want)
	st := c.status(t, id)
	if st.State != "RUNNING" || st.Name != "wordcount" || st.LastCompletedCheckpoint == 0 {
		t.Fatalf("status of a running job: %+v", st)
	}
	// Records in and out of the attempt: every line once, a count for
	// every word (wordcount emits one per occurrence), once the task
	// managers' heartbeats carried the last of them.
	words := 0
	for _, n := range want {
		words += n
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st = c.status(t, id)
		if st.Restarts > 0 {
			t.Logf("the job restarted (%+v): an attempt counts what it replays, so the counts are not checked", st)
			break
		}
		if st.RecordsIn == int64(len(lines)) && st.RecordsOut == int64(words) {
			break
		}
		if st.RecordsIn > int64(len(lines)) || st.RecordsOut > int64(words) || time.Now().After(deadline) {
			t.Fatalf("status counts records in %d, out %d; want %d lines in, %d counts out", st.RecordsIn, st.RecordsOut, len(lines), words)
		}
	}
	out, err := c.cli(t, "cancel", id, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var cj jobJSON
	if err := json.Unmarshal([]byte(out), &cj); err != nil || cj.State != "CANCELED" {
		t.Fatalf("cancel answered %q (%v), want state CANCELED", out, err)
	}
}

// local --broker HOST:PORT runs no broker, and says which one it uses
// instead of "broker listening on".
func TestLocalWithABrokerAddressSaysItUsesItAndRunsNone(t *testing.T) {
	env := kafkatest.New(t)
	c := startLocal(t, "--broker", env.Addr, "--taskmanagers", "1")
	out := c.out.String()
	if c.broker != env.Addr || !strings.Contains(out, "using broker "+env.Addr+"\n") || strings.Contains(out, "broker listening") {
		t.Errorf("local --broker %s printed %q; want \"using broker %s\" and no \"broker listening\"", env.Addr, out, env.Addr)
	}
}
