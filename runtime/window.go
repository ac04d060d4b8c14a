package runtime

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// TimeWindow is the time interval [Start, End) of a window, in epoch
// milliseconds (event time or processing time, as its assigner says).
type TimeWindow struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
}

// MaxTimestamp is the last millisecond inside the window (End-1): an
// event-time window fires when the watermark reaches it, and every result
// of a window carries it as its event timestamp (as in Flink).
func (w TimeWindow) MaxTimestamp() int64 { return w.End - 1 }

// String formats w as [Start,End).
func (w TimeWindow) String() string { return fmt.Sprintf("[%d,%d)", w.Start, w.End) }

// intersects reports whether w and o overlap or touch: session windows
// that intersect merge. As Flink's TimeWindow.intersects it is inclusive
// (start <= other.end && end >= other.start), so [0,10) and [10,20) merge
// into [0,20): a session element exactly the gap after the previous one
// joins its session, one more than the gap after starts a new session.
func (w TimeWindow) intersects(o TimeWindow) bool { return w.Start <= o.End && o.Start <= w.End }

// windowCodec encodes a TimeWindow as two big-endian int64.
type windowCodec struct{}

func (windowCodec) Append(dst []byte, w TimeWindow) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(w.Start))
	return binary.BigEndian.AppendUint64(dst, uint64(w.End))
}

func (windowCodec) Decode(b []byte) (TimeWindow, error) {
	if len(b) != 16 {
		return TimeWindow{}, fmt.Errorf("%w window from %d bytes", ErrDecode, len(b))
	}
	return TimeWindow{Start: int64(binary.BigEndian.Uint64(b)), End: int64(binary.BigEndian.Uint64(b[8:]))}, nil
}

// windowKind is the shape of an assigner's windows.
type windowKind uint8

const (
	windowTumbling windowKind = iota + 1
	windowSliding
	windowSession
)

// WindowAssigner assigns each record of a keyed stream to windows: tumbling,
// sliding or session windows, in event time (the record's timestamp, fired
// by the watermark) or in processing time (the wall clock when the record
// is processed, fired by the clock). Make one with TumblingEventTimeWindows,
// SlidingEventTimeWindows, EventTimeSessionWindows or their processing-time
// counterparts; the zero value is invalid.
//
// Durations are whole milliseconds. An invalid assigner (a size that is
// not positive, an offset not below the slide) fails the job when it is
// built.
type WindowAssigner struct {
	kind      windowKind
	eventTime bool
	size      int64 // ms; tumbling and sliding
	slide     int64 // ms; sliding (== size for tumbling)
	offset    int64 // ms; tumbling and sliding
	gap       int64 // ms; sessions
	err       error
}

// WindowAssignerOpt configures a WindowAssigner.
type WindowAssignerOpt interface{ apply(*WindowAssigner) }

type windowAssignerOpt func(*WindowAssigner)

func (o windowAssignerOpt) apply(a *WindowAssigner) { o(a) }

// WindowOffset shifts the start of tumbling and sliding windows by d (as
// Flink's offset: daily windows starting at 08:00 UTC are 24h windows with
// offset 8h). |d| must be below the slide (the size, for tumbling
// windows). Session windows take no offset.
func WindowOffset(d time.Duration) WindowAssignerOpt {
	return windowAssignerOpt(func(a *WindowAssigner) {
		if a.kind == windowSession {
			a.fail(fmt.Errorf("session windows take no offset"))
			return
		}
		a.offset = a.millis("offset", d, true)
	})
}

// TumblingEventTimeWindows assigns each record to the one window of length
// size that holds its timestamp: [k*size+offset, (k+1)*size+offset).
func TumblingEventTimeWindows(size time.Duration, opts ...WindowAssignerOpt) WindowAssigner {
	return newAligned(windowTumbling, true, size, size, opts)
}

// TumblingProcessingTimeWindows is TumblingEventTimeWindows on the
// operator's processing time.
func TumblingProcessingTimeWindows(size time.Duration, opts ...WindowAssignerOpt) WindowAssigner {
	return newAligned(windowTumbling, false, size, size, opts)
}

// SlidingEventTimeWindows assigns each record to the size/slide windows of
// length size, starting every slide, that hold its timestamp.
func SlidingEventTimeWindows(size, slide time.Duration, opts ...WindowAssignerOpt) WindowAssigner {
	return newAligned(windowSliding, true, size, slide, opts)
}

// SlidingProcessingTimeWindows is SlidingEventTimeWindows on the operator's
// processing time.
func SlidingProcessingTimeWindows(size, slide time.Duration, opts ...WindowAssignerOpt) WindowAssigner {
	return newAligned(windowSliding, false, size, slide, opts)
}

// EventTimeSessionWindows assigns each record to the window [ts, ts+gap) and
// merges the windows of a key that overlap or touch (as Flink, whose
// TimeWindow.intersects is inclusive): a session ends when its key has no
// record for more than gap. A record exactly gap after the previous one
// joins its session ([0,10) and [10,20) merge into [0,20)); a record more
// than gap after it starts a new session.
func EventTimeSessionWindows(gap time.Duration) WindowAssigner {
	a := WindowAssigner{kind: windowSession, eventTime: true}
	a.gap = a.millis("gap", gap, false)
	return a
}

// ProcessingTimeSessionWindows is EventTimeSessionWindows on the operator's
// processing time.
func ProcessingTimeSessionWindows(gap time.Duration) WindowAssigner {
	a := WindowAssigner{kind: windowSession}
	a.gap = a.millis("gap", gap, false)
	return a
}

func newAligned(kind windowKind, eventTime bool, size, slide time.Duration, opts []WindowAssignerOpt) WindowAssigner {
	a := WindowAssigner{kind: kind, eventTime: eventTime}
	a.size = a.millis("size", size, false)
	a.slide = a.millis("slide", slide, false)
	for _, o := range opts {
		o.apply(&a)
	}
	if a.err == nil && (a.offset >= a.slide || -a.offset >= a.slide) {
		a.fail(fmt.Errorf("offset %v must be below the slide %v", time.Duration(a.offset)*time.Millisecond, slide))
	}
	if a.err == nil && kind == windowSliding && a.slide > a.size {
		// Flink allows it (records between windows belong to none); a
		// record that belongs to no window would be lost silently.
		a.fail(fmt.Errorf("slide %v must not exceed the size %v", slide, size))
	}
	return a
}

// millis converts d to whole milliseconds, recording an error for a
// duration that is not a positive (or, with zeroOK, non-negative) whole
// number of milliseconds.
func (a *WindowAssigner) millis(what string, d time.Duration, zeroOK bool) int64 {
	switch {
	case d%time.Millisecond != 0:
		a.fail(fmt.Errorf("%s %v is not a whole number of milliseconds", what, d))
	case d < 0 && !zeroOK, d == 0 && !zeroOK:
		a.fail(fmt.Errorf("%s %v must be positive", what, d))
	}
	return d.Milliseconds()
}

func (a *WindowAssigner) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// validate returns why a cannot be used, wrapping ErrInvalidJob.
func (a WindowAssigner) validate() error {
	switch {
	case a.kind == 0:
		return fmt.Errorf("%w: window assigner: zero WindowAssigner", ErrInvalidJob)
	case a.err != nil:
		return fmt.Errorf("%w: window assigner %s: %w", ErrInvalidJob, a, a.err)
	}
	return nil
}

// IsEventTime reports whether a assigns windows by event time.
func (a WindowAssigner) IsEventTime() bool { return a.eventTime }

// String describes a, e.g. "sliding event-time windows of 10s every 5s".
func (a WindowAssigner) String() string {
	t := "processing-time"
	if a.eventTime {
		t = "event-time"
	}
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	var s string
	switch a.kind {
	case windowTumbling:
		s = fmt.Sprintf("tumbling %s windows of %v", t, ms(a.size))
	case windowSliding:
		s = fmt.Sprintf("sliding %s windows of %v every %v", t, ms(a.size), ms(a.slide))
	case windowSession:
		return fmt.Sprintf("%s session windows with gap %v", t, ms(a.gap))
	default:
		return "invalid window assigner"
	}
	if a.offset != 0 {
		s += fmt.Sprintf(" offset %v", ms(a.offset))
	}
	return s
}

// windowStart is the start of the window of length size (aligned to
// offset) that holds ts.
func windowStart(ts, offset, size int64) int64 {
	m := (ts - offset) % size
	if m < 0 {
		m += size
	}
	return ts - m
}

// paneSize is the length of the panes of aligned windows: the greatest
// common divisor of size and slide, so every window is a whole number of
// panes and every pane lies in the same windows.
func (a WindowAssigner) paneSize() int64 {
	x, y := a.size, a.slide
	for y != 0 {
		x, y = y, x%y
	}
	return x
}

// addSat adds without overflowing past math.MaxInt64 (a window near the end
// of time plus its allowed lateness).
func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// AggregateFunction aggregates the records of a window incrementally into
// an accumulator: one accumulator per key and window (per pane, for sliding
// windows), never a copy of the records.
//
// Accumulators are state: stored by value and snapshotted while processing
// goes on. Add and Merge must return their result and leave their
// arguments unchanged (natural for value types; an accumulator holding a
// map or a slice must be copied before it changes). GetResult must not
// change acc. Merge combines the accumulators of two panes of a sliding
// window and of two sessions that merge: it must be associative, and its
// result must not depend on how the records were split between a and b.
type AggregateFunction[IN, ACC, OUT any] interface {
	CreateAccumulator() ACC
	Add(v IN, acc ACC) ACC
	GetResult(acc ACC) OUT
	Merge(a, b ACC) ACC
}

// WindowContext is what a ProcessWindowFunction learns about the window
// that fires.
type WindowContext[K comparable] struct {
	// Key is the key of the window's records.
	Key K
	// Window is the window that fires.
	Window TimeWindow
	// Watermark is the operator's event-time watermark when the window
	// fires (math.MinInt64 before the first watermark).
	Watermark int64
	// Late is true for a late firing: an event-time window firing again
	// because a record arrived after the watermark passed its end, within
	// the allowed lateness.
	Late bool

	kctx *KeyedContext[K] // of the firing, for WindowOutput
}

// ProcessWindowFunction sees all the records of a window when it fires, with
// the window's key and bounds. The runtime keeps every record of the window
// until then (prefer an AggregateFunction when the result can be computed
// incrementally). elements is a copy of the window's records, never the
// window state itself: Process may sort or change it without changing what
// a later firing of the window sees. It must not be retained after Process
// returns (the runtime reuses its array for the next firing).
type ProcessWindowFunction[K comparable, IN, OUT any] interface {
	Process(ctx *WindowContext[K], elements []IN, out Collector[OUT]) error
}

// ProcessWindowFunc adapts a function to a ProcessWindowFunction.
type ProcessWindowFunc[K comparable, IN, OUT any] func(ctx *WindowContext[K], elements []IN, out Collector[OUT]) error

// Process implements ProcessWindowFunction.
func (f ProcessWindowFunc[K, IN, OUT]) Process(ctx *WindowContext[K], elements []IN, out Collector[OUT]) error {
	return f(ctx, elements, out)
}
