package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
)

// bin is this example built once by TestMain.
var bin string

func TestMain(m *testing.M) { os.Exit(proctest.Main(m, ".", "uppercase", &bin)) }

// A job type of a user's own binary (cli.Main with its registry) is
// submitted to a job manager and runs on a task manager, both started from
// that binary: every line comes out upper-cased exactly once,
// read_committed.
func TestCustomJobRunsOnTaskManagersOfTheSameBinary(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := kafkatest.New(t)
	c := proctest.NewCluster(t, bin)
	c.StartTM("tm-a", 2)
	c.WaitTMs("tm-a")
	if out, err := exec.Command(bin, "jobs").Output(); err != nil || !strings.Contains(string(out), "uppercase") || !strings.Contains(string(out), "wordcount") {
		t.Fatalf("jobs: %q, %v; want uppercase and wordcount", out, err)
	}

	cl := env.Client(t, kgo.DefaultProduceTopic("lines"))
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 4, 1, nil, "lines"); err != nil {
		t.Fatal(err)
	}
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 2, 1, nil, "upper"); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = kgo.StringRecord(fmt.Sprintf("line %d of the input", i))
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	id := c.Submit("uppercase", "--parallelism", "2", "--checkpoint-interval", "200ms", "--set", "brokers="+env.Addr)

	seen := map[string]int{}
	for {
		out, err := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "upper")
		if err == nil && len(out) >= n {
			for _, r := range out {
				seen[string(r.Value)]++
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("output has %d of %d lines (%v); job manager stderr:\n%s", len(out), n, err, c.JM.Stderr.Tail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := 0; i < n; i++ {
		if l := fmt.Sprintf("LINE %d OF THE INPUT", i); seen[l] != 1 {
			t.Errorf("%q in the output %d times, want once", l, seen[l])
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct output lines, want %d", len(seen), n)
	}
	if st := c.Status(id); st.State != "RUNNING" || st.Name != "uppercase" {
		t.Errorf("status: %+v", st)
	}
	if _, err := c.Run("cancel", id); err != nil {
		t.Fatal(err)
	}
	c.TMs["tm-a"].Stop(t)
	c.JM.Stop(t)
}
