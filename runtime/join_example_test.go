package runtime_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/weirstream/weir/runtime"
)

// Click is declared in example_eventtime_test.go.

// Order is a user's order at TS (epoch ms).
type Order struct {
	User string
	TS   int64
	Item string
}

// joinInputs are the two event-time streams of the join examples, each
// out of order by up to 5 s, keyed by user.
func joinInputs(j *runtime.Job) (*runtime.KeyedStream[string, Click], *runtime.KeyedStream[string, Order]) {
	clicks := []Click{{"ann", 10_000}, {"bob", 12_000}, {"ann", 70_000}, {"ann", 65_000}}
	orders := []Order{{"ann", 15_000, "tea"}, {"bob", 80_000, "pen"}, {"ann", 69_000, "cup"}}
	cs := runtime.FromSource(j, "clicks", runtime.SliceSource(clicks, 0),
		runtime.Watermarks(runtime.ForBoundedOutOfOrderness[Click](5*time.Second,
			runtime.WithTimestampAssigner(func(c Click, _ int64) int64 { return c.TS }))))
	os := runtime.FromSource(j, "orders", runtime.SliceSource(orders, 0),
		runtime.Watermarks(runtime.ForBoundedOutOfOrderness[Order](5*time.Second,
			runtime.WithTimestampAssigner(func(o Order, _ int64) int64 { return o.TS }))))
	return runtime.KeyBy(cs, func(c Click) string { return c.User }, nil),
		runtime.KeyBy(os, func(o Order) string { return o.User }, nil)
}

// runSorted runs j and prints what mySink collected, sorted (the order of
// a parallel job's output is not defined).
func runSorted(j *runtime.Job, lines *[]string) {
	if _, err := runtime.NewMiniCluster().Run(context.Background(), j); err != nil {
		fmt.Println(err)
		return
	}
	slices.Sort(*lines)
	for _, l := range *lines {
		fmt.Println(l)
	}
}

// Orders placed within 10 s after a click of the same user: an interval
// join in event time. Each pair is emitted once, with the later of the
// two timestamps; late records would go to IntervalJoinLateLeft/Right.
func ExampleIntervalJoin() {
	var mu sync.Mutex
	var lines []string
	mySink := runtime.SinkFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, s)
		return nil
	})
	j := runtime.NewJob("clicks-to-orders", runtime.DefaultParallelism(2))
	clicks, orders := joinInputs(j)
	joined := runtime.IntervalJoin(clicks, orders, "click-then-order", runtime.Between(0, 10*time.Second),
		func(ctx *runtime.JoinContext[string], c Click, o Order, out runtime.Collector[string]) error {
			out.Collect(fmt.Sprintf("%s clicked at %d, ordered %s at %d", ctx.Key, c.TS, o.Item, o.TS))
			return nil
		})
	runtime.SinkTo(joined, "out", mySink)
	runSorted(j, &lines)
	// Output:
	// ann clicked at 10000, ordered tea at 15000
	// ann clicked at 65000, ordered cup at 69000
}

// Clicks and orders of a user in the same minute: a window join (every
// pair of the window) on tumbling event-time windows.
func ExampleWindowJoin() {
	var mu sync.Mutex
	var lines []string
	mySink := runtime.SinkFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, s)
		return nil
	})
	j := runtime.NewJob("clicks-and-orders-per-minute")
	clicks, orders := joinInputs(j)
	joined := runtime.WindowJoin(clicks, orders, "same-minute", runtime.TumblingEventTimeWindows(time.Minute),
		func(ctx *runtime.WindowContext[string], c Click, o Order, out runtime.Collector[string]) error {
			out.Collect(fmt.Sprintf("%s %v: click %d, %s", ctx.Key, ctx.Window, c.TS, o.Item))
			return nil
		})
	runtime.SinkTo(joined, "out", mySink)
	runSorted(j, &lines)
	// Output:
	// ann [0,60000): click 10000, tea
	// ann [60000,120000): click 65000, cup
	// ann [60000,120000): click 70000, cup
}

// A KeyedCoProcessor sees both connected streams with one keyed state per
// user: here the user's last click, which each order reads.
type lastClick struct {
	last *runtime.ValueState[int64]
}

func (p *lastClick) Open(_ context.Context, st *runtime.StateRegistry[string]) (err error) {
	p.last, err = runtime.NewValueState[int64](st, "last-click", nil)
	return err
}

func (p *lastClick) ProcessElement1(_ *runtime.KeyedContext[string], c Click, _ runtime.Collector[string]) error {
	if last, ok := p.last.Value(); !ok || c.TS > last {
		p.last.Update(c.TS)
	}
	return nil
}

func (p *lastClick) ProcessElement2(ctx *runtime.KeyedContext[string], o Order, out runtime.Collector[string]) error {
	last, ok := p.last.Value()
	out.Collect(fmt.Sprintf("%s ordered %s; a click seen before: %v (%d)", ctx.Key(), o.Item, ok, last))
	return nil
}

func (p *lastClick) OnTimer(*runtime.KeyedContext[string], int64, runtime.Collector[string]) error {
	return nil
}

// Connect two keyed streams into a KeyedCoProcessor: shared keyed state
// and timers for both inputs. (No Output: the order in which a task reads
// its two inputs is not defined, so neither is which clicks an order sees;
// register event-time timers to act in event-time order.)
func ExampleProcessConnected() {
	var mu sync.Mutex
	var lines []string
	mySink := runtime.SinkFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, s)
		return nil
	})
	j := runtime.NewJob("last-click")
	clicks, orders := joinInputs(j)
	out := runtime.ProcessConnected(runtime.Connect(clicks, orders), "last-click",
		func() runtime.KeyedCoProcessor[string, Click, Order, string] { return &lastClick{} })
	runtime.SinkTo(out, "out", mySink)
	runSorted(j, &lines)
}
