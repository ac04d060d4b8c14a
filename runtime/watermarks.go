package runtime

import (
	"fmt"
	"time"
)

// WatermarkOutput is where a WatermarkGenerator emits (Flink's
// WatermarkOutput). A watermark at or below the last one emitted is
// ignored: a source's watermark never moves back.
type WatermarkOutput interface {
	// EmitWatermark announces that no record with a timestamp at or below
	// ts is expected any more. It marks the source active.
	EmitWatermark(ts int64)
	// MarkIdle announces that the source has nothing to read: downstream
	// operators stop waiting for its watermark until it is active again.
	MarkIdle()
	// MarkActive ends MarkIdle.
	MarkActive()
}

// WatermarkGenerator generates a source subtask's watermarks from the
// timestamps of its records (Flink's WatermarkGenerator). Both methods run
// on the source's task goroutine.
type WatermarkGenerator[T any] interface {
	// OnEvent sees every record with its event timestamp.
	OnEvent(v T, ts int64, out WatermarkOutput)
	// OnPeriodicEmit is called every emit interval of the strategy.
	OnPeriodicEmit(out WatermarkOutput)
}

// TimestampAssigner returns the event timestamp (epoch ms) of v; ts is the
// timestamp the source gave it (a Kafka record's timestamp), NoTimestamp if
// none.
type TimestampAssigner[T any] func(v T, ts int64) int64

// DefaultWatermarkInterval is how often a source emits its periodic
// watermark unless WithWatermarkInterval says otherwise (Flink's
// pipeline.auto-watermark-interval).
const DefaultWatermarkInterval = 200 * time.Millisecond

// WatermarkStrategy says how a source assigns event timestamps and
// generates watermarks: build it with ForBoundedOutOfOrderness,
// ForMonotonousTimestamps or ForGenerator, and give it to FromSource with
// the Watermarks option.
type WatermarkStrategy[T any] struct {
	newGen   func() WatermarkGenerator[T]
	assigner TimestampAssigner[T]
	idle     time.Duration
	interval time.Duration
	drift    time.Duration
	err      error
}

// WatermarkOpt configures a WatermarkStrategy.
type WatermarkOpt interface{ apply(*watermarkCfg) }

type watermarkCfg struct {
	assigner any // a TimestampAssigner[T]
	idle     time.Duration
	interval time.Duration
	drift    time.Duration
	err      error
}

type watermarkOpt func(*watermarkCfg)

func (o watermarkOpt) apply(c *watermarkCfg) { o(c) }

// WithTimestampAssigner sets how each record's event timestamp is found
// (default: the timestamp the source emitted it with).
func WithTimestampAssigner[T any](fn TimestampAssigner[T]) WatermarkOpt {
	return watermarkOpt(func(c *watermarkCfg) { c.assigner = fn })
}

// WithIdleness marks a source subtask idle once it has had nothing to read
// for d (Flink's withIdleness): downstream operators stop waiting for its
// watermark. Only time the source spent finding nothing counts: time
// blocked sending downstream (back-pressure) never makes it idle. 0 (the
// default) never marks it idle. For a source that tags its records with
// their splits (SplitCollector) idleness is per split: a split idle for d
// no longer holds the subtask's watermark, and the subtask is idle once
// every split is.
func WithIdleness(d time.Duration) WatermarkOpt {
	return watermarkOpt(func(c *watermarkCfg) {
		if d < 0 {
			c.err = fmt.Errorf("%w: idleness %v < 0", ErrInvalidOption, d)
		}
		c.idle = d
	})
}

// WithWatermarkInterval sets how often the generator's OnPeriodicEmit runs
// (default DefaultWatermarkInterval).
func WithWatermarkInterval(d time.Duration) WatermarkOpt {
	return watermarkOpt(func(c *watermarkCfg) {
		if d <= 0 {
			c.err = fmt.Errorf("%w: watermark interval %v <= 0", ErrInvalidOption, d)
		}
		c.interval = d
	})
}

// WithWatermarkAlignment bounds how far ahead of the subtask's watermark a
// source reads (Flink's withWatermarkAlignment, FLIP-182): a source whose
// subtasks share their splits (SplitFrontier: the share-group source) stops
// fetching a split whose own watermark runs more than maxDrift ahead, until
// it is back within half of it, so that neither the state of later windows
// nor the latency grows without bound while one split lags. The splits
// that hold the watermark back are never paused. 0 (the default) reads
// every split as fast as it comes; sources that own their splits ignore it.
func WithWatermarkAlignment(maxDrift time.Duration) WatermarkOpt {
	return watermarkOpt(func(c *watermarkCfg) {
		if maxDrift < 0 {
			c.err = fmt.Errorf("%w: watermark alignment drift %v < 0", ErrInvalidOption, maxDrift)
		}
		c.drift = maxDrift
	})
}

// ForGenerator is a strategy with a custom generator; newGen is called once
// per source subtask and attempt.
func ForGenerator[T any](newGen func() WatermarkGenerator[T], opts ...WatermarkOpt) WatermarkStrategy[T] {
	c := watermarkCfg{interval: DefaultWatermarkInterval}
	for _, o := range opts {
		o.apply(&c)
	}
	ws := WatermarkStrategy[T]{newGen: newGen, idle: c.idle, interval: c.interval, drift: c.drift, err: c.err}
	if c.assigner != nil {
		a, ok := c.assigner.(TimestampAssigner[T])
		if !ok {
			ws.err = fmt.Errorf("%w: timestamp assigner %T is not a TimestampAssigner[%T]", ErrInvalidOption, c.assigner, *new(T))
		}
		ws.assigner = a
	}
	return ws
}

// ForBoundedOutOfOrderness is Flink's bounded out-of-orderness strategy: a
// record may arrive at most d after a record with a later timestamp; the
// watermark is the largest timestamp seen minus d minus 1 ms, emitted every
// interval.
func ForBoundedOutOfOrderness[T any](d time.Duration, opts ...WatermarkOpt) WatermarkStrategy[T] {
	ws := ForGenerator(func() WatermarkGenerator[T] { return newBoundedOutOfOrderness[T](d) }, opts...)
	if d < 0 && ws.err == nil {
		ws.err = fmt.Errorf("%w: out-of-orderness %v < 0", ErrInvalidOption, d)
	}
	return ws
}

// ForMonotonousTimestamps is the strategy for timestamps that never go
// down: bounded out-of-orderness 0.
func ForMonotonousTimestamps[T any](opts ...WatermarkOpt) WatermarkStrategy[T] {
	return ForBoundedOutOfOrderness[T](0, opts...)
}

// boundedOutOfOrderness is Flink's BoundedOutOfOrdernessWatermarks.
type boundedOutOfOrderness[T any] struct {
	bound int64
	maxTS int64
}

func newBoundedOutOfOrderness[T any](d time.Duration) *boundedOutOfOrderness[T] {
	b := d.Milliseconds()
	return &boundedOutOfOrderness[T]{bound: b, maxTS: MinWatermark + b + 1}
}

func (g *boundedOutOfOrderness[T]) OnEvent(_ T, ts int64, _ WatermarkOutput) {
	if ts != NoTimestamp {
		g.maxTS = max(g.maxTS, ts)
	}
}

func (g *boundedOutOfOrderness[T]) OnPeriodicEmit(out WatermarkOutput) {
	out.EmitWatermark(g.maxTS - g.bound - 1)
}

// Watermarks applies a watermark strategy to a source (an option of
// FromSource only; the strategy's type must be the source's).
func Watermarks[T any](ws WatermarkStrategy[T]) OpOpt {
	return opOpt(func(n *node) { n.watermarks = ws })
}

// newSourceWatermarks makes a source subtask's watermark machinery; ws is
// nil for a source without a strategy.
func newSourceWatermarks[T any](ws *WatermarkStrategy[T]) *sourceWatermarks[T] {
	w := &sourceWatermarks[T]{lastWM: MinWatermark, emit: func(envelope) error { return nil },
		readPressure: func() time.Duration { return 0 }}
	if ws != nil {
		w.strategy, w.assigner, w.interval, w.idleness = true, ws.assigner, ws.interval, ws.idle
		if ws.newGen != nil {
			w.gen = ws.newGen()
		}
		w.splits = newSplitWatermarks(ws.newGen, ws.assigner, ws.idle, ws.drift)
		w.newGen = ws.newGen
	}
	return w
}

// sourceWatermarks is a source subtask's watermark machinery: the
// strategy's assigner and generator, its periodic emission, its idleness
// clock, and what it sent (it implements WatermarkOutput for the
// generator). One task goroutine uses it.
type sourceWatermarks[T any] struct {
	// strategy: the source has a WatermarkStrategy (without one, it only
	// emits the final watermark at its end).
	strategy bool
	assigner TimestampAssigner[T]
	gen      WatermarkGenerator[T]
	interval time.Duration
	idleness time.Duration
	// emit sends a watermark or a status on the task's outputs (through
	// the chain); its first error is kept in err.
	emit func(envelope) error
	err  error
	// lastWM is the last watermark sent; idle the last status sent.
	lastWM int64
	idle   bool
	// restored is the watermark to send before the first Poll after a
	// restore (the least the source's subtasks had sent at the restored
	// checkpoint's barrier); nil: none, or sent.
	restored *int64
	// nextEmit is when OnPeriodicEmit runs next.
	nextEmit time.Time
	// lastRecord is when the last Poll that emitted records returned, and
	// backPressured the task's back-pressure counter then: the source has
	// had nothing to read for the time since, minus the time it spent
	// blocked sending downstream since (back-pressure is not idleness).
	lastRecord    time.Time
	backPressured time.Duration
	readPressure  func() time.Duration // the task's back-pressure counter
	// frontier is the source when it is a SplitFrontier, and splits the
	// rule over its splits' frontiers. gated: the frontier rules (or is
	// not read yet), so the subtask's own generator and idleness clock
	// emit nothing; only followFrontier sends watermarks.
	frontier SplitFrontier[T]
	splits   *splitWatermarks[T]
	gated    bool
	// own are the generators of the splits of a source that tags its
	// records with them (SplitCollector); nil until it does: then the
	// subtask's watermark is the minimum over its splits that are not idle.
	own    map[string]*ownSplit[T]
	newGen func() WatermarkGenerator[T]
}

// ownSplit is one split's generator (SplitCollector) and its idleness clock.
type ownSplit[T any] struct {
	gen     WatermarkGenerator[T]
	wm      int64
	emitted bool          // records (or records pending: SplitPending) since the last afterPoll
	last    time.Time     // when it last emitted (or was declared)
	bp      time.Duration // the task's back-pressure counter then
}

func (s *ownSplit[T]) EmitWatermark(ts int64) { s.wm = max(s.wm, ts) }
func (s *ownSplit[T]) MarkIdle()              {}
func (s *ownSplit[T]) MarkActive()            {}

// split returns the generator of split, made (idle clock started at now)
// if new.
func (w *sourceWatermarks[T]) split(name string, now time.Time) *ownSplit[T] {
	if w.own == nil {
		w.own = map[string]*ownSplit[T]{}
	}
	s := w.own[name]
	if s == nil {
		s = &ownSplit[T]{wm: MinWatermark, last: now, bp: w.readPressure()}
		if w.newGen != nil {
			s.gen = w.newGen()
		}
		w.own[name] = s
	}
	return s
}

// observeSplit shows split's generator a record that went out.
func (w *sourceWatermarks[T]) observeSplit(split string, v T, ts int64) {
	s := w.split(split, time.Now())
	s.emitted = true
	if s.gen != nil {
		s.gen.OnEvent(v, ts, s)
	}
}

// pendingSplit restarts split's idleness clock: it has records the source
// holds and has not emitted yet.
func (w *sourceWatermarks[T]) pendingSplit(split string) {
	w.split(split, time.Now()).emitted = true
}

// setSplits declares the splits the source reads now.
func (w *sourceWatermarks[T]) setSplits(splits []string) {
	now := time.Now()
	if w.own == nil {
		w.own = map[string]*ownSplit[T]{}
	}
	keep := make(map[string]bool, len(splits))
	for _, name := range splits {
		keep[name] = true
		w.split(name, now)
	}
	for name := range w.own {
		if !keep[name] {
			delete(w.own, name)
		}
	}
}

// followSplits is afterPoll for a source that tags its records with their
// splits: every interval each split's generator emits, and the subtask
// emits the minimum over the splits that are not idle. When every split
// is idle the subtask emits the largest watermark any split reached
// (nothing waits for an idle split, as the valve does for idle channels)
// and turns idle; with no split at all it turns idle.
func (w *sourceWatermarks[T]) followSplits(now time.Time) error {
	bp := w.readPressure()
	due := !now.Before(w.nextEmit)
	if due {
		w.nextEmit = now.Add(w.interval)
	}
	lo, hi, active := MaxWatermark, MinWatermark, false
	for _, s := range w.own {
		if s.emitted {
			s.emitted, s.last, s.bp = false, now, bp
		}
		if due && s.gen != nil {
			s.gen.OnPeriodicEmit(s)
		}
		hi = max(hi, s.wm)
		if w.idleness > 0 && now.Sub(s.last)-(bp-s.bp) >= w.idleness {
			continue
		}
		lo, active = min(lo, s.wm), true
	}
	if !active {
		w.emitWatermark(hi)
		w.MarkIdle()
		return w.take()
	}
	if due {
		w.emitWatermark(lo)
	}
	return w.take()
}

// useFrontier makes the source's frontier rule its watermark, if it gives
// one (SplitFrontier, a version not below 0): until its first reading,
// nothing goes out.
func (w *sourceWatermarks[T]) useFrontier(src any) {
	if f, ok := src.(SplitFrontier[T]); ok && w.strategy {
		if v, _ := f.Frontier(); v >= 0 {
			w.frontier, w.gated = f, true
		}
	}
}

func (w *sourceWatermarks[T]) EmitWatermark(ts int64) {
	if w.gated && ts != MaxWatermark {
		return
	}
	w.emitWatermark(ts)
}

// emitWatermark sends ts unless a watermark at or past it went out.
func (w *sourceWatermarks[T]) emitWatermark(ts int64) {
	if ts <= w.lastWM || w.err != nil {
		return
	}
	w.MarkActive()
	w.lastWM = ts
	w.err = w.emit(envelope{mark: markWatermark, wm: ts})
}

func (w *sourceWatermarks[T]) MarkIdle() {
	if w.idle || w.err != nil || w.gated {
		return
	}
	w.idle = true
	w.err = w.emit(envelope{mark: markIdle})
}

func (w *sourceWatermarks[T]) MarkActive() {
	if !w.idle || w.err != nil {
		return
	}
	w.idle = false
	w.err = w.emit(envelope{mark: markActive})
}

// assign returns v's event timestamp; an idle source turns active before
// its record goes out.
func (w *sourceWatermarks[T]) assign(v T, ts int64) int64 {
	if w.assigner != nil {
		ts = w.assigner(v, ts)
	}
	w.MarkActive()
	return ts
}

// observe shows the generator a record that went out (as Flink, after the
// record: a watermark it emits follows the record).
func (w *sourceWatermarks[T]) observe(v T, ts int64) {
	if w.gen != nil {
		w.gen.OnEvent(v, ts, w)
	}
}

// afterPoll runs after each Poll, at now, which emitted emitted records. A
// source that gives a frontier (SplitFrontier) follows it. Otherwise it
// marks the source idle once it has had nothing to read for the idleness
// timeout (the time since its last records, less the time it was blocked
// downstream since), and emits the periodic watermark when due.
func (w *sourceWatermarks[T]) afterPoll(now time.Time, emitted int64) error {
	if w.frontier != nil && w.followFrontier(now) {
		return w.take()
	}
	if w.own != nil {
		return w.followSplits(now)
	}
	if w.idleness > 0 {
		bp := w.readPressure()
		if emitted > 0 || w.lastRecord.IsZero() {
			w.lastRecord, w.backPressured = now, bp
		} else if now.Sub(w.lastRecord)-(bp-w.backPressured) >= w.idleness {
			w.MarkIdle()
		}
	}
	if w.gen != nil && !now.Before(w.nextEmit) {
		w.nextEmit = now.Add(w.interval)
		w.gen.OnPeriodicEmit(w)
	}
	return w.take()
}

// followFrontier applies the frontier rule at now (see SplitFrontier): it
// takes the source's latest reading, emits the splits' watermark every
// interval, and tells the source which splits to pause. It returns false
// when the source gives no frontier: its own records rule then.
func (w *sourceWatermarks[T]) followFrontier(now time.Time) bool {
	v, fs := w.frontier.Frontier()
	if v < 0 {
		w.gated = false
		return false
	}
	w.gated = true
	if v == 0 {
		return true
	}
	w.splits.read(now, v, fs)
	wm, _ := w.splits.watermark(now)
	if !now.Before(w.nextEmit) {
		w.nextEmit = now.Add(w.interval)
		w.emitWatermark(wm)
	}
	if ahead, changed := w.splits.alignment(now, wm); changed {
		w.frontier.AlignSplits(ahead)
	}
	return true
}

// snapshotWatermark is what a checkpoint keeps of the watermark: the last
// one sent (or restored and not sent yet), none if there is none or it was
// the final one (a source that ended or drained must not make everything
// late after a restore).
func (w *sourceWatermarks[T]) snapshotWatermark() *int64 {
	wm := w.lastWM
	if w.restored != nil {
		wm = max(wm, *w.restored)
	}
	if !w.strategy || wm == MinWatermark || wm == MaxWatermark {
		return nil
	}
	return &wm
}

// restore keeps wm (nil: none) to send before the first Poll: a restored
// source resumes at the watermark it had reached, as its keyed state and
// timers do, instead of starting over from the minimum
// (docs/internals/event-time.md, "Watermarks across a restore").
func (w *sourceWatermarks[T]) restore(wm *int64) {
	if w.strategy && wm != nil {
		v := *wm
		w.restored = &v
	}
}

// resume sends the restored watermark, once, before the first record.
func (w *sourceWatermarks[T]) resume() error {
	if w.restored == nil {
		return nil
	}
	wm := *w.restored
	w.restored = nil
	w.emitWatermark(wm)
	return w.take()
}

// end emits the final watermark: everything downstream fires.
func (w *sourceWatermarks[T]) end() error {
	w.EmitWatermark(MaxWatermark)
	return w.take()
}

func (w *sourceWatermarks[T]) take() error {
	err := w.err
	w.err = nil
	return err
}
