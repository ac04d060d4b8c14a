package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
	"github.com/weirstream/weir/runtime"
)

// The windowed Nexmark queries read from a topic through a share group
// survive a task-manager SIGKILL with the in-process generator's results
// (issue 36): 60,000 events at 1,000 a second of event time (a minute,
// the q5 case) on 8 partitions, each in event-time order, then a
// new person far in the future on every partition so every window closes.
// q4, q5, q7, q8 and q11 run as five jobs (parallelism 2) on two task
// manager processes; once each has committed output, one task manager is
// SIGKILLed and a third started; every job restarts, and each output topic
// then holds exactly the generator run's results (q4's changelog in count
// order), read_committed.
func TestWindowedNexmarkFromATopicThroughATaskManagerSIGKILLEqualsTheGenerator(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	b := &crashingBroker{t: t, dir: t.TempDir()}
	b.start()
	g, err := nexmark.NewGenerator(nexmark.GeneratorConfig{Events: 60_000, Rate: 1000, BaseTime: nexmark.DefaultBaseTime})
	if err != nil {
		t.Fatal(err)
	}
	if err := nexmark.WriteToKafka(ctx, []string{b.addr}, "events", 8, g, nil); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	future := g.Event(59_999).Time() + 30*24*time.Hour.Milliseconds()
	for p := range int32(8) {
		v, err := nexmark.MarshalEvent(nexmark.Event{Type: nexmark.PersonEvent,
			Person: &nexmark.Person{ID: 1<<40 + int64(p), Name: "future", DateTime: future}})
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "events", Partition: p, Value: v, Timestamp: time.UnixMilli(future)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	queries := []string{"q4", "q5", "q7", "q8", "q11"}
	want := map[string][]string{}
	for _, q := range queries {
		want[q] = generatorResults(t, ctx, g, q)
	}
	c := proctest.NewCluster(t, streamctlBin)
	c.StartTM("tm-a", 6)
	c.StartTM("tm-b", 6)
	c.WaitTMs("tm-a,tm-b")
	defer func() {
		if t.Failed() {
			t.Logf("%s\nbroker stderr:\n%s", c.Logs(80), b.stderr())
		}
	}()
	ids := map[string]string{}
	for _, q := range queries {
		ids[q] = c.Submit("nexmark", "--parallelism", "2", "--checkpoint-interval", "200ms", "--set", "query="+q,
			"--set", "source=sharegroup", "--set", "sink=kafka", "--set", "brokers="+b.addr, "--set", "topic=events",
			"--set", "group=nexmark-"+q, "--set", "output="+q+"-results", "--set", "idle=2s")
	}
	outputs := func(q string) []*kgo.Record {
		recs, err := kafkatest.ReadCommitted(ctx, []string{b.addr}, q+"-results")
		if err != nil {
			return nil
		}
		return recs
	}
	for _, q := range queries {
		for len(outputs(q)) == 0 {
			if ctx.Err() != nil {
				t.Fatalf("%s: no output before the kill", q)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	c.TMs["tm-a"].Kill(t)
	c.StartTM("tm-c", 6)
	for _, q := range queries {
		c.WaitStatus(ids[q], q+" restarted", func(s proctest.JobStatus) bool { return s.Restarts >= 1 && s.State == "RUNNING" })
	}
	for _, q := range queries {
		var got []string
		for {
			got = got[:0]
			for _, r := range outputs(q) {
				got = append(got, string(r.Value))
			}
			if len(got) >= len(want[q]) || ctx.Err() != nil {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		time.Sleep(time.Second) // nothing more may come
		got = got[:0]
		for _, r := range outputs(q) {
			got = append(got, string(r.Value))
		}
		if q == "q4" {
			// Winners of auctions that close together reach a category
			// in any order: the changelog must count 1..n with each
			// average its sum over its count, and end where the
			// generator run ends.
			if err := sameQ4(sortQ4(t, got), want[q]); err != nil {
				t.Errorf("q4: %v", err)
			} else {
				t.Logf("q4: %d results, every category's changelog ending where the generator run's does", len(got))
			}
			continue
		}
		slices.Sort(got)
		w := slices.Sorted(slices.Values(want[q]))
		if !slices.Equal(got, w) {
			t.Errorf("%s: %d results read_committed, the generator run %d: not the same records", q, len(got), len(w))
			continue
		}
		t.Logf("%s: %d results equal to the generator run's, each once", q, len(got))
	}
	for _, q := range queries {
		if _, err := c.Run("cancel", ids[q]); err != nil {
			t.Logf("cancel %s: %v", q, err)
		}
	}
}

// generatorResults runs query on g in this process (the in-process source)
// and returns its results as the Kafka sink writes them (JSON), q4's in
// count order per category.
func generatorResults(t *testing.T, ctx context.Context, g *nexmark.Generator, query string) []string {
	t.Helper()
	j, events := nexmark.GeneratorJob("nexmark-"+query, g, runtime.DefaultParallelism(2))
	var mu sync.Mutex
	var out []string
	if err := nexmark.AddQuery(query, events, nexmark.Sinks{Collect: func(v any) {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		mu.Lock()
		out = append(out, string(b))
		mu.Unlock()
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(200*time.Millisecond)).Run(ctx, j); err != nil {
		t.Fatal(err)
	}
	if query == "q4" {
		return sortQ4(t, out)
	}
	return out
}

// sameQ4 checks q4's changelog got (in count order) against the generator
// run's want: per category the counts 1..n, each average the sum over the
// count, and the last count and sum the generator's.
func sameQ4(got, want []string) error {
	last := func(recs []string) (map[int64]nexmark.Q4Result, error) {
		m := map[int64]nexmark.Q4Result{}
		for _, s := range recs {
			var r nexmark.Q4Result
			if err := json.Unmarshal([]byte(s), &r); err != nil {
				return nil, err
			}
			prev := m[r.Category]
			if r.Count != prev.Count+1 || r.Avg != float64(r.Sum)/float64(r.Count) {
				return nil, fmt.Errorf("category %d: %+v after %+v", r.Category, r, prev)
			}
			m[r.Category] = r
		}
		return m, nil
	}
	g, err := last(got)
	if err != nil {
		return err
	}
	w, err := last(want)
	if err != nil {
		return fmt.Errorf("the generator run: %w", err)
	}
	if len(g) != len(w) {
		return fmt.Errorf("%d categories, the generator run %d", len(g), len(w))
	}
	for c, r := range w {
		if g[c] != r {
			return fmt.Errorf("category %d ends at %+v, the generator run at %+v", c, g[c], r)
		}
	}
	return nil
}

// sortQ4 orders q4's changelog by category and count: a topic's partitions
// keep no order across them.
func sortQ4(t *testing.T, recs []string) []string {
	t.Helper()
	rs := make([]nexmark.Q4Result, len(recs))
	for i, r := range recs {
		if err := json.Unmarshal([]byte(r), &rs[i]); err != nil {
			t.Fatalf("q4 result %q: %v", r, err)
		}
	}
	slices.SortFunc(rs, func(a, b nexmark.Q4Result) int {
		return cmp.Or(cmp.Compare(a.Category, b.Category), cmp.Compare(a.Count, b.Count))
	})
	out := make([]string, len(rs))
	for i, r := range rs {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = string(b)
	}
	return out
}
