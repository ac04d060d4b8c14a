package runtime

import (
	"context"
	"fmt"
	"time"
)

// WindowedStream is a keyed stream cut into windows by a WindowAssigner. Turn
// it into a stream of window results with Aggregate, AggregateProcess,
// ReduceWindow or ProcessWindow.
type WindowedStream[K comparable, T any] struct {
	ks  *KeyedStream[K, T]
	asg WindowAssigner
	cfg windowCfg
}

// windowCfg is what the WindowOpts set.
type windowCfg struct {
	lateness int64 // ms
	lateTag  any   // an OutputTag[T] of the stream's record type, or nil
	err      error
	// general: event-time tumbling windows keep the general path's state
	// and timers, not aligned windows (the tests compare the two).
	general bool
}

// WindowOpt configures the windows of a WindowedStream.
type WindowOpt interface{ apply(*windowCfg) }

type windowOpt func(*windowCfg)

func (o windowOpt) apply(c *windowCfg) { o(c) }

// AllowedLateness keeps an event-time window's state for d after the
// watermark passed its end (default 0, as in Flink). A record that arrives
// within that time is added to the window and fires it again with the
// updated result (a late firing); a record after it is late (see the
// window operator's late records). Processing-time windows ignore it.
func AllowedLateness(d time.Duration) WindowOpt {
	return windowOpt(func(c *windowCfg) {
		if d < 0 || d%time.Millisecond != 0 {
			c.err = fmt.Errorf("allowed lateness %v must be a non-negative whole number of milliseconds", d)
			return
		}
		c.lateness = d.Milliseconds()
	})
}

// LateOutput sends the window operator's late records (see Window) to the
// side output tag, which SideOutput reads from the operator's result
// stream. tag's type must be the windowed stream's record type.
func LateOutput[T any](tag OutputTag[T]) WindowOpt {
	return windowOpt(func(c *windowCfg) { c.lateTag = tag })
}

// generalWindows makes event-time tumbling windows take the general path
// (window_operator.go's state and a timer per key and window) instead of
// aligned windows (window_aligned.go), for the tests that compare them.
func generalWindows() WindowOpt { return windowOpt(func(c *windowCfg) { c.general = true }) }

// Window cuts the keyed stream ks into the windows of asg.
//
// Records of an event-time window must carry event timestamps (a source
// with a WatermarkStrategy, see Watermarks); a record without one fails the
// job. The window fires when the operator's watermark passes its end: a
// bounded input's final watermark fires every window. Every result carries
// the window's MaxTimestamp (End-1) as its event timestamp, late firings
// and processing-time windows included, as Flink's window operator stamps
// them, so an event-time operator can follow any window.
//
// A record whose windows have all been cleaned up (the watermark passed
// their end plus the allowed lateness) is late: it goes into no window, is
// counted in the operator's numLateRecords_total metric (with every record
// at or below the watermark), and goes to the LateOutput side output if
// there is one (Flink drops it without one, and so does Weir).
func Window[K comparable, T any](ks *KeyedStream[K, T], asg WindowAssigner, opts ...WindowOpt) *WindowedStream[K, T] {
	ws := &WindowedStream[K, T]{ks: ks, asg: asg}
	for _, o := range opts {
		o.apply(&ws.cfg)
	}
	if _, ok := ws.cfg.lateTag.(OutputTag[T]); ws.cfg.lateTag != nil && !ok && ws.cfg.err == nil {
		ws.cfg.err = fmt.Errorf("late output %T is not an OutputTag[%T]", ws.cfg.lateTag, *new(T))
	}
	if err := asg.validate(); err != nil {
		ks.s.job.fail(err)
	} else if ws.cfg.err != nil {
		ks.s.job.fail(fmt.Errorf("%w: window: %w", ErrInvalidJob, ws.cfg.err))
	}
	return ws
}

// Aggregate aggregates each window's records incrementally with agg (one
// accumulator per key and window: per pane for sliding windows, so a record
// is added once however many windows hold it) and emits agg's result when
// the window fires. ac encodes the accumulator in checkpoints (nil:
// DefaultCodec).
func Aggregate[K comparable, T, ACC, OUT any](ws *WindowedStream[K, T], name string, agg AggregateFunction[T, ACC, OUT], ac Codec[ACC], opts ...OpOpt) *Stream[OUT] {
	ac = windowStateCodec(ws, name, "accumulator", ac)
	wf := aggregateWindowFunc[K](agg, ac)
	return windowed(ws, name, func() windowFunc[K, T, ACC, OUT] { return wf }, opts)
}

// AggregateProcess is Aggregate whose result goes through fn with the
// window's key and bounds (Flink's aggregate with a ProcessWindowFunction):
// fn's elements hold the one aggregated result.
func AggregateProcess[K comparable, T, ACC, R, OUT any](ws *WindowedStream[K, T], name string, agg AggregateFunction[T, ACC, R],
	fn ProcessWindowFunction[K, R, OUT], ac Codec[ACC], opts ...OpOpt) *Stream[OUT] {
	ac = windowStateCodec(ws, name, "accumulator", ac)
	return windowed(ws, name, func() windowFunc[K, T, ACC, OUT] {
		// fn's elements: one array per subtask, reused from firing to
		// firing (ProcessWindowFunction's elements must not be retained).
		elems := make([]R, 1)
		return windowFunc[K, T, ACC, OUT]{
			create: agg.CreateAccumulator,
			add:    func(acc ACC, v T) (ACC, error) { return agg.Add(v, acc), nil },
			merge:  func(a, b ACC) (ACC, error) { return agg.Merge(a, b), nil },
			result: func(ctx *WindowContext[K], acc ACC, out Collector[OUT]) error {
				elems = append(elems[:0], agg.GetResult(acc))
				err := fn.Process(ctx, elems, out)
				clear(elems) // keeps no result alive
				return err
			},
			codec: ac,
		}
	}, opts)
}

// ReduceWindow reduces each window's records with fn and emits the result
// when the window fires. As in Flink, each window keeps one reduced value
// and reduces its records in arrival order (a sliding window's too: a
// record goes into each of its size/slide windows), so fn need not be
// commutative ("keep the last record to arrive" gives Flink's result);
// it must be associative, as merged sessions are reduced apart, then
// together. c encodes T in checkpoints (nil: DefaultCodec).
func ReduceWindow[K comparable, T any](ws *WindowedStream[K, T], name string, fn func(a, b T) (T, error), c Codec[T], opts ...OpOpt) *Stream[T] {
	c = windowStateCodec(ws, name, "value", c)
	wf := reduceWindowFunc[K](fn, c)
	return windowed(ws, name, func() windowFunc[K, T, reduceAcc[T], T] { return wf }, opts)
}

// ProcessWindow keeps each window's records and hands them to fn with the
// window's key and bounds when it fires. Records are in arrival order
// within a pane (a sliding window's gcd(size, slide) slice; the whole
// window otherwise), panes in time order; a merged session's records are
// in the order of the sessions it merged. c encodes T in checkpoints (nil:
// DefaultCodec). Prefer Aggregate where the result can be computed
// incrementally: ProcessWindow keeps every record until its window goes.
func ProcessWindow[K comparable, T, OUT any](ws *WindowedStream[K, T], name string, fn ProcessWindowFunction[K, T, OUT], c Codec[T], opts ...OpOpt) *Stream[OUT] {
	c = windowStateCodec(ws, name, "records", c)
	return windowed(ws, name, func() windowFunc[K, T, []T, OUT] { return processWindowFunc[K](fn, c, true) }, opts)
}

// windowStateCodec returns c, or DefaultCodec if it can encode V (else the
// job fails when built).
func windowStateCodec[K comparable, T, V any](ws *WindowedStream[K, T], name, what string, c Codec[V]) Codec[V] {
	if c != nil {
		return c
	}
	if err := CheckDefaultCodec[V](); err != nil {
		ws.ks.s.job.fail(fmt.Errorf("window %q: %s codec: %w", name, what, err))
	}
	return DefaultCodec[V]()
}

// windowed adds the window operator to the job; newFn makes its window
// function, once per subtask and attempt.
func windowed[K comparable, T, ACC, OUT any](ws *WindowedStream[K, T], name string, newFn func() windowFunc[K, T, ACC, OUT], opts []OpOpt) *Stream[OUT] {
	return ProcessKeyed(ws.ks, name, func() KeyedProcessor[K, T, OUT] {
		p := &windowProcessor[K, T, ACC, OUT]{name: name, asg: ws.asg, lateness: ws.cfg.lateness, general: ws.cfg.general, fn: newFn()}
		if tag, ok := ws.cfg.lateTag.(OutputTag[T]); ok {
			p.late = func(v T) error {
				Output(p.ctx, tag, v)
				return nil
			}
		}
		return p
	}, opts...)
}

// windowProcessor runs the window operator as a KeyedProcessor: records and
// timers in, through the operator's state machine, results out.
type windowProcessor[K comparable, T, ACC, OUT any] struct {
	name     string
	asg      WindowAssigner
	lateness int64
	general  bool // no aligned windows (windowCfg.general)
	fn       windowFunc[K, T, ACC, OUT]
	late     func(T) error // nil: late records are dropped (and counted)
	op       *windowOperator[K, T, ACC, OUT]
	// ctx and out are those of the call in progress.
	ctx *KeyedContext[K]
	out Collector[OUT]
}

// Open implements KeyedProcessor.
func (p *windowProcessor[K, T, ACC, OUT]) Open(_ context.Context, st *StateRegistry[K]) error {
	var err error
	p.op, err = newWindowOperatorOn(st, p.asg, p.lateness, p.fn, ctxTimers[K, T, ACC, OUT]{p},
		func(_ TimeWindow, v OUT) error { p.out.Collect(v); return nil }, p.late, !p.general)
	if err != nil {
		return err
	}
	p.op.ctxHook = func(wc *WindowContext[K]) { wc.kctx = p.ctx }
	p.op.stamp = func(ts int64) int64 {
		prev := p.ctx.now.ts
		p.ctx.now.ts = ts
		return prev
	}
	return nil
}

// ProcessElement implements KeyedProcessor.
func (p *windowProcessor[K, T, ACC, OUT]) ProcessElement(ctx *KeyedContext[K], v T, out Collector[OUT]) error {
	p.ctx, p.out = ctx, out
	ts := ctx.Timestamp()
	if p.asg.eventTime && ts == NoTimestamp {
		return Unrecoverable(fmt.Errorf("window %q: a record without event timestamp in %s: give the source a WatermarkStrategy (Watermarks)", p.name, p.asg))
	}
	return p.op.processElement(ctx.Key(), ts, v)
}

// OnTimer implements KeyedProcessor.
func (p *windowProcessor[K, T, ACC, OUT]) OnTimer(ctx *KeyedContext[K], ts int64, out Collector[OUT]) error {
	p.ctx, p.out = ctx, out
	if al := p.op.al; al != nil {
		if w, e, ok := al.firingEntry(ctx.host.firing); ok {
			return p.op.fire(e.key, w, e.acc, false)
		}
		return nil // a default timer: none is registered with aligned windows, and a restore adopts the windows'
	}
	return p.op.onTimer(ctx.Key(), ts, ctx.TimeDomain() == EventTime)
}

// ctxTimers are the timers of the call in progress.
type ctxTimers[K comparable, T, ACC, OUT any] struct {
	p *windowProcessor[K, T, ACC, OUT]
}

func (c ctxTimers[K, T, ACC, OUT]) currentWatermark() int64 { return c.p.ctx.CurrentWatermark() }
func (c ctxTimers[K, T, ACC, OUT]) currentProcessingTime() int64 {
	return c.p.ctx.TimerService().CurrentProcessingTime()
}
func (c ctxTimers[K, T, ACC, OUT]) registerEventTimeTimer(ts int64) {
	c.p.ctx.TimerService().RegisterEventTimeTimer(ts)
}
func (c ctxTimers[K, T, ACC, OUT]) deleteEventTimeTimer(ts int64) {
	c.p.ctx.TimerService().DeleteEventTimeTimer(ts)
}
func (c ctxTimers[K, T, ACC, OUT]) registerProcessingTimeTimer(ts int64) {
	c.p.ctx.TimerService().RegisterProcessingTimeTimer(ts)
}
func (c ctxTimers[K, T, ACC, OUT]) deleteProcessingTimeTimer(ts int64) {
	c.p.ctx.TimerService().DeleteProcessingTimeTimer(ts)
}

// WindowOutput emits v to the side output tag from a ProcessWindowFunction
// (a window's records that need another stream). It carries the timestamp
// of the window's result.
func WindowOutput[T any, K comparable](ctx *WindowContext[K], tag OutputTag[T], v T) {
	if ctx.kctx != nil {
		Output(ctx.kctx, tag, v)
	}
}
