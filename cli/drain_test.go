package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatest"
)

// The sessions example on a local cluster, every session open (an hour
// of out-of-orderness holds the watermark back), stopped with "stop
// --savepoint DIR --drain": its sources stop reading and emit the final
// watermark before the savepoint's barrier, so every session of the input
// is emitted exactly once (read_committed, record by record), the
// savepoint is written and the job ends FINISHED, its records out the
// sessions written. The same through REST (POST /jobs/{id}/stop with
// "drain": true).
func TestStopWithDrainEmitsEverySessionOfTheSessionsExampleOnce(t *testing.T) {
	for _, via := range []string{"cli", "rest"} {
		t.Run(via, func(t *testing.T) { stopSessionsWithDrain(t, via) })
	}
}

func stopSessionsWithDrain(t *testing.T, via string) {
	reg := testRegistry(t)
	if err := sessions.Register(reg); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := startLocalWith(t, reg, "--taskmanagers", "1", "--slots", "2", "--savepoint-allowed-locations", dir)
	const gap = 30 * time.Second
	var clicks []sessions.Click
	var recs []*kgo.Record
	for i := range 500 {
		cl := sessions.Click{User: fmt.Sprintf("u%02d", i%17), TS: 1_700_000_000_000 + int64(i*7919%400_000)}
		clicks = append(clicks, cl)
		recs = append(recs, &kgo.Record{Topic: "clicks", Key: []byte(cl.User),
			Value: fmt.Appendf(nil, `{"user":%q,"ts":%d,"url":"/p"}`, cl.User, cl.TS)})
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.broker), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	err = cl.ProduceSync(t.Context(), recs...).FirstErr()
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Every session, as the final watermark fires them: the contract's
	// sessions under a watermark past every end.
	want := map[string]int{}
	for _, s := range sessions.Expected(clicks, gap, -gap) {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		want[s.User+"\x00"+string(b)]++
	}

	out, err := c.cli(t, "submit", sessions.Name, "--parallelism", "2", "--checkpoint-interval", "100ms",
		"--set", "brokers="+c.broker, "--set", "out-of-orderness=1h", "--set", "gap="+gap.String())
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	c.waitStatus(t, id, "every click read", func(j jobJSON) bool { return j.RecordsIn >= int64(len(clicks)) })
	if got, err := kafkatest.ReadCommitted(context.WithoutCancel(t.Context()), []string{c.broker}, "sessions"); err != nil || len(got) != 0 {
		t.Fatalf("sessions before the stop: %d, %v; want none (every session open)", len(got), err)
	}

	var sp string
	if via == "rest" {
		jm := "http://" + c.addr(t, "jobmanager http on")
		sp, err = triggerAndWait(t, jm, "/jobs/"+id+"/stop", `{"targetDirectory":"`+dir+`","drain":true}`), nil
	} else {
		out, err = c.cli(t, "stop", id, "--savepoint", dir, "--drain")
		sp = strings.TrimSpace(out)
	}
	if err != nil || filepath.Dir(sp) != dir {
		t.Fatalf("stop --drain: %q, %v; want a savepoint under %s", out, err, dir)
	}
	if _, err := os.Stat(filepath.Join(sp, "_metadata")); err != nil {
		t.Fatalf("savepoint %s: %v", sp, err)
	}
	c.waitStatus(t, id, "FINISHED", func(j jobJSON) bool { return j.State == "FINISHED" })

	got, err := kafkatest.ReadCommitted(context.WithoutCancel(t.Context()), []string{c.broker}, "sessions")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		want[string(r.Key)+"\x00"+string(r.Value)]--
	}
	for k, n := range want {
		switch {
		case n > 0:
			t.Errorf("session missing: %q", k)
		case n < 0:
			t.Errorf("session %q emitted %d extra times", k, -n)
		}
	}
	// The job's records out are the sessions its sink wrote, though the
	// drain fired every one of them after the last heartbeat (the task
	// managers' final counts come with the end of their tasks).
	if st := c.status(t, id); st.Restarts == 0 && st.RecordsOut != int64(len(got)) {
		t.Errorf("status: records out %d, want the %d sessions committed", st.RecordsOut, len(got))
	}
	t.Logf("%d clicks, %d sessions emitted by the stop with drain into %s", len(clicks), len(got), sp)
}

// A savepoint written by "streamctl savepoint" records the job's type and
// parameters (the job manager writes them with it): "state dump" decodes
// it without --job, every word's count equal to the input's.
func TestStateDumpDecodesASavepointOfTheJobManagerWithoutJob(t *testing.T) {
	dir := t.TempDir()
	c := startLocal(t, "--taskmanagers", "1", "--slots", "2", "--savepoint-allowed-locations", dir)
	lines := testLines(300, "d")
	produceLines(t, c.broker, "lines", lines)
	id := c.submitWordcount(t, "100ms")
	want := wordcount.Expected(lines)
	waitCounted(t, c.broker, "counts", want)
	out, err := c.cli(t, "savepoint", id, "--target", dir)
	sp := strings.TrimSpace(out)
	if err != nil || filepath.Dir(sp) != dir {
		t.Fatalf("savepoint --target %s: %q, %v", dir, out, err)
	}
	out, errOut, err := runCLI(t, "state", "dump", sp, "--operator", "count")
	if err != nil {
		t.Fatalf("state dump without --job: %v; %s", err, errOut)
	}
	if strings.Contains(errOut, "no job type") {
		t.Errorf("state dump of the job manager's savepoint: %q, want it decoded with the recorded job type", errOut)
	}
	sameCounts(t, "the job manager's savepoint", dumpedCounts(t, out), want)
}
