package runtime

import (
	"fmt"
	"math"
	"slices"
)

// This file holds the window operator as a state machine: records, timers
// and the watermark in, window results and late records out. It reaches
// timers and the clock through windowTimers and keeps its state in one
// MapState per key (window -> accumulator), so it is tested on its own
// (window_test.go: transcripts of events in, firings out) and wired to a
// keyed process function with the runtime's timer service.
//
// Aligned windows (tumbling and sliding) keep one accumulator per pane: a
// pane is gcd(size, slide) long, every window is a whole number of panes,
// and every record falls into exactly one pane. A record costs one Add
// however many windows hold it (size/slide of them), and a window's result
// merges its size/pane panes when it fires. Copying each record into every
// window, as Flink's WindowOperator does, multiplies both the state and the
// Add calls by size/slide (a 1h window sliding every 1m: 60 copies). A
// tumbling window is its single pane. Panes give Flink's result only for a
// function whose result does not depend on how the records were split
// (an AggregateFunction must be so, see its Merge); a reduce need not be
// commutative, so sliding windows of a reduce (an ordered windowFunc)
// keep one accumulator per window, each record added to every window in
// arrival order, as Flink does.
//
// Session windows are Flink's merging windows: each record opens the window
// [ts, ts+gap); a window intersecting existing windows of the key (they
// overlap or touch: Flink's TimeWindow.intersects is inclusive) merges
// with them into their cover, their accumulators merged, their timers
// deleted (unless another window of the key still needs the same time) and
// the cover's timers registered. The state is kept under the merged window
// itself (Flink keeps it under one of the merged windows and a mapping; the
// results are the same).
//
// Triggers are Flink's defaults. Event time: a window fires when the
// watermark reaches its MaxTimestamp, and again for every record added
// while the watermark is past its end but within the allowed lateness (a
// late firing, with the updated result); its state goes at MaxTimestamp
// plus the allowed lateness (the cleanup timer). A record whose windows are
// all past that point is late: it goes to the late output and is counted,
// never dropped silently. Processing time: a window fires once, when the
// clock reaches its End (Flink: MaxTimestamp, which lets a record processed
// in that last millisecond reopen the window and fire it twice), and its
// state goes with it; no record is late.
//
// Timers are the runtime's timers per key and timestamp (one per key and
// timestamp, whatever window asked for it): when one fires, the operator
// fires the key's window ending there and clears the state whose cleanup
// time it is.

// windowTimers is what the window operator needs of the timer service and
// the clock, for the key in scope.
type windowTimers interface {
	currentWatermark() int64
	currentProcessingTime() int64
	registerEventTimeTimer(ts int64)
	deleteEventTimeTimer(ts int64)
	registerProcessingTimeTimer(ts int64)
	deleteProcessingTimeTimer(ts int64)
}

// windowFunc is how a window's contents accumulate and turn into results:
// an AggregateFunction, a reduce, or the records themselves for a
// ProcessWindowFunction.
type windowFunc[K comparable, IN, ACC, OUT any] struct {
	create func() ACC
	add    func(acc ACC, v IN) (ACC, error)
	// merge must leave a and b unchanged.
	merge  func(a, b ACC) (ACC, error)
	result func(ctx *WindowContext[K], acc ACC, out Collector[OUT]) error
	codec  Codec[ACC]
	// ordered: the result may depend on the order of the records (a
	// reduce, whose function need not be commutative), so each window of
	// a sliding assigner keeps its own accumulator and gets every record
	// in arrival order, as in Flink, instead of merging its panes.
	ordered bool
}

// aggregateWindowFunc accumulates with an AggregateFunction.
func aggregateWindowFunc[K comparable, IN, ACC, OUT any](f AggregateFunction[IN, ACC, OUT], c Codec[ACC]) windowFunc[K, IN, ACC, OUT] {
	return windowFunc[K, IN, ACC, OUT]{
		create: f.CreateAccumulator,
		add:    func(acc ACC, v IN) (ACC, error) { return f.Add(v, acc), nil },
		merge:  func(a, b ACC) (ACC, error) { return f.Merge(a, b), nil },
		result: func(_ *WindowContext[K], acc ACC, out Collector[OUT]) error {
			out.Collect(f.GetResult(acc))
			return nil
		},
		codec: c,
	}
}

// reduceAcc is a reduce's accumulator: nothing yet, or the reduced value.
type reduceAcc[T any] struct {
	Set bool `json:"set"`
	V   T    `json:"v"`
}

// reduceWindowFunc reduces the records of a window with fn, which must be
// associative: merged sessions are reduced separately and then together.
// fn need not be commutative: the operator reduces each window of a sliding
// assigner in arrival order (ordered), never pane by pane.
func reduceWindowFunc[K comparable, T any](fn func(a, b T) (T, error), c Codec[T]) windowFunc[K, T, reduceAcc[T], T] {
	red := func(a, b reduceAcc[T]) (reduceAcc[T], error) {
		if !a.Set {
			return b, nil
		}
		if !b.Set {
			return a, nil
		}
		v, err := fn(a.V, b.V)
		return reduceAcc[T]{Set: true, V: v}, err
	}
	var ac Codec[reduceAcc[T]]
	if c != nil {
		ac = reduceAccCodec[T]{c}
	}
	return windowFunc[K, T, reduceAcc[T], T]{
		create: func() reduceAcc[T] { return reduceAcc[T]{} },
		add:    func(acc reduceAcc[T], v T) (reduceAcc[T], error) { return red(acc, reduceAcc[T]{Set: true, V: v}) },
		merge:  red,
		result: func(_ *WindowContext[K], acc reduceAcc[T], out Collector[T]) error {
			if acc.Set {
				out.Collect(acc.V)
			}
			return nil
		},
		codec:   ac,
		ordered: true,
	}
}

// reduceAccCodec encodes a reduce accumulator with the value's codec.
type reduceAccCodec[T any] struct{ c Codec[T] }

func (r reduceAccCodec[T]) Append(dst []byte, a reduceAcc[T]) []byte {
	if !a.Set {
		return append(dst, 0)
	}
	return r.c.Append(append(dst, 1), a.V)
}

func (r reduceAccCodec[T]) Decode(b []byte) (reduceAcc[T], error) {
	if len(b) == 0 || b[0] > 1 {
		return reduceAcc[T]{}, fmt.Errorf("%w reduce accumulator", ErrDecode)
	}
	if b[0] == 0 {
		return reduceAcc[T]{}, nil
	}
	v, err := r.c.Decode(b[1:])
	return reduceAcc[T]{Set: true, V: v}, err
}

// processWindowFunc keeps the records of a window for fn. The records of
// one window are in arrival order within a pane, and panes in time order.
//
// With copyElements, fn gets a copy of the window's records, never the
// state's own slice: sorting it in place would rewrite the stored window
// (a later firing would see another order), and a snapshot encoding the
// state on another goroutine could read it while fn changes it. The copy
// goes into a buffer reused from firing to firing (so each processWindowFunc
// must serve one subtask), cleared after fn returns so that it does not
// keep the records alive. Without copyElements, fn must only read them.
func processWindowFunc[K comparable, IN, OUT any](fn ProcessWindowFunction[K, IN, OUT], c Codec[IN], copyElements bool) windowFunc[K, IN, []IN, OUT] {
	var lc Codec[[]IN]
	if c != nil {
		lc = listCodec[IN]{c}
	}
	var buf []IN
	result := func(ctx *WindowContext[K], acc []IN, out Collector[OUT]) error {
		return fn.Process(ctx, acc, out)
	}
	if copyElements {
		result = func(ctx *WindowContext[K], acc []IN, out Collector[OUT]) error {
			buf = append(buf[:0], acc...)
			err := fn.Process(ctx, buf[:len(acc):len(acc)], out)
			clear(buf)
			return err
		}
	}
	return windowFunc[K, IN, []IN, OUT]{
		create: func() []IN { return nil },
		// Appending is safe for snapshots: it writes only beyond the
		// length a snapshot saw.
		add: func(acc []IN, v IN) ([]IN, error) { return append(acc, v), nil },
		merge: func(a, b []IN) ([]IN, error) {
			out := make([]IN, 0, len(a)+len(b))
			return append(append(out, a...), b...), nil
		},
		result: result,
		codec:  lc,
	}
}

// listCodec encodes a list as framed elements.
type listCodec[T any] struct{ c Codec[T] }

func (l listCodec[T]) Append(dst []byte, vs []T) []byte {
	var buf []byte
	for _, v := range vs {
		buf = l.c.Append(buf[:0], v)
		dst = appendFrame(dst, buf)
	}
	return dst
}

func (l listCodec[T]) Decode(b []byte) ([]T, error) {
	var out []T
	for len(b) > 0 {
		f, rest, err := readFrame(b)
		if err != nil {
			return nil, err
		}
		v, err := l.c.Decode(f)
		if err != nil {
			return nil, err
		}
		out, b = append(out, v), rest
	}
	return out, nil
}

// windowState is the name of the window operator's keyed state.
const windowState = "window-contents"

// windowOperator is the window state machine of one keyed subtask. Its
// caller scopes the keyed state to the record's (or the timer's) key before
// each call.
type windowOperator[K comparable, IN, ACC, OUT any] struct {
	asg      WindowAssigner
	lateness int64 // ms, event time only
	fn       windowFunc[K, IN, ACC, OUT]
	timers   windowTimers
	// perWindow: the aligned windows keep one accumulator each, not one per
	// pane (an ordered function on sliding windows). mayHoldPanes: the
	// operator was restored from a checkpoint, which may hold panes of such
	// windows (taken before reduces went per window): the key's panes are
	// turned into windows when the key is next in scope.
	perWindow    bool
	mayHoldPanes bool
	// restoredEnd bounds the end of every window restored into the
	// operator (restoredWindowsEnd): a pane that starts at or after it was
	// made by this operator, which set the timers of its windows then
	// (timerSet).
	restoredEnd int64
	// state maps each window (a pane, for aligned windows) of the key in
	// scope to its accumulator; nil with al.
	state *MapState[TimeWindow, ACC]
	// al is the state of event-time tumbling windows on the heap backend,
	// a window at a time (window_aligned.go), instead of state and the
	// key's timers.
	al *alignedWindows[K, ACC]
	// emit receives a window's results; late receives the late records (nil:
	// they are counted and dropped).
	emit func(w TimeWindow, v OUT) error
	late func(v IN) error

	lateRecords int64 // records past every window's cleanup time

	col  windowCollector[OUT]
	wctx WindowContext[K]
	// ctxHook completes the context of a firing (the keyed context, for side
	// outputs); nil in the transcripts.
	ctxHook func(*WindowContext[K])
	// stamp sets the event timestamp of what a firing emits and returns the
	// one it replaces (restored after the firing); nil in the transcripts.
	stamp func(ts int64) (prev int64)

	// onTimer's scan of the key's windows (scanForTimer), made once:
	// the timer's window and time, and what the scan collects.
	timerScan     func(TimeWindow, ACC) bool
	tw            TimeWindow
	tts           int64
	tfires        bool
	tpanes, tgone []TimeWindow
}

// windowCollector hands a firing's results to emit, keeping the first error.
type windowCollector[OUT any] struct {
	emit func(w TimeWindow, v OUT) error
	w    TimeWindow
	err  error
}

func (c *windowCollector[OUT]) Collect(v OUT) {
	if c.err == nil {
		c.err = c.emit(c.w, v)
	}
}

// newWindowOperator declares the operator's state in r: aligned windows
// (window_aligned.go) where they apply.
func newWindowOperator[K comparable, IN, ACC, OUT any](r *StateRegistry[K], asg WindowAssigner, lateness int64,
	fn windowFunc[K, IN, ACC, OUT], timers windowTimers, emit func(TimeWindow, OUT) error, late func(IN) error) (*windowOperator[K, IN, ACC, OUT], error) {
	return newWindowOperatorOn(r, asg, lateness, fn, timers, emit, late, true)
}

// newWindowOperatorOn is newWindowOperator; without aligned, event-time
// tumbling windows keep the general path's state and timers.
func newWindowOperatorOn[K comparable, IN, ACC, OUT any](r *StateRegistry[K], asg WindowAssigner, lateness int64,
	fn windowFunc[K, IN, ACC, OUT], timers windowTimers, emit func(TimeWindow, OUT) error, late func(IN) error, aligned bool) (*windowOperator[K, IN, ACC, OUT], error) {
	if err := asg.validate(); err != nil {
		return nil, err
	}
	if !asg.eventTime {
		lateness = 0 // processing time has no late records
	}
	perWindow := fn.ordered && asg.kind == windowSliding && asg.paneSize() != asg.size
	restored := len(r.b.restored[windowState]) > 0
	if aligned && asg.eventTime && asg.kind != windowSession && asg.paneSize() == asg.size {
		op := &windowOperator[K, IN, ACC, OUT]{asg: asg, lateness: lateness, fn: fn, timers: timers, emit: emit, late: late,
			restoredEnd: math.MinInt64}
		al, err := newAlignedWindows[K](r, fn.codec, lateness, op.cleanupTime)
		if err != nil {
			return nil, err
		}
		if al != nil {
			op.al = al
			op.col.emit = emit
			return op, nil
		}
	}
	st, err := newWindowState[ACC](r, fn.codec)
	if err != nil {
		return nil, err
	}
	op := &windowOperator[K, IN, ACC, OUT]{asg: asg, lateness: lateness, fn: fn, timers: timers, state: st, emit: emit, late: late,
		perWindow: perWindow, mayHoldPanes: perWindow && restored, restoredEnd: restoredWindowsEnd(r.b.timers)}
	op.col.emit = emit
	op.timerScan = op.scanForTimer
	return op, nil
}

// restoredWindowsEnd bounds the end of every window restored into a window
// operator of the subtask whose timers are h's: one past the latest of its
// timers when the operator opens, math.MinInt64 if it has none (a fresh
// start). A window a checkpoint holds keeps a timer at or after its last
// millisecond (its fire time, or its cleanup time once it fired) until its
// state goes: the general path registers them, and the aligned path's
// snapshot writes them. Reading the timers costs a seek per key group on
// pebble, where the windows' own latest end would cost a scan of the state.
func restoredWindowsEnd[K comparable](h *timerHost[K]) int64 {
	end := int64(math.MinInt64)
	for _, s := range h.services {
		if l, ok := s.(interface{ latestTimer() (int64, bool) }); ok {
			if ts, ok := l.latestTimer(); ok {
				end = max(end, addSat(ts, 1))
			}
		}
	}
	return end
}

// fireTime is when w fires: when the watermark reaches its last
// millisecond in event time (Flink's trigger); in processing time when the
// clock reaches its end, so that no record can arrive in a window after it
// fired (the clock at w.MaxTimestamp still assigns records to w; Flink's
// processing-time trigger, firing at MaxTimestamp, then fires w twice).
func (op *windowOperator[K, IN, ACC, OUT]) fireTime(w TimeWindow) int64 {
	if op.asg.eventTime {
		return w.MaxTimestamp()
	}
	return w.End
}

// cleanupTime is when w's state goes: its fire time plus the allowed
// lateness (which is 0 in processing time).
func (op *windowOperator[K, IN, ACC, OUT]) cleanupTime(w TimeWindow) int64 {
	return addSat(op.fireTime(w), op.lateness)
}

// isLate reports whether w's state is gone already (or would be): an
// event-time window whose cleanup time the watermark reached.
func (op *windowOperator[K, IN, ACC, OUT]) isLate(w TimeWindow) bool {
	return op.asg.eventTime && op.cleanupTime(w) <= op.timers.currentWatermark()
}

func (op *windowOperator[K, IN, ACC, OUT]) registerTimer(ts int64) {
	if op.asg.eventTime {
		op.timers.registerEventTimeTimer(ts)
	} else {
		op.timers.registerProcessingTimeTimer(ts)
	}
}

func (op *windowOperator[K, IN, ACC, OUT]) deleteTimer(ts int64) {
	if op.asg.eventTime {
		op.timers.deleteEventTimeTimer(ts)
	} else {
		op.timers.deleteProcessingTimeTimer(ts)
	}
}

// registerFireTimer sets w to fire at its end, unless the watermark is past
// it already (the record then fires w at once: a late firing); false then.
func (op *windowOperator[K, IN, ACC, OUT]) registerFireTimer(w TimeWindow) bool {
	if op.asg.eventTime && w.MaxTimestamp() <= op.timers.currentWatermark() {
		return false
	}
	op.registerTimer(op.fireTime(w))
	return true
}

// processElement adds v, of key key and event timestamp ts (ignored in
// processing time), to its windows.
func (op *windowOperator[K, IN, ACC, OUT]) processElement(key K, ts int64, v IN) error {
	if !op.asg.eventTime {
		ts = op.timers.currentProcessingTime()
	}
	if op.al != nil {
		return op.processAlignedWindow(key, ts, v)
	}
	if op.asg.kind == windowSession {
		return op.processSession(key, ts, v)
	}
	if op.perWindow {
		return op.processPerWindow(key, ts, v)
	}
	return op.processAligned(key, ts, v)
}

// lateRecord sends v to the late output, or counts it as dropped.
func (op *windowOperator[K, IN, ACC, OUT]) lateRecord(v IN) error {
	op.lateRecords++
	if op.late == nil {
		return nil
	}
	return op.late(v)
}

// windowsOf calls fn for every aligned window holding ts, earliest first.
func (op *windowOperator[K, IN, ACC, OUT]) windowsOf(ts int64, fn func(TimeWindow) error) error {
	last := windowStart(ts, op.asg.offset, op.asg.slide)
	first := last
	for first-op.asg.slide > ts-op.asg.size {
		first -= op.asg.slide
	}
	for s := first; s <= last; s += op.asg.slide {
		if err := fn(TimeWindow{Start: s, End: s + op.asg.size}); err != nil {
			return err
		}
	}
	return nil
}

// lastWindowOf is the latest aligned window holding ts: the last to fire
// and be cleaned up.
func (op *windowOperator[K, IN, ACC, OUT]) lastWindowOf(ts int64) TimeWindow {
	s := windowStart(ts, op.asg.offset, op.asg.slide)
	return TimeWindow{Start: s, End: s + op.asg.size}
}

func (op *windowOperator[K, IN, ACC, OUT]) paneOf(ts int64) TimeWindow {
	p := op.asg.paneSize()
	s := windowStart(ts, op.asg.offset, p)
	return TimeWindow{Start: s, End: s + p}
}

func (op *windowOperator[K, IN, ACC, OUT]) processAligned(key K, ts int64, v IN) error {
	if op.isLate(op.lastWindowOf(ts)) {
		return op.lateRecord(v)
	}
	pane := op.paneOf(ts)
	acc, existed := op.state.Get(pane)
	if !existed {
		acc = op.fn.create()
	}
	acc, err := op.fn.add(acc, v)
	if err != nil {
		return err
	}
	op.state.Put(pane, acc)
	if !existed {
		// A pane lies in the same windows whatever its record, so its
		// timers are set once, when it is made. The last window's cleanup
		// time is its fire time without allowed lateness: its timer is
		// set already (one timer per key and time).
		last := op.lastWindowOf(ts)
		lastFires := false
		if err := op.windowsOf(ts, func(w TimeWindow) error {
			if !op.isLate(w) && (op.timerSet(w, pane) || op.registerFireTimer(w)) && w == last {
				lastFires = true
			}
			return nil
		}); err != nil {
			return err
		}
		if cl := op.cleanupTime(last); !lastFires || cl != op.fireTime(last) {
			op.registerTimer(cl)
		}
	}
	if !op.asg.eventTime {
		return nil
	}
	wm := op.timers.currentWatermark()
	return op.windowsOf(ts, func(w TimeWindow) error {
		if w.MaxTimestamp() <= wm && !op.isLate(w) {
			return op.fireAligned(key, w, true)
		}
		return nil
	})
}

// processAlignedWindow adds v to its window's accumulator of the key in
// scope (op.al: event-time tumbling windows), and fires the window at once
// if the watermark passed its end (a late firing).
func (op *windowOperator[K, IN, ACC, OUT]) processAlignedWindow(key K, ts int64, v IN) error {
	w := op.lastWindowOf(ts)
	if op.isLate(w) {
		return op.lateRecord(v)
	}
	win := op.al.window(w)
	e := op.al.entry(win, op.fn.create)
	acc, err := op.fn.add(e.acc, v)
	if err != nil {
		return err
	}
	e.acc = acc
	if w.MaxTimestamp() <= op.timers.currentWatermark() {
		return op.fire(key, w, acc, true)
	}
	return nil
}

// cachedPanes is a window store's view of the panes of the key in scope
// without a read of storage: the heap store always knows whether a pane is
// present; the pebble map state knows when its cache holds the key.
type cachedPanes interface {
	cachedEntry(p TimeWindow) (present, known bool)
}

// timerSet reports whether w's fire timer is set for the key in scope
// already, so that its new pane need not register it again (a registration
// probes the heap timer queue's set, or writes a pebble key: q5's sliding
// windows set five a pane, four of them set already when the key had a
// record in the pane before). It is when w is not due yet and the key has
// another pane in w made by this operator (one starting at or after every
// restored window's end): that pane's record registered w's fire timer,
// and aligned windows delete none. It says false where it does not know:
// tumbling windows, whose window is the pane, and on pebble a key the map
// state's cache does not hold (the pane's own lookup has just filled it,
// so this is rare).
func (op *windowOperator[K, IN, ACC, OUT]) timerSet(w, pane TimeWindow) bool {
	if w == pane || w.Start < op.restoredEnd ||
		(op.asg.eventTime && w.MaxTimestamp() <= op.timers.currentWatermark()) {
		return false
	}
	c, ok := op.state.s.(cachedPanes)
	if !ok {
		return false
	}
	ps := op.asg.paneSize()
	for p := (TimeWindow{Start: w.Start, End: w.Start + ps}); p.End <= w.End; p.Start, p.End = p.End, p.End+ps {
		if p == pane {
			continue
		}
		present, known := c.cachedEntry(p)
		if !known {
			return false
		}
		if present {
			return true
		}
	}
	return false
}

// processPerWindow adds v to each of its windows that is not late, in
// arrival order, as Flink's WindowOperator adds a record to every window
// of its assigner (and skips the late ones): each window keeps its own
// accumulator, so a function that is not commutative ("keep the last
// record") gives Flink's result. A record costs one Add per window
// (size/slide of them), where panes cost one.
func (op *windowOperator[K, IN, ACC, OUT]) processPerWindow(key K, ts int64, v IN) error {
	if err := op.migratePanes(); err != nil {
		return err
	}
	if op.isLate(op.lastWindowOf(ts)) {
		return op.lateRecord(v)
	}
	wm := op.timers.currentWatermark()
	return op.windowsOf(ts, func(w TimeWindow) error {
		if op.isLate(w) {
			return nil
		}
		acc, existed := op.state.Get(w)
		if !existed {
			acc = op.fn.create()
		}
		acc, err := op.fn.add(acc, v)
		if err != nil {
			return err
		}
		op.state.Put(w, acc)
		if !existed {
			op.registerFireTimer(w)
			op.registerTimer(op.cleanupTime(w))
		}
		if op.asg.eventTime && w.MaxTimestamp() <= wm {
			return op.fire(key, w, acc, true) // a late firing
		}
		return nil
	})
}

// migratePanes turns the panes of the key in scope, restored from a
// checkpoint taken when every aligned window kept one accumulator per
// pane, into one accumulator per window: its panes merged in time order,
// the result it had then. Every window of a pane is made, also one whose
// time passed: its timer may not have fired yet (the watermark moves
// before the timers up to it fire), and one that is gone already is
// cleaned up by the key's next timer. Its timers are those the panes set
// (every window's fire time, the last window's cleanup time) plus each
// window's own cleanup time.
func (op *windowOperator[K, IN, ACC, OUT]) migratePanes() error {
	if !op.mayHoldPanes {
		return nil
	}
	size := op.asg.paneSize()
	var panes []TimeWindow
	op.state.Range(func(w TimeWindow, _ ACC) bool {
		if w.End-w.Start == size {
			panes = append(panes, w)
		}
		return true
	})
	if len(panes) == 0 {
		return nil
	}
	slices.SortFunc(panes, func(a, b TimeWindow) int { return cmpInt64(a.Start, b.Start) })
	wins := map[TimeWindow]ACC{}
	var order []TimeWindow
	for _, p := range panes {
		acc, _ := op.state.Get(p)
		op.state.Delete(p)
		if err := op.windowsOf(p.Start, func(w TimeWindow) error {
			cur, ok := wins[w]
			if !ok {
				wins[w] = acc
				order = append(order, w)
				return nil
			}
			m, err := op.fn.merge(cur, acc)
			wins[w] = m
			return err
		}); err != nil {
			return err
		}
	}
	// A window whose time passed already has its timers from the panes,
	// still to fire or fired (a timer registered again at or before the
	// current time would fire twice); one whose cleanup time passed goes
	// with the key's next timer, which the panes set.
	now := op.timers.currentProcessingTime()
	if op.asg.eventTime {
		now = op.timers.currentWatermark()
	}
	for _, w := range order {
		op.state.Put(w, wins[w])
		for _, ts := range []int64{op.fireTime(w), op.cleanupTime(w)} {
			if ts > now {
				op.registerTimer(ts)
			}
		}
	}
	return nil
}

// fireAligned emits w's result from its panes, if it has any.
func (op *windowOperator[K, IN, ACC, OUT]) fireAligned(key K, w TimeWindow, late bool) error {
	if op.asg.paneSize() == op.asg.size {
		// A tumbling window is its one pane.
		if acc, ok := op.state.Get(w); ok {
			return op.fire(key, w, acc, late)
		}
		return nil
	}
	var panes []TimeWindow
	op.state.Range(func(p TimeWindow, _ ACC) bool {
		if p.Start >= w.Start && p.End <= w.End {
			panes = append(panes, p)
		}
		return true
	})
	return op.firePanes(key, w, panes, late)
}

// firePanes emits w's result from its panes (any order), if it has any.
func (op *windowOperator[K, IN, ACC, OUT]) firePanes(key K, w TimeWindow, panes []TimeWindow, late bool) error {
	if len(panes) == 0 {
		return nil
	}
	slices.SortFunc(panes, func(a, b TimeWindow) int { return cmpInt64(a.Start, b.Start) })
	acc, _ := op.state.Get(panes[0])
	for _, p := range panes[1:] {
		b, _ := op.state.Get(p)
		var err error
		if acc, err = op.fn.merge(acc, b); err != nil {
			return err
		}
	}
	return op.fire(key, w, acc, late)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// fire emits acc's result as w's. Every result (and side output of the
// window function) carries w's last millisecond as its event timestamp:
// on-time and late firings alike, in event and in processing time, as
// Flink's WindowOperator.emitWindowContents stamps every result with
// window.maxTimestamp().
func (op *windowOperator[K, IN, ACC, OUT]) fire(key K, w TimeWindow, acc ACC, late bool) error {
	wm := int64(math.MinInt64)
	if op.asg.eventTime {
		wm = op.timers.currentWatermark()
	}
	op.wctx = WindowContext[K]{Key: key, Window: w, Watermark: wm, Late: late}
	if op.ctxHook != nil {
		op.ctxHook(&op.wctx)
	}
	var prev int64
	if op.stamp != nil {
		prev = op.stamp(w.MaxTimestamp())
	}
	op.col.w, op.col.err = w, nil
	err := op.fn.result(&op.wctx, acc, &op.col)
	if op.stamp != nil {
		op.stamp(prev)
	}
	if err != nil {
		return err
	}
	return op.col.err
}

// onTimer handles the key's timer at ts, in event time (eventTime) or
// processing time: fires the window ending at ts and clears the state whose
// cleanup time is ts. A timer of the other time domain is ignored.
func (op *windowOperator[K, IN, ACC, OUT]) onTimer(key K, ts int64, eventTime bool) error {
	if eventTime != op.asg.eventTime {
		return nil
	}
	if op.asg.kind == windowSession {
		return op.onSessionTimer(key, ts)
	}
	end := ts // processing time: the window ending at ts
	if op.asg.eventTime {
		end = addSat(ts, 1) // event time: the window whose last millisecond is ts
	}
	w := TimeWindow{Start: end - op.asg.size, End: end}
	if err := op.migratePanes(); err != nil {
		return err
	}
	// One pass over the key's windows finds w's panes (firing reads the
	// state, never changes it) and what is due for cleanup.
	fires := windowStart(w.Start, op.asg.offset, op.asg.slide) == w.Start
	op.tw, op.tts, op.tfires = w, ts, fires && !op.perWindow
	op.tpanes, op.tgone = op.tpanes[:0], op.tgone[:0]
	op.state.Range(op.timerScan)
	if fires {
		var err error
		if !op.perWindow {
			err = op.firePanes(key, w, op.tpanes, false)
		} else if acc, ok := op.state.Get(w); ok {
			err = op.fire(key, w, acc, false)
		}
		if err != nil {
			return err
		}
	}
	for _, p := range op.tgone {
		op.state.Delete(p)
	}
	return nil
}

// scanForTimer is onTimer's pass over the key's windows (op.timerScan):
// the panes of the window firing (op.tw, with op.tfires) into op.tpanes,
// and the windows or panes whose cleanup time is at or before the timer
// (op.tts) into op.tgone.
func (op *windowOperator[K, IN, ACC, OUT]) scanForTimer(p TimeWindow, _ ACC) bool {
	if op.tfires && p.Start >= op.tw.Start && p.End <= op.tw.End {
		op.tpanes = append(op.tpanes, p)
	}
	last := p // a window, or the pane of its last window
	if !op.perWindow {
		last = op.lastWindowOf(p.Start)
	}
	if op.cleanupTime(last) <= op.tts {
		op.tgone = append(op.tgone, p)
	}
	return true
}

// sessions returns the key's session windows, earliest first.
func (op *windowOperator[K, IN, ACC, OUT]) sessions() []TimeWindow {
	var ws []TimeWindow
	op.state.Range(func(w TimeWindow, _ ACC) bool {
		ws = append(ws, w)
		return true
	})
	slices.SortFunc(ws, func(a, b TimeWindow) int { return cmpInt64(a.Start, b.Start) })
	return ws
}

func (op *windowOperator[K, IN, ACC, OUT]) processSession(key K, ts int64, v IN) error {
	nw := TimeWindow{Start: ts, End: addSat(ts, op.asg.gap)}
	var merged []TimeWindow
	cover := nw
	for _, w := range op.sessions() {
		if w.intersects(nw) {
			merged = append(merged, w)
			cover.Start, cover.End = min(cover.Start, w.Start), max(cover.End, w.End)
		}
	}
	if op.isLate(cover) {
		// Only a record that merges with no window can be late: a window
		// still in state is not late, and merging only extends it.
		return op.lateRecord(v)
	}
	var acc ACC
	switch {
	case len(merged) == 0:
		acc = op.fn.create()
		op.registerFireTimer(cover)
		op.registerTimer(op.cleanupTime(cover))
	case len(merged) == 1 && merged[0] == cover:
		acc, _ = op.state.Get(cover) // the record falls inside a session
	default:
		var err error
		if acc, err = op.mergeSessions(cover, merged); err != nil {
			return err
		}
	}
	acc, err := op.fn.add(acc, v)
	if err != nil {
		return err
	}
	op.state.Put(cover, acc)
	if op.asg.eventTime && cover.MaxTimestamp() <= op.timers.currentWatermark() {
		return op.fire(key, cover, acc, true)
	}
	return nil
}

// mergeSessions merges the state of the sessions merged into cover, moves
// their timers to cover's and returns cover's accumulator (not stored yet).
func (op *windowOperator[K, IN, ACC, OUT]) mergeSessions(cover TimeWindow, merged []TimeWindow) (ACC, error) {
	acc, _ := op.state.Get(merged[0])
	for _, w := range merged[1:] {
		b, _ := op.state.Get(w)
		var err error
		if acc, err = op.fn.merge(acc, b); err != nil {
			return acc, err
		}
	}
	for _, w := range merged {
		op.state.Delete(w)
	}
	// Timers are per key and time: keep those another session (or the
	// cover) still needs.
	need := map[int64]bool{op.fireTime(cover): true, op.cleanupTime(cover): true}
	for _, w := range op.sessions() {
		need[op.fireTime(w)], need[op.cleanupTime(w)] = true, true
	}
	for _, w := range merged {
		for _, ts := range []int64{op.fireTime(w), op.cleanupTime(w)} {
			if !need[ts] {
				op.deleteTimer(ts)
				need[ts] = true // deleted once
			}
		}
	}
	op.registerFireTimer(cover)
	op.registerTimer(op.cleanupTime(cover))
	return acc, nil
}

func (op *windowOperator[K, IN, ACC, OUT]) onSessionTimer(key K, ts int64) error {
	for _, w := range op.sessions() {
		if op.fireTime(w) == ts {
			acc, _ := op.state.Get(w)
			if err := op.fire(key, w, acc, false); err != nil {
				return err
			}
		}
		if op.cleanupTime(w) <= ts {
			op.state.Delete(w)
		}
	}
	return nil
}
