package uppercase_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/weirstream/weir/examples/uppercase"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/weirtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The uppercase job tested with the public kit (weirtest), as a user tests
// a job: lines written before and after a restart of the job from its
// latest checkpoint (as a new job manager resumes it), one batch in an
// aborted transaction; every committed line is upper-cased exactly once.
func TestUppercaseIsExactlyOnceAcrossAJobRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	k, err := weirtest.StartKafka(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for _, topic := range []string{"lines", "upper"} {
		if err := k.CreateTopic(ctx, topic, 2, nil); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	write := func(from, to int) {
		t.Helper()
		var lines []string
		for i := from; i < to; i++ {
			lines = append(lines, fmt.Sprintf("line %d", i))
			want = append(want, fmt.Sprintf("LINE %d", i))
		}
		if err := k.ProduceValues(ctx, "lines", lines...); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 500)
	job, err := uppercase.Build(runtime.Params{"brokers": k.Addr(), "input": "lines", "group": "upper", "output": "upper"})
	if err != nil {
		t.Fatal(err)
	}
	run, err := weirtest.StartJob(job)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := run.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	if err := run.WaitCheckpoints(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := run.RestartJob(ctx); err != nil {
		t.Fatal(err)
	}
	if err := k.ProduceTxn(ctx, "aborted", false, "lines", &kgo.Record{Value: []byte("aborted line")}); err != nil {
		t.Fatal(err)
	}
	write(500, 1000)
	if _, err := run.WaitCommitted(ctx, k, "upper", func(recs []*kgo.Record) bool { return len(recs) >= len(want) }); err != nil {
		t.Fatal(err)
	}
	if err := run.WaitCheckpoints(ctx, 2); err != nil { // nothing more may come
		t.Fatal(err)
	}
	out, err := k.ReadCommitted(ctx, "upper")
	if err != nil {
		t.Fatal(err)
	}
	if err := weirtest.CheckEachOnce(weirtest.Values(out), want); err != nil {
		t.Fatal(err)
	}
	if s := run.Status(); s.Runs != 2 || s.RestoredFrom == 0 {
		t.Fatalf("status %+v: want a second run restored from a checkpoint", s)
	}
}
