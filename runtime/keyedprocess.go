package runtime

import "context"

// KeyedProcessor is a keyed process function with event time and timers
// (Flink's KeyedProcessFunction with its Context and OnTimerContext):
// ProcessElement sees one record with a KeyedContext giving the current
// key, the record's timestamp, the TimerService and side outputs; OnTimer
// runs when one of the operator's timers fires, with its key in scope (and
// its keyed state scoped to it). Records emitted from ProcessElement carry
// the input record's timestamp, those from an event-time OnTimer the
// timer's timestamp, those from a processing-time OnTimer none. Run it with
// ProcessKeyed. Open declares state (NewValueState, NewMapState) and
// namespaced timers (NewTimers).
type KeyedProcessor[K comparable, T, U any] interface {
	Open(ctx context.Context, st *StateRegistry[K]) error
	ProcessElement(ctx *KeyedContext[K], v T, out Collector[U]) error
	OnTimer(ctx *KeyedContext[K], ts int64, out Collector[U]) error
}

// KeyedContext is what a KeyedProcessor's ProcessElement and OnTimer see.
// It is valid only during the call.
type KeyedContext[K comparable] struct {
	host    *timerHost[K]
	now     *recordTime
	service TimerService
	side    sideOutputs
}

// Key is the current key: the record's, or the firing timer's.
func (c *KeyedContext[K]) Key() K { return c.host.scope.key }

// Timestamp is the record's event timestamp in ProcessElement (NoTimestamp
// if it has none), the timer's timestamp in OnTimer.
func (c *KeyedContext[K]) Timestamp() int64 {
	if f := c.host.firing; f != nil {
		return f.ts
	}
	return c.now.ts
}

// TimeDomain is the domain of the firing timer in OnTimer (0 in
// ProcessElement).
func (c *KeyedContext[K]) TimeDomain() TimeDomain {
	if f := c.host.firing; f != nil {
		return f.domain
	}
	return 0
}

// TimerService registers and deletes the current key's timers (without a
// namespace; see NewTimers for namespaced ones).
func (c *KeyedContext[K]) TimerService() TimerService { return c.service }

// CurrentWatermark is the operator's input watermark.
func (c *KeyedContext[K]) CurrentWatermark() int64 { return c.host.watermark }

// ProcessKeyed runs a KeyedProcessor on a keyed stream. newFn is called
// once per subtask and attempt.
func ProcessKeyed[K comparable, T, U any](ks *KeyedStream[K, T], name string, newFn func() KeyedProcessor[K, T, U], opts ...OpOpt) *Stream[U] {
	return process(ks, name, func() keyedFunction[K, T, U] { return keyedFunction[K, T, U]{proc: newFn()} }, opts)
}

// keyedFunction is the user function of a keyed operator: a
// KeyedProcessFunction (Process) or a KeyedProcessor (ProcessKeyed).
type keyedFunction[K comparable, T, U any] struct {
	fn   KeyedProcessFunction[K, T, U]
	proc KeyedProcessor[K, T, U]
}

func (f keyedFunction[K, T, U]) open(ctx context.Context, st *StateRegistry[K]) error {
	if f.proc != nil {
		return f.proc.Open(ctx, st)
	}
	return f.fn.Open(ctx, st)
}

func (f keyedFunction[K, T, U]) user() any {
	if w, ok := f.proc.(interface{ userFunction() any }); ok {
		return w.userFunction()
	}
	if f.proc != nil {
		return f.proc
	}
	return f.fn
}
