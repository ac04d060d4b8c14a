package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup"
)

// ShareGroupWatermark measures what the share-group source's watermark
// (the group's frontier, docs/internals/event-time.md) costs against the
// rule it replaced, each subtask's watermark from its own records
// (sharegroup.SubtaskWatermarks), alternately on the same broker: an
// event-time session window per user (30 s gap, 5 s bound, parallelism 2,
// 100 ms checkpoints, 8 partitions) over clicks of sessions.Generate (in
// event-time order within 2 s on each partition). It reports
//   - clicks_per_s: a backlog of clicks read until the group acknowledged
//     every one;
//   - watermark_lag_p50_ms and _p99_ms: clicks written while the job runs,
//     20 minutes of event time in about 10 s (2 s in this package's
//     tests), and for each click the time
//     by which the window operator's watermark trails the newest click it
//     has seen;
//
// with the late clicks of each side in the notes. The old rule is faster
// and lags less because it passes records nobody has fetched yet: they
// are late.
func ShareGroupWatermark(ctx context.Context, cfg Config) ([]Line, error) {
	users, runs := cfg.sizeOf(2000, 700, 60), cfg.runsOf(3, 2)
	// pace is how long the paced runs take to write their clicks' 20
	// minutes of event time.
	pace := time.Duration(cfg.sizeOf(10, 10, 2)) * time.Second
	kb, err := startBroker(ctx)
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	first := time.Now().Add(-time.Hour).UnixMilli()
	clicks := sessions.Generate(users, first, 20*time.Minute, 2*time.Second, 7)
	cfg.progress("producing %d clicks", len(clicks))
	if err := produceClicks(ctx, kb, "bench-clicks", clicks, 0); err != nil {
		return nil, err
	}
	type result struct {
		p50, p99 []float64
		late     []int
	}
	var res [2]result
	side := func(k int, opts ...sharegroup.Opt) measure {
		return func(run int) (float64, error) {
			r, err := sessionWindowRun(ctx, kb, fmt.Sprintf("bench-sgwm-%d-%d", k, run), "bench-clicks", nil, 0, len(clicks), first, opts...)
			if err != nil {
				return 0, err
			}
			paced := fmt.Sprintf("bench-clicks-paced-%d-%d", k, run)
			p, err := sessionWindowRun(ctx, kb, paced, paced, clicks, pace, len(clicks), first, opts...)
			if err != nil {
				return 0, fmt.Errorf("paced: %w", err)
			}
			res[k].p50, res[k].p99 = append(res[k].p50, p.lagP50), append(res[k].p99, p.lagP99)
			res[k].late = append(res[k].late, r.late+p.late)
			return float64(len(clicks)) / r.elapsed.Seconds(), nil
		}
	}
	weir, base, err := alternate(runs, func(side string, i int) { cfg.progress("run %d/%d: %s", i+1, runs, side) },
		side(0), side(1, sharegroup.SubtaskWatermarks()))
	if err != nil {
		return nil, err
	}
	l := compared("sharegroup-watermark", "clicks_per_s", "subtask-watermarks", weir, base)
	l.Note = fmt.Sprintf("a backlog of %d clicks of %d users, 8 partitions, parallelism 2, until all acknowledged; "+
		"late clicks (backlog and paced runs) weir %v, subtask-watermarks %v; %s", len(clicks), users, res[0].late, res[1].late, l.Note)
	lag := func(metric string, w, b []float64) Line {
		x := compared("sharegroup-watermark", metric, "subtask-watermarks", w, b)
		x.Note = fmt.Sprintf("clicks written while the job runs (20 min of event time in %v): ms the window operator's watermark "+
			"trails the newest click time it has seen, per click; %s", pace, x.Note)
		return x
	}
	return []Line{l, lag("watermark_lag_p50_ms", res[0].p50, res[1].p50), lag("watermark_lag_p99_ms", res[0].p99, res[1].p99)}, nil
}

// produceClicks creates topic with 8 partitions and writes clicks to it:
// all at once (over 0), or paced so that over covers their event-time
// span.
func produceClicks(ctx context.Context, kb *kafkaBroker, topic string, clicks []sessions.Click, over time.Duration) error {
	resp, err := kb.adm.CreateTopic(ctx, 8, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", topic, err)
	}
	if over == 0 {
		recs := make([]*kgo.Record, len(clicks))
		for i, c := range clicks {
			recs[i] = c.Record(topic)
		}
		if err := kb.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("produce clicks: %w", err)
		}
		return nil
	}
	span := clicks[len(clicks)-1].TS - clicks[0].TS
	start := time.Now()
	for i := 0; i < len(clicks); {
		due := time.Duration(float64(over) * float64(clicks[i].TS-clicks[0].TS) / float64(max(span, 1)))
		if wait := time.Until(start.Add(due)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		var recs []*kgo.Record
		for ; i < len(clicks) && time.Duration(float64(over)*float64(clicks[i].TS-clicks[0].TS)/float64(max(span, 1))) <= time.Since(start); i++ {
			recs = append(recs, clicks[i].Record(topic))
		}
		if err := kb.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("produce clicks: %w", err)
		}
	}
	return nil
}

// sgwmRun is one run of sessionWindowRun.
type sgwmRun struct {
	elapsed        time.Duration
	lagP50, lagP99 float64
	late           int
}

// sessionWindowRun reads topic as share group group into session windows
// (30 s gap) and returns once the group has acknowledged all n clicks.
// With paced clicks, it writes them to topic while the job runs (over
// their span). first is the earliest click's time: the lag of a click that
// arrives before any watermark counts from it.
func sessionWindowRun(ctx context.Context, kb *kafkaBroker, group, topic string, paced []sessions.Click, over time.Duration, n int, first int64,
	opts ...sharegroup.Opt) (sgwmRun, error) {
	src, err := sharegroup.New(sessions.ParseClick, append([]sharegroup.Opt{sharegroup.Brokers(kb.addr),
		sharegroup.Topics(topic), sharegroup.Group(group)}, opts...)...)
	if err != nil {
		return sgwmRun{}, err
	}
	m := &lagMeter{first: first}
	j := runtime.NewJob(group, runtime.DefaultParallelism(2))
	clicks := runtime.FromSource(j, "clicks", src, runtime.Watermarks(runtime.ForBoundedOutOfOrderness[sessions.Click](5*time.Second,
		runtime.WithTimestampAssigner(func(c sessions.Click, _ int64) int64 { return c.TS }), runtime.WithIdleness(2*time.Second))))
	metered := runtime.ProcessKeyed(runtime.KeyBy(clicks, func(c sessions.Click) string { return c.User }, nil), "meter",
		func() runtime.KeyedProcessor[string, sessions.Click, sessions.Click] { return m })
	windows := runtime.Window(runtime.KeyBy(metered, func(c sessions.Click) string { return c.User }, nil),
		runtime.EventTimeSessionWindows(30*time.Second))
	last := runtime.ReduceWindow(windows, "sessions", func(_, b sessions.Click) (sessions.Click, error) {
		b.Value, b.Key = nil, nil
		return b, nil
	}, nil)
	runtime.SinkTo(last, "discard", runtime.SinkFunc(func(context.Context, sessions.Click) error { return nil }))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 2)
	start := time.Now()
	go func() {
		_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(rctx, j)
		done <- err
	}()
	if paced != nil {
		go func() {
			if err := produceClicks(rctx, kb, topic, paced, over); err != nil && rctx.Err() == nil {
				done <- err
			}
		}()
	}
	for {
		if starts, err := sharegroup.StartOffsets(rctx, kb.cl, group); err == nil {
			var acked int64
			for _, o := range starts {
				acked += o
			}
			if acked >= int64(n) {
				break
			}
		}
		select {
		case err := <-done:
			return sgwmRun{}, fmt.Errorf("ended early: %w", err)
		case <-ctx.Done():
			return sgwmRun{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	el := time.Since(start)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return sgwmRun{}, err
	}
	p50, p99, late := m.result()
	return sgwmRun{elapsed: el, lagP50: p50, lagP99: p99, late: late}, nil
}

// lagMeter passes clicks on and records, per click, how far the operator's
// watermark (at least first-1) trails the newest click time it has seen,
// and the late clicks.
type lagMeter struct {
	first  int64
	mu     sync.Mutex
	newest int64
	lags   []float64
	late   int
}

func (m *lagMeter) Open(context.Context, *runtime.StateRegistry[string]) error { return nil }
func (m *lagMeter) OnTimer(*runtime.KeyedContext[string], int64, runtime.Collector[sessions.Click]) error {
	return nil
}
func (m *lagMeter) ProcessElement(ctx *runtime.KeyedContext[string], c sessions.Click, out runtime.Collector[sessions.Click]) error {
	m.mu.Lock()
	m.newest = max(m.newest, c.TS)
	wm := max(ctx.CurrentWatermark(), m.first-1)
	m.lags = append(m.lags, float64(m.newest-wm))
	if c.TS <= wm {
		m.late++
	}
	m.mu.Unlock()
	out.Collect(c)
	return nil
}

func (m *lagMeter) result() (p50, p99 float64, late int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.lags) == 0 {
		return 0, 0, m.late
	}
	s := slices.Sorted(slices.Values(m.lags))
	return s[len(s)/2], s[len(s)*99/100], m.late
}
