package nexmark_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
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

// keepDeployments deploys every attempt in process and keeps them, to read
// their record counts once the job ended.
type keepDeployments struct {
	job  *runtime.Job
	mu   sync.Mutex
	deps []runtime.Deployed
}

func (k *keepDeployments) Deploy(ctx context.Context, spec runtime.DeploySpec, rep runtime.TaskReports) (runtime.Deployed, error) {
	d, err := runtime.Deploy(ctx, k.job, spec, nil, rep)
	if err == nil {
		k.mu.Lock()
		k.deps = append(k.deps, d)
		k.mu.Unlock()
	}
	return d, err
}

// The job's records out (what `list`, `status` and REST's write-records
// report) are the results its Kafka sink wrote: q5's sliding windows fire
// on watermarks, the last ones on the final watermark after the last
// batch, and every one of them counts, as many as the output topic holds
// committed.
func TestQ5sRecordsOutAreTheResultsCommittedToKafka(t *testing.T) {
	env := kafkatest.New(t)
	reg := runtime.NewRegistry()
	if err := nexmark.Register(reg); err != nil {
		t.Fatal(err)
	}
	params := map[string]string{"query": "q5", "source": "generator", "events": "3000", "rate": "1000",
		"sink": "kafka", "brokers": env.Addr, "output": "q5-results", "parallelism": "2"}
	if err := reg.Check(t.Context(), nexmark.Name, params); err != nil {
		t.Fatal(err)
	}
	job, err := reg.Build(nexmark.Name, params)
	if err != nil {
		t.Fatal(err)
	}
	dep := &keepDeployments{job: job}
	if _, err := runtime.NewMiniCluster(runtime.Deployment(dep), runtime.Restarts(0, 0),
		runtime.CheckpointInterval(50*time.Millisecond)).Run(t.Context(), job); err != nil {
		t.Fatal(err)
	}
	if len(dep.deps) != 1 {
		t.Fatalf("%d attempts, want 1", len(dep.deps))
	}
	committed := len(env.ReadCommitted(t, "q5-results"))
	if committed == 0 {
		t.Fatal("no committed q5 result")
	}
	if out := dep.deps[0].Counts().Out; out != int64(committed) {
		t.Errorf("records out %d, want the %d results committed to q5-results", out, committed)
	}
}
