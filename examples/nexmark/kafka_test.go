package nexmark_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// End to end through Kafka: the generator's events written to a topic
// (what `streamctl nexmark generate` does), q1 run by the registered job
// type reading them as a share group and writing exactly once, and the
// results read read_committed: exactly the batch computation's, each once.
func TestQueryThroughAShareGroupToTheExactlyOnceSinkMatchesTheBatchComputation(t *testing.T) {
	const events = 4000
	env := kafkatest.New(t)
	g := newGen(t, nexmark.GeneratorConfig{Events: events, Rate: 1000})
	if err := nexmark.WriteToKafka(t.Context(), []string{env.Addr}, "events", 2, g, nil); err != nil {
		t.Fatal(err)
	}
	evs := make([]nexmark.Event, events)
	for i := range evs {
		evs[i] = g.Event(int64(i))
	}
	want := batchQ1(evs)

	reg := runtime.NewRegistry()
	if err := nexmark.Register(reg); err != nil {
		t.Fatal(err)
	}
	params := map[string]string{"query": "q1", "source": "sharegroup", "sink": "kafka", "brokers": env.Addr,
		"topic": "events", "group": "nexmark-q1", "output": "q1-results", "parallelism": "2"}
	if err := reg.Check(t.Context(), nexmark.Name, params); err != nil {
		t.Fatal(err)
	}
	job, err := reg.Build(nexmark.Name, params)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(50*time.Millisecond)).Run(ctx, job)
		done <- err
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	defer stop()
	deadline := time.After(2 * time.Minute)
	for {
		recs, err := kafkatest.ReadCommitted(t.Context(), []string{env.Addr}, "q1-results")
		if err == nil && len(recs) >= len(want) {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("job ended early: %v", err)
		case <-deadline:
			t.Fatalf("q1-results did not reach %d records: %d read_committed (%v)", len(want), len(recs), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
	var got []any
	for _, r := range env.ReadCommitted(t, "q1-results") {
		var b nexmark.Bid
		if err := json.Unmarshal(r.Value, &b); err != nil {
			t.Fatalf("result %q: %v", r.Value, err)
		}
		got = append(got, b)
	}
	sameRecords(t, got, want)
	env.RequireNothingOpen(t, "q1-results")
	t.Log(strconv.Itoa(len(got)) + " results read_committed, each once")
}
