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

// countClicks counts a window's clicks incrementally: one int64 per user
// and window, never the clicks themselves.
type countClicks struct{}

func (countClicks) CreateAccumulator() int64   { return 0 }
func (countClicks) Add(_ Click, n int64) int64 { return n + 1 }
func (countClicks) GetResult(n int64) int64    { return n }
func (countClicks) Merge(a, b int64) int64     { return a + b }

// Clicks per user and minute of event time, out of order by up to 5 s: an
// event-time tumbling window with an incremental aggregate, and the window's
// key and bounds from a ProcessWindowFunction. The end of the bounded input
// fires every window.
func ExampleWindow() {
	input := []Click{
		{"ann", 1_000}, {"bob", 2_000}, {"ann", 59_000}, {"ann", 61_000},
		{"ann", 58_000}, {"bob", 62_000}, {"bob", 125_000},
	}
	var mu sync.Mutex
	var lines []string
	mySink := runtime.SinkFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, s)
		return nil
	})

	j := runtime.NewJob("clicks-per-minute")
	clicks := runtime.FromSource(j, "clicks", runtime.SliceSource(input, 0),
		runtime.Watermarks(runtime.ForBoundedOutOfOrderness[Click](5*time.Second,
			runtime.WithTimestampAssigner(func(c Click, _ int64) int64 { return c.TS }))))
	byUser := runtime.KeyBy(clicks, func(c Click) string { return c.User }, nil)
	windows := runtime.Window(byUser, runtime.TumblingEventTimeWindows(time.Minute),
		runtime.AllowedLateness(10*time.Second))
	counts := runtime.AggregateProcess(windows, "count", countClicks{},
		runtime.ProcessWindowFunc[string, int64, string](func(ctx *runtime.WindowContext[string], n []int64, out runtime.Collector[string]) error {
			out.Collect(fmt.Sprintf("%s %v: %d clicks", ctx.Key, ctx.Window, n[0]))
			return nil
		}), nil)
	runtime.SinkTo(counts, "out", mySink)
	_, err := runtime.NewMiniCluster().Run(context.Background(), j)

	if err != nil {
		fmt.Println("job failed:", err)
		return
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// ann [0,60000): 3 clicks
	// ann [60000,120000): 1 clicks
	// bob [0,60000): 1 clicks
	// bob [120000,180000): 1 clicks
	// bob [60000,120000): 1 clicks
}

// Sessions of clicks per user, closed after 30 s without a click: the
// ProcessWindowFunction sees every click of the session.
func ExampleProcessWindow() {
	input := []Click{{"ann", 0}, {"ann", 20_000}, {"ann", 45_000}, {"ann", 80_000}, {"bob", 10_000}}
	var mu sync.Mutex
	var lines []string
	mySink := runtime.SinkFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, s)
		return nil
	})

	j := runtime.NewJob("sessions")
	clicks := runtime.FromSource(j, "clicks", runtime.SliceSource(input, 0),
		runtime.Watermarks(runtime.ForMonotonousTimestamps[Click](
			runtime.WithTimestampAssigner(func(c Click, _ int64) int64 { return c.TS }))))
	byUser := runtime.KeyBy(clicks, func(c Click) string { return c.User }, nil)
	sessions := runtime.ProcessWindow(runtime.Window(byUser, runtime.EventTimeSessionWindows(30*time.Second)), "sessions",
		runtime.ProcessWindowFunc[string, Click, string](func(ctx *runtime.WindowContext[string], cs []Click, out runtime.Collector[string]) error {
			out.Collect(fmt.Sprintf("%s: %d clicks from %d to %d", ctx.Key, len(cs), ctx.Window.Start, ctx.Window.End))
			return nil
		}), nil)
	runtime.SinkTo(sessions, "out", mySink)
	_, err := runtime.NewMiniCluster().Run(context.Background(), j)

	if err != nil {
		fmt.Println("job failed:", err)
		return
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// ann: 1 clicks from 80000 to 110000
	// ann: 3 clicks from 0 to 75000
	// bob: 1 clicks from 10000 to 40000
}
