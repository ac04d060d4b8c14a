package nexmark_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// The windowed queries read from a topic through a share group give the
// results of the same query on the in-process generator, at volume. Each
// partition of the topic is in event-time order, but a share fetch hands a
// subtask a batch spanning many seconds of event time from one partition:
// a watermark made from what each subtask saw dropped about half of q5's
// bids as late (issue 36). The watermark follows the group's frontier
// instead. After the events, a new person far in the future on every
// partition (no query result depends on it) moves every partition's
// watermark past every window, as the generator's end of input does.
// WEIR_VOLUME=1 runs 200,000 events over more partitions, parallelisms and
// fetch sizes (a broker cap of 200 in-flight records per partition clips
// every fetch to 200); .ci/run does, without the race detector. The cases
// run at once, each on its broker: a query mostly waits for fetches and
// acknowledgements, not for a CPU. The queries of a case run one after the
// other: every query's job is named nexmark, and two jobs of one name on
// one broker share transactional ids and fence each other. A query's
// output is complete once it holds as many results as the in-process
// source's and has not changed for 3 s since.
func TestWindowedQueriesFromATopicEqualTheInProcessSource(t *testing.T) {
	type tc struct {
		events                        int64
		partitions, parallelism, capN int
	}
	cases := []tc{{events: 20_000, partitions: 4, parallelism: 2}}
	if os.Getenv("WEIR_VOLUME") != "" {
		cases = []tc{{200_000, 4, 1, 0}, {200_000, 16, 3, 200}}
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("events=%d/partitions=%d/parallelism=%d/cap=%d", c.events, c.partitions, c.parallelism, c.capN), func(t *testing.T) {
			t.Parallel()
			var opts []broker.Opt
			if c.capN > 0 {
				opts = append(opts, broker.Config("group.share.partition.max.record.locks", strconv.Itoa(c.capN)))
			}
			env := kafkatest.New(t, opts...)
			g := newGen(t, nexmark.GeneratorConfig{Events: c.events, Rate: 200})
			if err := nexmark.WriteToKafka(t.Context(), []string{env.Addr}, "events", int32(c.partitions), g, nil); err != nil {
				t.Fatal(err)
			}
			writeFuturePersons(t, env, "events", c.partitions, g.Event(c.events-1).Time()+30*24*time.Hour.Milliseconds())
			evs := make([]nexmark.Event, c.events)
			for i := range evs {
				evs[i] = g.Event(int64(i))
			}
			for _, q := range []string{"q4", "q5", "q7", "q8", "q11"} {
				t.Run(q, func(t *testing.T) {
					// The number of results the job must reach before
					// its output counts as complete: q4's changelog
					// has one record per winning bid of each category
					// (its count goes up by one each time), the others
					// the in-process source's results.
					var want []any
					var q4 map[int64][2]int64
					wantN := 0
					if q == "q4" {
						q4 = batchQ4(evs)
						for _, acc := range q4 {
							wantN += int(acc[0])
						}
					} else {
						want = runQuery(t, g, q, c.parallelism)
						wantN = len(want)
					}
					if wantN == 0 {
						t.Fatalf("%s has no result on these events: the test proves nothing", q)
					}
					start := time.Now()
					got := runFromTopic(t, env, q, c.parallelism, func(n int) bool { return n >= wantN })
					took := time.Since(start)
					if q == "q4" {
						// The output topic's partitions keep no order
						// across them: the changelog is checked in
						// count order.
						results := decodeAll[nexmark.Q4Result](t, got)
						slices.SortFunc(results, func(a, b any) int {
							x, y := a.(nexmark.Q4Result), b.(nexmark.Q4Result)
							return cmp.Or(cmp.Compare(x.Category, y.Category), cmp.Compare(x.Count, y.Count))
						})
						checkQ4(t, results, q4)
					} else {
						sameRecords(t, raw(got), want)
					}
					t.Logf("%s: %d results equal to the in-process source's, in %v", q, len(got), took.Round(time.Millisecond))
				})
			}
		})
	}
}

// writeFuturePersons writes, to every partition of topic, a new person at
// time ts.
func writeFuturePersons(t *testing.T, env *kafkatest.Env, topic string, partitions int, ts int64) {
	t.Helper()
	cl := env.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := range partitions {
		v, err := nexmark.MarshalEvent(nexmark.Event{Type: nexmark.PersonEvent,
			Person: &nexmark.Person{ID: 1<<40 + int64(p), Name: "future", DateTime: ts}})
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: topic, Partition: int32(p), Value: v,
			Timestamp: time.UnixMilli(ts)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// runFromTopic runs query on the topic "events" as a share group (its own
// group and output topic) with the exactly-once Kafka sink, until done(count)
// holds and the output has not changed for 3 s since (a record more, a
// duplicate, would be in it), and returns the output read_committed.
func runFromTopic(t *testing.T, env *kafkatest.Env, query string, par int, done func(int) bool) []*kgo.Record {
	t.Helper()
	reg := runtime.NewRegistry()
	if err := nexmark.Register(reg); err != nil {
		t.Fatal(err)
	}
	out := query + "-results"
	job, err := reg.Build(nexmark.Name, map[string]string{"query": query, "source": "sharegroup", "sink": "kafka",
		"brokers": env.Addr, "topic": "events", "group": "nexmark-" + query, "output": out,
		"parallelism": strconv.Itoa(par), "idle": "2s"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(ctx, job)
		ended <- err
	}()
	deadline := time.After(3 * time.Minute)
	last, since := -1, time.Now()
	for {
		recs, err := kafkatest.ReadCommitted(t.Context(), []string{env.Addr}, out)
		if err == nil && len(recs) != last {
			last, since = len(recs), time.Now()
		}
		if last >= 0 && done(last) && time.Since(since) > 3*time.Second {
			cancel()
			if err := <-ended; err != nil && ctx.Err() == nil {
				t.Fatal(err)
			}
			return env.ReadCommitted(t, out)
		}
		select {
		case err := <-ended:
			t.Fatalf("%s ended early: %v", query, err)
		case <-deadline:
			t.Fatalf("%s: output not complete and still for 3 s after 3 minutes (%d records)", query, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func raw(recs []*kgo.Record) []any {
	out := make([]any, len(recs))
	for i, r := range recs {
		out[i] = json.RawMessage(r.Value)
	}
	return out
}

func decodeAll[T any](t *testing.T, recs []*kgo.Record) []any {
	t.Helper()
	out := make([]any, len(recs))
	for i, r := range recs {
		var v T
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("result %q: %v", r.Value, err)
		}
		out[i] = v
	}
	return out
}

// The windowed queries on the topic's partitions (source=kafka: offsets in
// checkpoint state, a watermark per partition) with a bounded stop
// (stop=latest): each job ends by itself, its last watermark firing every
// window, and its results, read_committed, equal the in-process source's.
func TestWindowedQueriesOnTheTopicsPartitionsToABoundedStopEqualTheInProcessSource(t *testing.T) {
	const events, par = 10_000, 2
	env := kafkatest.New(t)
	g := newGen(t, nexmark.GeneratorConfig{Events: events, Rate: 200})
	if err := nexmark.WriteToKafka(t.Context(), []string{env.Addr}, "events", 4, g, nil); err != nil {
		t.Fatal(err)
	}
	evs := make([]nexmark.Event, events)
	for i := range evs {
		evs[i] = g.Event(int64(i))
	}
	reg := runtime.NewRegistry()
	if err := nexmark.Register(reg); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"q4", "q5", "q7", "q8", "q11"} {
		t.Run(q, func(t *testing.T) {
			out := q + "-partitions"
			params := map[string]string{"query": q, "source": "kafka", "stop": "latest", "sink": "kafka",
				"brokers": env.Addr, "topic": "events", "group": "nexmark-partitions-" + q, "output": out,
				"parallelism": strconv.Itoa(par), "idle": "2s"}
			if err := reg.Check(t.Context(), nexmark.Name, params); err != nil {
				t.Fatal(err)
			}
			job, err := reg.Build(nexmark.Name, params)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(ctx, job); err != nil {
				t.Fatalf("%s on the partitions with stop=latest: %v", q, err)
			}
			got := env.ReadCommitted(t, out)
			if q == "q4" {
				results := decodeAll[nexmark.Q4Result](t, got)
				slices.SortFunc(results, func(a, b any) int {
					x, y := a.(nexmark.Q4Result), b.(nexmark.Q4Result)
					return cmp.Or(cmp.Compare(x.Category, y.Category), cmp.Compare(x.Count, y.Count))
				})
				checkQ4(t, results, batchQ4(evs))
			} else {
				want := runQuery(t, g, q, par)
				if len(want) == 0 {
					t.Fatalf("%s has no result on these events: the test proves nothing", q)
				}
				sameRecords(t, raw(got), want)
			}
			env.RequireNothingOpen(t, out)
			t.Logf("%s: %d results equal to the in-process source's", q, len(got))
		})
	}
}
