package wordcount_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/weirtest"
)

// The wordcount tested with the public kit (weirtest), as a user tests a
// job: input in two parts, a task failure injected between them (the job
// restarts from its latest checkpoint), and the committed output every
// word's running count 1..n, each once.
func TestWordcountCountsEveryWordOnceThroughATaskFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	k, err := weirtest.StartKafka(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if err := k.CreateTopic(ctx, "lines", 4, nil); err != nil {
		t.Fatal(err)
	}
	lines := corpus(2000)
	if err := k.ProduceValues(ctx, "lines", lines[:1000]...); err != nil {
		t.Fatal(err)
	}
	job, err := wordcount.Build(runtime.Params{"brokers": k.Addr(), "input": "lines", "output": "counts", "group": "wc",
		"guarantee": "exactly-once", "parallelism": "2"})
	if err != nil {
		t.Fatal(err)
	}
	run, err := weirtest.StartJob(job, weirtest.WithClusterOpts(runtime.Restarts(5, 10*time.Millisecond)))
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
	run.FailNextRecord()
	if err := k.ProduceValues(ctx, "lines", lines[1000:]...); err != nil {
		t.Fatal(err)
	}
	if err := run.WaitRestarts(ctx, 1); err != nil {
		t.Fatal(err)
	}
	want := wordcount.Expected(lines)
	total := 0
	for _, n := range want {
		total += n
	}
	if _, err := run.WaitCommitted(ctx, k, "counts", func(recs []*kgo.Record) bool { return len(recs) >= total }); err != nil {
		t.Fatal(err)
	}
	if err := run.WaitCheckpoints(ctx, 2); err != nil {
		t.Fatal(err)
	}
	out, err := k.ReadCommitted(ctx, "counts")
	if err != nil {
		t.Fatal(err)
	}
	if err := weirtest.CheckRunningCounts(out, want); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d records, %+v", len(out), run.Status())
}
