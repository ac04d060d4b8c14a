package weirtest_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/uppercase"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/weirtest"
)

// Event is an input record of the examples: a user did something at TS
// (epoch ms).
type Event struct {
	User string
	TS   int64
}

// idleCounter counts each user's events and, once the user has been idle
// for a minute of processing time, emits the count and forgets it.
type idleCounter struct {
	count *runtime.ValueState[int64]
	timer *runtime.ValueState[int64]
}

func (c *idleCounter) Open(_ context.Context, st *runtime.StateRegistry[string]) error {
	var err error
	if c.count, err = runtime.NewValueState[int64](st, "count", nil); err != nil {
		return err
	}
	c.timer, err = runtime.NewValueState[int64](st, "timer", nil)
	return err
}

func (c *idleCounter) ProcessElement(ctx *runtime.KeyedContext[string], _ Event, _ runtime.Collector[string]) error {
	n, _ := c.count.Value()
	c.count.Update(n + 1)
	ts := ctx.TimerService()
	if old, ok := c.timer.Value(); ok {
		ts.DeleteProcessingTimeTimer(old)
	}
	due := ts.CurrentProcessingTime() + time.Minute.Milliseconds()
	ts.RegisterProcessingTimeTimer(due)
	c.timer.Update(due)
	return nil
}

func (c *idleCounter) OnTimer(ctx *runtime.KeyedContext[string], _ int64, out runtime.Collector[string]) error {
	n, _ := c.count.Value()
	out.Collect(fmt.Sprintf("%s: %d events", ctx.Key(), n))
	c.count.Clear()
	c.timer.Clear()
	return nil
}

func newIdleCounter() runtime.KeyedProcessor[string, Event, string] { return &idleCounter{} }

// A keyed function with a processing-time timer: the test sets the clock,
// and the timer fires when the clock passes it, not a millisecond of wall
// time later.
func ExampleNewKeyedHarness() {
	h, err := weirtest.NewKeyedHarness(func(e Event) string { return e.User }, nil,
		func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[string] {
			return runtime.ProcessKeyed(ks, "idle-counter", newIdleCounter)
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Close()

	for _, e := range []Event{{"ann", 1}, {"bob", 2}, {"ann", 3}} {
		if err := h.ProcessElement(e, e.TS); err != nil {
			fmt.Println(err)
			return
		}
		if err := h.AdvanceProcessingTime(20 * time.Second); err != nil {
			fmt.Println(err)
			return
		}
	}
	n, _, err := weirtest.Value[int64](h, "count", "ann")
	fmt.Println("ann's count:", n, err)
	timers, err := h.Timers()
	for _, t := range timers {
		fmt.Println("timer:", t.Key, t.Domain, t.Timestamp)
	}

	err = h.SetProcessingTime(80_000) // bob idle for a minute, ann not yet
	fmt.Println(h.Values(), err)
	err = h.SetProcessingTime(100_000)
	fmt.Println(h.Values(), err)
	// Output:
	// ann's count: 2 <nil>
	// timer: bob processing-time 80000
	// timer: ann processing-time 100000
	// [bob: 1 events] <nil>
	// [bob: 1 events ann: 2 events] <nil>
}

// countEvents counts a window's events incrementally.
type countEvents struct{}

func (countEvents) CreateAccumulator() int64   { return 0 }
func (countEvents) Add(_ Event, n int64) int64 { return n + 1 }
func (countEvents) GetResult(n int64) int64    { return n }
func (countEvents) Merge(a, b int64) int64     { return a + b }

// A session window with a late record: the watermark fires the session,
// and an event that comes after its session fired goes to the late side
// output, with its timestamp.
func ExampleSideOutput() {
	late := runtime.NewOutputTag[Event]("late-events")
	h, err := weirtest.NewKeyedHarness(func(e Event) string { return e.User }, nil,
		func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[int64] {
			sessions := runtime.Window(ks, runtime.EventTimeSessionWindows(30*time.Second), runtime.LateOutput(late))
			return runtime.Aggregate(sessions, "session-events", countEvents{}, nil)
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Close()

	for _, e := range []Event{{"ann", 1_000}, {"ann", 20_000}} {
		if err := h.ProcessElement(e, e.TS); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := h.ProcessWatermark(60_000); err != nil { // past the session's end, 50 000
		fmt.Println(err)
		return
	}
	if err := h.ProcessElement(Event{"ann", 5_000}, 5_000); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("sessions:", h.Output())
	fmt.Println("late:", weirtest.SideOutput(h, late))
	// Output:
	// sessions: [{2 49999}]
	// late: [{{ann 5000} 5000}]
}

// A snapshot taken at parallelism 1 restored at parallelism 2: each
// subtask restores the key groups Weir gives it, and each key's count goes
// on where it was.
func ExampleRestoreFrom() {
	key := func(e Event) string { return e.User }
	counts := func(ks *runtime.KeyedStream[string, Event]) *runtime.Stream[string] {
		return runtime.Process(ks, "count", func() runtime.KeyedProcessFunction[string, Event, string] {
			return &counter{}
		})
	}
	before, err := weirtest.NewKeyedHarness(key, nil, counts)
	if err != nil {
		fmt.Println(err)
		return
	}
	users := []string{"ann", "bob", "cid", "dan"}
	for _, u := range users {
		if err := before.ProcessElement(Event{User: u}, runtime.NoTimestamp); err != nil {
			fmt.Println(err)
			return
		}
	}
	snap, err := before.Snapshot()
	if err != nil {
		fmt.Println(err)
		return
	}
	before.Close()

	var subtasks []*weirtest.KeyedHarness[string, Event, string]
	for i := range 2 {
		h, err := weirtest.NewKeyedHarness(key, nil, counts, weirtest.Subtask(i, 2), weirtest.RestoreFrom(snap))
		if err != nil {
			fmt.Println(err)
			return
		}
		defer h.Close()
		subtasks = append(subtasks, h)
	}
	for _, u := range users {
		e := Event{User: u}
		h := subtasks[subtasks[0].SubtaskOf(e)]
		if err := h.ProcessElement(e, runtime.NoTimestamp); err != nil {
			fmt.Println(err)
			return
		}
	}
	for i, h := range subtasks {
		fmt.Println("subtask", i, h.Values())
	}
	// Output:
	// subtask 0 [dan 2]
	// subtask 1 [ann 2 bob 2 cid 2]
}

// counter counts each key's records and emits "key count".
type counter struct {
	n *runtime.ValueState[int64]
}

func (c *counter) Open(_ context.Context, st *runtime.StateRegistry[string]) error {
	var err error
	c.n, err = runtime.NewValueState[int64](st, "count", nil)
	return err
}

func (c *counter) Process(key string, _ Event, out runtime.Collector[string]) error {
	n, _ := c.n.Value()
	c.n.Update(n + 1)
	out.Collect(key + " " + strconv.FormatInt(n+1, 10))
	return nil
}

// A whole job against the embedded broker: input written before it starts,
// one transaction of it aborted, the job run on the mini cluster with
// short checkpoints, and its output read read_committed once a checkpoint
// committed it, each record once.
func ExampleStartJob() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := weirtest.StartKafka(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer k.Close()
	for _, topic := range []string{"lines", "upper"} {
		if err := k.CreateTopic(ctx, topic, 2, nil); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := k.ProduceValues(ctx, "lines", "hello", "world"); err != nil {
		fmt.Println(err)
		return
	}
	aborted := &kgo.Record{Value: []byte("never seen")}
	if err := k.ProduceTxn(ctx, "input-writer", false, "lines", aborted); err != nil {
		fmt.Println(err)
		return
	}
	if err := k.ProduceTxn(ctx, "input-writer", true, "lines", &kgo.Record{Value: []byte("weir")}); err != nil {
		fmt.Println(err)
		return
	}

	job, err := uppercase.Build(runtime.Params{"brokers": k.Addr(), "input": "lines", "group": "upper", "output": "upper"})
	if err != nil {
		fmt.Println(err)
		return
	}
	run, err := weirtest.StartJob(job, weirtest.CheckpointEvery(50*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	out, err := run.WaitCommitted(ctx, k, "upper", func(recs []*kgo.Record) bool { return len(recs) >= 3 })
	if _, serr := run.Stop(); err == nil {
		err = serr
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	got := weirtest.Values(out)
	slices.Sort(got)
	fmt.Println(got, weirtest.CheckEachOnce(got, []string{"HELLO", "WORLD", "WEIR"}))
	// Output:
	// [HELLO WEIR WORLD] <nil>
}
