package sharegroup

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// stampCollector records each value with the event timestamp it was
// emitted with.
type stampCollector struct{ ts map[string][]int64 }

func (c *stampCollector) Collect(v string) { c.CollectWithTimestamp(v, -1) }
func (c *stampCollector) CollectWithTimestamp(v string, ts int64) {
	c.ts[v] = append(c.ts[v], ts)
}

// A record's event timestamp is its Kafka record timestamp by default (the
// producer's CreateTime here): every record once, with its own timestamp.
func TestRecordsCarryTheirKafkaTimestampAsEventTime(t *testing.T) {
	const n = 50
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 2, nil)
	base := time.UnixMilli(1_700_000_000_000)
	cl := env.Client(t, kgo.DefaultProduceTopic("in"))
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		r := kgo.StringRecord(strconv.Itoa(i))
		r.Timestamp = base.Add(time.Duration(i*37%n) * time.Second) // out of order
		recs = append(recs, r)
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s := openSource(t, env, 0, nil)
	c := &stampCollector{ts: map[string][]int64{}}
	for deadline := time.Now().Add(20 * time.Second); len(c.ts) < n && time.Now().Before(deadline); {
		if err := s.Poll(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		want := base.Add(time.Duration(i*37%n) * time.Second).UnixMilli()
		got := c.ts[strconv.Itoa(i)]
		if len(got) != 1 || got[0] != want {
			t.Errorf("record %d: emitted with timestamps %v, want once with %d", i, got, want)
		}
	}
}

// releaser emits each record when the watermark passes its timestamp.
type releaser struct{}

func (releaser) Open(context.Context, *runtime.StateRegistry[string]) error { return nil }
func (releaser) ProcessElement(ctx *runtime.KeyedContext[string], _ string, _ runtime.Collector[string]) error {
	ctx.TimerService().RegisterEventTimeTimer(ctx.Timestamp())
	return nil
}
func (releaser) OnTimer(ctx *runtime.KeyedContext[string], _ int64, out runtime.Collector[string]) error {
	out.Collect(ctx.Key())
	return nil
}

// More subtasks than partitions: the share group feeds one partition to
// three subtasks, some of which get nothing. With an idleness timeout they
// do not stall the watermark: every record but the newest (the watermark is
// its timestamp minus 1) is released by an event-time timer, each once,
// while the input never ends.
func TestMoreSubtasksThanPartitionsDoNotStallTheWatermark(t *testing.T) {
	const n = 40
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	base := time.UnixMilli(1_700_000_000_000)
	cl := env.Client(t, kgo.DefaultProduceTopic("in"))
	for i := 0; i < n; i++ {
		r := kgo.StringRecord(strconv.Itoa(i))
		r.Timestamp = base.Add(time.Duration(i) * time.Second)
		if err := cl.ProduceSync(t.Context(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	got := map[string]int{}
	var restarts atomic.Int32
	j := runtime.NewJob("stall", runtime.MaxParallelism(8))
	ws := runtime.ForMonotonousTimestamps[string](runtime.WithIdleness(300*time.Millisecond),
		runtime.WithWatermarkInterval(20*time.Millisecond))
	src := runtime.FromSource(j, "src", testSources(t, env), runtime.Parallelism(3), runtime.Watermarks(ws))
	released := runtime.ProcessKeyed(runtime.KeyBy(src, func(v string) string { return v }, nil), "release",
		func() runtime.KeyedProcessor[string, string, string] { return releaser{} }, runtime.Parallelism(2))
	runtime.SinkTo(released, "sink", runtime.SinkFunc(func(_ context.Context, v string) error {
		mu.Lock()
		defer mu.Unlock()
		got[v]++
		return nil
	}), runtime.Parallelism(2))
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond), runtime.Logger(testLogger(t)),
			runtime.OnRestart(func(int, error) { restarts.Add(1) })).Run(ctx, j)
		done <- err
	}()
	for {
		mu.Lock()
		k := len(got)
		mu.Unlock()
		if k >= n-1 || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	for i := 0; i < n-1; i++ {
		if c := got[strconv.Itoa(i)]; c == 0 || (c > 1 && restarts.Load() == 0) {
			t.Errorf("record %d released %d times, want once", i, c)
		}
	}
	if got[strconv.Itoa(n-1)] != 0 {
		t.Errorf("the newest record was released before the watermark passed it")
	}
}
