package runtime

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// Interval is the range of an interval join: a right record joins a left
// one when right.ts is in [left.ts+lower, left.ts+upper], both bounds
// inclusive unless made exclusive. Make it with Between.
type Interval struct {
	lower, upper         time.Duration
	lowerExcl, upperExcl bool
}

// Between is the interval [lower, upper] relative to the left record's
// timestamp (Flink's between): lower may be negative, and must not exceed
// upper. Both are whole milliseconds.
func Between(lower, upper time.Duration) Interval { return Interval{lower: lower, upper: upper} }

// LowerBoundExclusive returns iv without its lower bound: right.ts must be
// above left.ts+lower.
func (iv Interval) LowerBoundExclusive() Interval { iv.lowerExcl = true; return iv }

// UpperBoundExclusive returns iv without its upper bound: right.ts must be
// below left.ts+upper.
func (iv Interval) UpperBoundExclusive() Interval { iv.upperExcl = true; return iv }

// String formats iv as Flink writes it, e.g. [-2s, 1s).
func (iv Interval) String() string {
	open, closing := "[", "]"
	if iv.lowerExcl {
		open = "("
	}
	if iv.upperExcl {
		closing = ")"
	}
	return fmt.Sprintf("%s%v, %v%s", open, iv.lower, iv.upper, closing)
}

// millis is iv as inclusive bounds in milliseconds.
func (iv Interval) millis() (lo, hi int64, err error) {
	if iv.lower%time.Millisecond != 0 || iv.upper%time.Millisecond != 0 {
		return 0, 0, fmt.Errorf("interval %v: bounds must be whole milliseconds", iv)
	}
	lo, hi = iv.lower.Milliseconds(), iv.upper.Milliseconds()
	if iv.lowerExcl {
		lo++
	}
	if iv.upperExcl {
		hi--
	}
	if lo > hi {
		return 0, 0, fmt.Errorf("interval %v is empty", iv)
	}
	return lo, hi, nil
}

// JoinContext describes a joined pair of an interval join.
type JoinContext[K comparable] struct {
	Key K
	// LeftTimestamp and RightTimestamp are the event timestamps of the
	// pair's records.
	LeftTimestamp, RightTimestamp int64
}

// Timestamp is the pair's timestamp, the larger of its records': what
// records emitted for the pair carry (as in Flink).
func (c *JoinContext[K]) Timestamp() int64 { return max(c.LeftTimestamp, c.RightTimestamp) }

// ProcessJoinFunc is called once for each joined pair of an interval join
// (Flink's ProcessJoinFunction). ctx is valid only during the call.
type ProcessJoinFunc[K comparable, A, B, U any] func(ctx *JoinContext[K], left A, right B, out Collector[U]) error

// IntervalJoinLateLeft is the side output of an interval join's late left
// records (read it with SideOutput on the join's result); see IntervalJoin.
func IntervalJoinLateLeft[A any]() OutputTag[A] { return NewOutputTag[A]("interval-join.late-left") }

// IntervalJoinLateRight is the side output of an interval join's late
// right records; see IntervalJoin.
func IntervalJoinLateRight[B any]() OutputTag[B] { return NewOutputTag[B]("interval-join.late-right") }

// IntervalJoin joins two keyed streams in event time (Flink's interval
// join): fn is called once for every pair of a left record l and a right
// record r with the same key and r.ts within iv of l.ts (l.ts+lower <= r.ts
// <= l.ts+upper, see Between). Records must carry event timestamps (sources
// with a WatermarkStrategy); a record without one fails the job.
//
// Each side's records are kept in keyed state, by key and timestamp, until
// the watermark shows no record of the other side can join them any more
// (an event-time timer one millisecond after l.ts+upper for a left record,
// r.ts-lower for a right one, or after the record's own timestamp if that
// is later), and are
// checkpointed by key group and restored at any parallelism. A pair is
// emitted when the second of its records arrives, so each pair exactly
// once.
//
// A record below the operator's watermark when it arrives is late (as in
// Flink; one exactly at the watermark still joins): it joins nothing (what
// it could join may already be gone), is counted in the operator's
// numLateRecords_total metric (which counts every record at or below the
// watermark) and goes to the side output IntervalJoinLateLeft or
// IntervalJoinLateRight (if the job reads it), so none is lost silently. Both sides' record types must be encodable by
// DefaultCodec (the state codec).
func IntervalJoin[K comparable, A, B, U any](left *KeyedStream[K, A], right *KeyedStream[K, B], name string, iv Interval,
	fn ProcessJoinFunc[K, A, B, U], opts ...OpOpt) *Stream[U] {
	j := left.s.job
	lo, hi, err := iv.millis()
	if err != nil {
		j.fail(fmt.Errorf("%w: interval join %q: %w", ErrInvalidJob, name, err))
	}
	checkJoinCodecs[A, B](j, "interval join", name)
	return coProcess(Connect(left, right), name, func() KeyedProcessor[K, tagged[A, B], U] {
		return coProcessor[K, A, B, U]{fn: &intervalJoiner[K, A, B, U]{name: name, lo: lo, hi: hi, fn: fn,
			lateL: IntervalJoinLateLeft[A](), lateR: IntervalJoinLateRight[B]()}}
	}, opts)
}

// intervalJoiner is the KeyedCoProcessor of an interval join.
type intervalJoiner[K comparable, A, B, U any] struct {
	name   string
	lo, hi int64 // inclusive
	fn     ProcessJoinFunc[K, A, B, U]
	left   *MapState[int64, []A] // by timestamp
	right  *MapState[int64, []B]
	lateL  OutputTag[A]
	lateR  OutputTag[B]
	jc     JoinContext[K]
}

func (p *intervalJoiner[K, A, B, U]) Open(_ context.Context, st *StateRegistry[K]) error {
	var err error
	if p.left, err = NewMapState[int64, []A](st, "interval-join.left", Int64Codec(), listCodec[A]{DefaultCodec[A]()}); err != nil {
		return err
	}
	p.right, err = NewMapState[int64, []B](st, "interval-join.right", Int64Codec(), listCodec[B]{DefaultCodec[B]()})
	return err
}

// timestamp is the record's event timestamp, and whether it is late: below
// the watermark. A record exactly at the watermark joins, as in Flink
// (IntervalJoinOperator.isLate: timestamp < currentWatermark); every
// record it can join is still in state, since a record is cleaned up only
// once the watermark passed its last possible partner's timestamp (see
// OnTimer).
func (p *intervalJoiner[K, A, B, U]) timestamp(ctx *KeyedContext[K]) (ts int64, late bool, err error) {
	ts = ctx.Timestamp()
	if ts == NoTimestamp {
		return 0, false, Unrecoverable(fmt.Errorf("interval join %q: a record without event timestamp: give the sources a WatermarkStrategy (Watermarks)", p.name))
	}
	return ts, ts < ctx.CurrentWatermark(), nil
}

func (p *intervalJoiner[K, A, B, U]) ProcessElement1(ctx *KeyedContext[K], v A, out Collector[U]) error {
	lt, late, err := p.timestamp(ctx)
	if err != nil || late {
		if late {
			Output(ctx, p.lateL, v)
		}
		return err
	}
	vs, _ := p.left.Get(lt)
	p.left.Put(lt, append(slices.Clip(vs), v))
	from, to := addSat(lt, p.lo), addSat(lt, p.hi)
	p.right.Range(func(rt int64, bs []B) bool {
		if rt < from || rt > to {
			return true
		}
		for _, b := range bs {
			if err = p.emit(ctx, v, b, lt, rt, out); err != nil {
				return false
			}
		}
		return true
	})
	ctx.TimerService().RegisterEventTimeTimer(addSat(p.lastLeftPartner(lt), 1))
	return err
}

func (p *intervalJoiner[K, A, B, U]) ProcessElement2(ctx *KeyedContext[K], v B, out Collector[U]) error {
	rt, late, err := p.timestamp(ctx)
	if err != nil || late {
		if late {
			Output(ctx, p.lateR, v)
		}
		return err
	}
	vs, _ := p.right.Get(rt)
	p.right.Put(rt, append(slices.Clip(vs), v))
	from, to := addSat(rt, -p.hi), addSat(rt, -p.lo)
	p.left.Range(func(lt int64, as []A) bool {
		if lt < from || lt > to {
			return true
		}
		for _, a := range as {
			if err = p.emit(ctx, a, v, lt, rt, out); err != nil {
				return false
			}
		}
		return true
	})
	ctx.TimerService().RegisterEventTimeTimer(addSat(p.lastRightPartner(rt), 1))
	return err
}

// emit calls fn for a pair, its output at the pair's timestamp.
func (p *intervalJoiner[K, A, B, U]) emit(ctx *KeyedContext[K], a A, b B, lt, rt int64, out Collector[U]) error {
	p.jc = JoinContext[K]{Key: ctx.Key(), LeftTimestamp: lt, RightTimestamp: rt}
	saved := ctx.now.ts
	ctx.now.ts = p.jc.Timestamp()
	err := p.fn(&p.jc, a, b, out)
	ctx.now.ts = saved
	return err
}

// lastLeftPartner is the timestamp of the last right record that can join
// a left record at lt (lt itself if that is later: a record is kept at
// least until the watermark passes it), lastRightPartner the same for a
// right record. Both are one-to-one, so a timestamp names the records of
// each side it is the last partner time of.
func (p *intervalJoiner[K, A, B, U]) lastLeftPartner(lt int64) int64 {
	return max(lt, addSat(lt, p.hi))
}
func (p *intervalJoiner[K, A, B, U]) lastRightPartner(rt int64) int64 {
	return max(rt, addSat(rt, -p.lo))
}

// leftAt and rightAt invert lastLeftPartner and lastRightPartner.
func (p *intervalJoiner[K, A, B, U]) leftAt(last int64) int64 {
	if p.hi > 0 {
		return last - p.hi
	}
	return last
}

func (p *intervalJoiner[K, A, B, U]) rightAt(last int64) int64 {
	if p.lo < 0 {
		return last + p.lo
	}
	return last
}

// OnTimer removes the records whose last possible partner the watermark
// passed. A record's cleanup timer is one millisecond after its last
// partner's timestamp: a record exactly at the watermark is not late (as
// in Flink) and must still find every partner. (Flink's timer at the last
// partner's timestamp itself removes the partners of such a record before
// it arrives: it joins only some of them, and the missing pairs are lost
// silently.) The timer at T removes the records whose last partner is at
// T-1; those whose last partner is at T (cleanup timers of checkpoints
// taken before the timer moved one millisecond later) go too if the
// watermark is past T, or get their timer at T+1.
func (p *intervalJoiner[K, A, B, U]) OnTimer(ctx *KeyedContext[K], ts int64, _ Collector[U]) error {
	if ts != math.MinInt64 {
		p.left.Delete(p.leftAt(ts - 1))
		p.right.Delete(p.rightAt(ts - 1))
	}
	if ts == math.MaxInt64 || ctx.CurrentWatermark() > ts {
		p.left.Delete(p.leftAt(ts))
		p.right.Delete(p.rightAt(ts))
		return nil
	}
	_, l := p.left.Get(p.leftAt(ts))
	_, r := p.right.Get(p.rightAt(ts))
	if l || r {
		ctx.TimerService().RegisterEventTimeTimer(ts + 1)
	}
	return nil
}

// CoGroupFunc sees, when a window of a window co-group fires, the key and
// window and the records of each side in it (either may be empty, not
// both). The slices must not be retained after the call.
type CoGroupFunc[K comparable, A, B, U any] func(ctx *WindowContext[K], left []A, right []B, out Collector[U]) error

// WindowJoinFunc is called for every pair of a left and a right record in
// the same window of a window join.
type WindowJoinFunc[K comparable, A, B, U any] func(ctx *WindowContext[K], left A, right B, out Collector[U]) error

// CoGroupWindow cuts both keyed streams into the windows of asg, per key
// over the records of both sides (session windows merge over both), and
// calls fn with each side's records when a window fires (Flink's coGroup
// window). It is the window operator of ProcessWindow over the tagged
// union of the two inputs (as Flink implements it): its state, timers,
// firing and restore are the window operator's. Records must carry event
// timestamps for event-time windows; late records (see Window) join no
// window and are counted in numLateRecords_total. Both record types must
// be encodable by DefaultCodec (the state codec).
func CoGroupWindow[K comparable, A, B, U any](left *KeyedStream[K, A], right *KeyedStream[K, B], name string, asg WindowAssigner,
	fn CoGroupFunc[K, A, B, U], opts ...OpOpt) *Stream[U] {
	j := left.s.job
	if err := asg.validate(); err != nil {
		j.fail(err)
	}
	ca, cb := DefaultCodec[A](), DefaultCodec[B]()
	checkJoinCodecs[A, B](j, "window join", name)
	pw := ProcessWindowFunc[K, tagged[A, B], U](func(ctx *WindowContext[K], els []tagged[A, B], out Collector[U]) error {
		var as []A
		var bs []B
		for _, e := range els {
			if e.second {
				bs = append(bs, e.b)
			} else {
				as = append(as, e.a)
			}
		}
		return fn(ctx, as, bs, out)
	})
	// pw only reads the window's records (it copies them into as and bs):
	// no copy for it.
	wf := processWindowFunc[K](ProcessWindowFunction[K, tagged[A, B], U](pw), Codec[tagged[A, B]](taggedCodec[A, B]{ca, cb}), false)
	return coProcess(Connect(left, right), name, func() KeyedProcessor[K, tagged[A, B], U] {
		return &windowProcessor[K, tagged[A, B], []tagged[A, B], U]{name: name, asg: asg, fn: wf}
	}, opts)
}

// WindowJoin joins two keyed streams by window (Flink's window join): fn
// is called for every pair of a left and a right record with the same key
// in the same window of asg, when the window fires; a window with records
// of one side only calls nothing. It is CoGroupWindow with a nested loop;
// see there for state, lateness and codecs.
func WindowJoin[K comparable, A, B, U any](left *KeyedStream[K, A], right *KeyedStream[K, B], name string, asg WindowAssigner,
	fn WindowJoinFunc[K, A, B, U], opts ...OpOpt) *Stream[U] {
	return CoGroupWindow(left, right, name, asg, func(ctx *WindowContext[K], as []A, bs []B, out Collector[U]) error {
		for _, a := range as {
			for _, b := range bs {
				if err := fn(ctx, a, b, out); err != nil {
					return err
				}
			}
		}
		return nil
	}, opts...)
}

// checkJoinCodecs fails the job if DefaultCodec cannot encode A or B, the
// record types a join keeps in state.
func checkJoinCodecs[A, B any](j *Job, what, name string) {
	if err := CheckDefaultCodec[A](); err != nil {
		j.fail(fmt.Errorf("%w: %s %q: left state codec: %w", ErrInvalidJob, what, name, err))
	}
	if err := CheckDefaultCodec[B](); err != nil {
		j.fail(fmt.Errorf("%w: %s %q: right state codec: %w", ErrInvalidJob, what, name, err))
	}
}

// taggedCodec encodes a record of a two-input operator: its side, then the
// record with the side's codec.
type taggedCodec[A, B any] struct {
	a Codec[A]
	b Codec[B]
}

func (c taggedCodec[A, B]) Append(dst []byte, v tagged[A, B]) []byte {
	if v.second {
		return c.b.Append(append(dst, 2), v.b)
	}
	return c.a.Append(append(dst, 1), v.a)
}

func (c taggedCodec[A, B]) Decode(b []byte) (tagged[A, B], error) {
	var v tagged[A, B]
	if len(b) == 0 {
		return v, fmt.Errorf("%w: two-input record without its side", ErrDecode)
	}
	var err error
	switch b[0] {
	case 1:
		v.a, err = c.a.Decode(b[1:])
	case 2:
		v.second = true
		v.b, err = c.b.Decode(b[1:])
	default:
		err = fmt.Errorf("%w: two-input record of side %d", ErrDecode, b[0])
	}
	return v, err
}
