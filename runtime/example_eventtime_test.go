package runtime_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/weirstream/weir/runtime"
)

// Click is a user's click at TS (epoch ms).
type Click struct {
	User string
	TS   int64
}

// inactivity emits "user quiet after ts" when a user has not clicked for
// gap of event time after a click; late clicks go to a side output.
type inactivity struct {
	gap  int64
	last *runtime.ValueState[int64] // the user's pending timer
}

var lateTag = runtime.NewOutputTag[Click]("late")

func (f *inactivity) Open(_ context.Context, st *runtime.StateRegistry[string]) (err error) {
	f.last, err = runtime.NewValueState[int64](st, "timer", nil)
	return err
}

func (f *inactivity) ProcessElement(ctx *runtime.KeyedContext[string], c Click, _ runtime.Collector[string]) error {
	if ctx.Timestamp() <= ctx.CurrentWatermark() {
		runtime.Output(ctx, lateTag, c) // late: never dropped silently
		return nil
	}
	if prev, ok := f.last.Value(); ok {
		if prev >= c.TS+f.gap {
			return nil // an earlier-arriving, later click already set a later timer
		}
		ctx.TimerService().DeleteEventTimeTimer(prev)
	}
	f.last.Update(c.TS + f.gap)
	ctx.TimerService().RegisterEventTimeTimer(c.TS + f.gap)
	return nil
}

func (f *inactivity) OnTimer(ctx *runtime.KeyedContext[string], ts int64, out runtime.Collector[string]) error {
	f.last.Clear()
	out.Collect(fmt.Sprintf("%s quiet after %d", ctx.Key(), ts-f.gap))
	return nil
}

// Event time: clicks arrive out of order (by up to 5 s); the watermark
// (bounded out-of-orderness) tells the keyed function when a user's 30 s
// of inactivity has passed in event time, whatever the arrival order.
func ExampleProcessKeyed() {
	clicks := []Click{{"ann", 1_000}, {"bob", 3_000}, {"ann", 20_000}, {"ann", 17_000},
		{"bob", 60_000}, {"ann", 90_000}, {"bob", 2_000}, {"ann", 140_000}}
	var mu sync.Mutex
	var got []string

	j := runtime.NewJob("inactivity")
	ws := runtime.ForBoundedOutOfOrderness[Click](5*time.Second,
		runtime.WithTimestampAssigner(func(c Click, _ int64) int64 { return c.TS }),
		runtime.WithWatermarkInterval(time.Nanosecond)) // after every poll (one click): a deterministic example
	events := runtime.FromSource(j, "clicks", runtime.SliceSource(clicks, 1), runtime.Watermarks(ws))
	byUser := runtime.KeyBy(events, func(c Click) string { return c.User }, nil)
	quiet := runtime.ProcessKeyed(byUser, "inactivity", func() runtime.KeyedProcessor[string, Click, string] {
		return &inactivity{gap: 30_000}
	})
	late := runtime.SideOutput(quiet, lateTag)

	runtime.SinkTo(quiet, "alerts", runtime.SinkFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
		return nil
	}))
	runtime.SinkTo(late, "late", runtime.SinkFunc(func(_ context.Context, c Click) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("late click of %s at %d", c.User, c.TS))
		return nil
	}))
	if _, err := runtime.NewMiniCluster().Run(context.Background(), j); err != nil {
		fmt.Println(err)
		return
	}
	sort.Strings(got)
	for _, s := range got {
		fmt.Println(s)
	}
	// Output:
	// ann quiet after 140000
	// ann quiet after 20000
	// bob quiet after 60000
	// late click of bob at 2000
}
