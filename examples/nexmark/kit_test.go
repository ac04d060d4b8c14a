package nexmark_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/weirtest"
)

// A Nexmark query tested with the public kit (weirtest), as a user tests
// a job: the generator's events in a topic, q1 reading them as a share
// group, a task failure injected between the first half of the events and
// the second (the job restarts from its latest checkpoint), and the
// results read read_committed: exactly the batch computation's, each once.
func TestAQueryIsExactlyOnceThroughATaskFailure(t *testing.T) {
	const events = 4000
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	k, err := weirtest.StartKafka(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if err := k.CreateTopic(ctx, "events", 2, nil); err != nil {
		t.Fatal(err)
	}
	g := newGen(t, nexmark.GeneratorConfig{Events: events, Rate: 1000})
	evs := make([]nexmark.Event, events)
	recs := make([]*kgo.Record, events)
	for i := range evs {
		evs[i] = g.Event(int64(i))
		v, err := nexmark.MarshalEvent(evs[i])
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = &kgo.Record{Value: v}
	}
	var want []string
	for _, r := range batchQ1(evs) {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, string(b))
	}

	reg := runtime.NewRegistry()
	if err := nexmark.Register(reg); err != nil {
		t.Fatal(err)
	}
	job, err := reg.Build(nexmark.Name, map[string]string{"query": "q1", "source": "sharegroup", "sink": "kafka",
		"brokers": k.Addr(), "topic": "events", "group": "nexmark-q1", "output": "q1-results", "parallelism": "2"})
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
	if err := k.Produce(ctx, "events", recs[:events/2]...); err != nil {
		t.Fatal(err)
	}
	if err := run.WaitCheckpoints(ctx, 1); err != nil {
		t.Fatal(err)
	}
	run.FailNextRecord()
	if err := k.Produce(ctx, "events", recs[events/2:]...); err != nil {
		t.Fatal(err)
	}
	if err := run.WaitRestarts(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := run.WaitCommitted(ctx, k, "q1-results", func(recs []*kgo.Record) bool { return len(recs) >= len(want) }); err != nil {
		t.Fatal(err)
	}
	if err := run.WaitCheckpoints(ctx, 2); err != nil {
		t.Fatal(err)
	}
	out, err := k.ReadCommitted(ctx, "q1-results")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(out))
	for i, r := range out {
		var q nexmark.Bid
		if err := json.Unmarshal(r.Value, &q); err != nil {
			t.Fatalf("result %q: %v", r.Value, err)
		}
		b, _ := json.Marshal(q)
		got[i] = string(b)
	}
	if err := weirtest.CheckEachOnce(got, want); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d results, %+v", len(got), run.Status())
}
