package runtime_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/weirstream/weir/runtime"
)

// Purchase is an order of a customer.
type Purchase struct {
	Customer string
	Amount   int64
}

// orderStats keeps, per customer, the amounts of its orders (ListState),
// their total (ReducingState) and their mean (AggregatingState), each
// forgotten a day after it was last written (WithTTL).
type orderStats struct {
	amounts *runtime.ListState[int64]
	total   *runtime.ReducingState[int64]
	mean    *runtime.AggregatingState[int64, [2]int64, float64]
}

// meanOf is an AggregateFunction: the mean of the amounts added.
type meanOf struct{}

func (meanOf) CreateAccumulator() [2]int64        { return [2]int64{} }
func (meanOf) Add(v int64, acc [2]int64) [2]int64 { return [2]int64{acc[0] + v, acc[1] + 1} }
func (meanOf) GetResult(acc [2]int64) float64     { return float64(acc[0]) / float64(acc[1]) }
func (meanOf) Merge(a, b [2]int64) [2]int64       { return [2]int64{a[0] + b[0], a[1] + b[1]} }

func (f *orderStats) Open(_ context.Context, st *runtime.StateRegistry[string]) (err error) {
	day := runtime.WithTTL(runtime.StateTTLConfig{TTL: 24 * time.Hour})
	if f.amounts, err = runtime.NewListState[int64](st, "amounts", nil, day); err != nil {
		return err
	}
	sum := func(acc, v int64) (int64, error) { return acc + v, nil }
	if f.total, err = runtime.NewReducingState[int64](st, "total", sum, nil, day); err != nil {
		return err
	}
	f.mean, err = runtime.NewAggregatingState[int64, [2]int64, float64](st, "mean", meanOf{}, nil, day)
	return err
}

func (f *orderStats) Process(customer string, o Purchase, out runtime.Collector[string]) error {
	f.amounts.Add(o.Amount)
	if err := f.total.Add(o.Amount); err != nil {
		return err
	}
	f.mean.Add(o.Amount)
	total, _ := f.total.Get()
	mean, _ := f.mean.Get()
	out.Collect(fmt.Sprintf("%s: orders %v, total %d, mean %.1f", customer, slices.Collect(f.amounts.Get()), total, mean))
	return nil
}

// A keyed function with list, reducing and aggregating state, with a TTL.
func ExampleNewListState() {
	orders := []Purchase{{"ann", 10}, {"bob", 5}, {"ann", 30}, {"ann", 20}}
	var mu sync.Mutex
	var got []string

	j := runtime.NewJob("order-stats")
	src := runtime.FromSource(j, "orders", runtime.SliceSource(orders, 0), runtime.Parallelism(1))
	byCustomer := runtime.KeyBy(src, func(o Purchase) string { return o.Customer }, nil)
	stats := runtime.Process(byCustomer, "stats", func() runtime.KeyedProcessFunction[string, Purchase, string] { return &orderStats{} })
	runtime.SinkTo(stats, "print", runtime.SinkFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
		return nil
	}))
	if _, err := runtime.NewMiniCluster().Run(context.Background(), j); err != nil {
		fmt.Println(err)
	}
	sort.Strings(got)
	for _, s := range got {
		fmt.Println(s)
	}
	// Output:
	// ann: orders [10 30 20], total 60, mean 20.0
	// ann: orders [10 30], total 40, mean 20.0
	// ann: orders [10], total 10, mean 10.0
	// bob: orders [5], total 5, mean 5.0
}

// Threshold is a rule: alert on orders of Customer above Limit.
type Threshold struct {
	Customer string
	Limit    int64
}

// alerts keeps the rules in broadcast state: the rules stream writes it,
// the orders only read it.
type alerts struct {
	rules *runtime.BroadcastState[string, int64]
}

func (a *alerts) Open(_ context.Context, bs *runtime.BroadcastRegistry) (err error) {
	a.rules, err = runtime.NewBroadcastState[string, int64](bs, "thresholds", nil, nil)
	return err
}

func (a *alerts) ProcessBroadcastElement(_ *runtime.BroadcastContext, r Threshold, _ runtime.Collector[string]) error {
	return a.rules.Put(r.Customer, r.Limit)
}

func (a *alerts) ProcessElement(_ *runtime.BroadcastContext, o Purchase, out runtime.Collector[string]) error {
	if limit, ok := a.rules.Get(o.Customer); ok && o.Amount > limit {
		out.Collect(fmt.Sprintf("%s ordered %d, above %d", o.Customer, o.Amount, limit))
	}
	return nil
}

// Rules broadcast to every subtask of a stream of orders.
func ExampleProcessBroadcast() {
	rules := []Threshold{{"ann", 15}, {"bob", 100}}
	orders := []Purchase{{"ann", 10}, {"bob", 500}, {"ann", 30}, {"ann", 20}}
	var mu sync.Mutex
	var got []string

	j := runtime.NewJob("alerts", runtime.DefaultParallelism(2))
	ruleStream := runtime.FromSource(j, "rules", runtime.SliceSource(rules, 0), runtime.Parallelism(1))
	// The orders wait for the rules here: a real job would buffer orders
	// that arrive before any rule (in keyed state, with
	// ProcessKeyedBroadcast) or accept that they are not checked.
	orderStream := runtime.FromSource(j, "orders", startingAfter(runtime.SliceSource(orders, 0), 200*time.Millisecond), runtime.Parallelism(1))
	out := runtime.ProcessBroadcast(orderStream, ruleStream, "alerts", func() runtime.BroadcastProcessor[Purchase, Threshold, string] { return &alerts{} })
	runtime.SinkTo(out, "print", runtime.SinkFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
		return nil
	}))
	if _, err := runtime.NewMiniCluster().Run(context.Background(), j); err != nil {
		fmt.Println(err)
	}
	sort.Strings(got)
	for _, s := range got {
		fmt.Println(s)
	}
	// Output:
	// ann ordered 20, above 15
	// ann ordered 30, above 15
	// bob ordered 500, above 100
}

// startingAfter delays the first record of the sources newSource makes by
// d.
func startingAfter[T any](newSource func() runtime.Source[T], d time.Duration) func() runtime.Source[T] {
	return func() runtime.Source[T] { return &lateSource[T]{Source: newSource(), d: d} }
}

type lateSource[T any] struct {
	runtime.Source[T]
	d       time.Duration
	started bool
}

func (s *lateSource[T]) Poll(ctx context.Context, out runtime.Collector[T]) error {
	if !s.started {
		s.started = true
		time.Sleep(s.d)
	}
	return s.Source.Poll(ctx, out)
}
