package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// bid is the right-hand record of the join tests: another type than the
// left's click, so each input edge carries (and encodes) its own type.
type bid struct {
	User string
	At   int64
	N    int
}

// joinInputs are n clicks and n bids over five keys, each side's
// timestamps rising by 0-4 ms a record and out of order by up to bound ms;
// the two sides cover the same span of event time.
func joinInputs(seed uint64, n int, bound int64) ([]click, []bid) {
	keys := []string{"ann", "bob", "cyd", "dee", "eve"}
	var cs []click
	for i, r := range outOfOrderInput(seed, n, keys, bound) {
		cs = append(cs, click{Key: r.key, TS: r.ts, ID: i})
	}
	var bs []bid
	for i, r := range outOfOrderInput(seed+100, n, keys, bound) {
		bs = append(bs, bid{User: r.key, At: r.ts, N: i})
	}
	return cs, bs
}

// joinSources adds the two sources of a join test: bounded
// out-of-orderness watermarks of bound ms (no record of the inputs is ever
// late at its own source subtask), emitted every millisecond so that the
// watermark advances (and state is cleaned) while the job runs. The left
// source emits leftPoll records a Poll, the right one rightPoll: the two
// inputs run at different speeds.
func joinSources(j *Job, cs []click, bs []bid, bound int64, srcPar, leftPoll, rightPoll int,
	wrap func(func() Source[click]) func() Source[click]) (*KeyedStream[string, click], *KeyedStream[string, bid]) {
	lsrc := SliceSource(cs, leftPoll)
	if wrap != nil {
		lsrc = wrap(lsrc)
	}
	left := FromSource(j, "clicks", lsrc, Parallelism(srcPar), Watermarks(ForBoundedOutOfOrderness[click](time.Duration(bound)*time.Millisecond,
		WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }), WithWatermarkInterval(time.Millisecond))))
	right := FromSource(j, "bids", SliceSource(bs, rightPoll), Parallelism(srcPar), Watermarks(ForBoundedOutOfOrderness[bid](time.Duration(bound)*time.Millisecond,
		WithTimestampAssigner(func(b bid, _ int64) int64 { return b.At }), WithWatermarkInterval(time.Millisecond))))
	return KeyBy(left, func(c click) string { return c.Key }, nil), KeyBy(right, func(b bid) string { return b.User }, nil)
}

// pairLine is how the join tests print a joined pair.
func pairLine(key string, c click, b bid, ts int64) string {
	return fmt.Sprintf("%s L%d@%d R%d@%d ts=%d", key, c.ID, c.TS, b.N, b.At, ts)
}

// referenceIntervalJoin is every pair of the interval join by its
// definition: same key, lo <= b.At-c.TS <= hi (inclusive millisecond
// bounds), at the larger timestamp. Sorted.
func referenceIntervalJoin(cs []click, bs []bid, lo, hi int64) []string {
	var want []string
	for _, c := range cs {
		for _, b := range bs {
			if c.Key == b.User && b.At-c.TS >= lo && b.At-c.TS <= hi {
				want = append(want, pairLine(c.Key, c, b, max(c.TS, b.At)))
			}
		}
	}
	slices.Sort(want)
	return want
}

// intervalJoinJob joins cs and bs by iv into txns, one record per pair;
// late records of either side go to lates.
func intervalJoinJob(cs []click, bs []bid, iv Interval, srcPar, par, leftPoll, rightPoll int, txns, lates *memTxns,
	wrap func(func() Source[click]) func() Source[click]) *Job {
	j := NewJob("interval-join", DefaultParallelism(par), MaxParallelism(32))
	left, right := joinSources(j, cs, bs, 20, srcPar, leftPoll, rightPoll, wrap)
	joined := IntervalJoin(left, right, "join", iv, func(ctx *JoinContext[string], c click, b bid, out Collector[seqRec]) error {
		out.Collect(seqRec{Key: pairLine(ctx.Key, c, b, ctx.Timestamp())})
		return nil
	})
	SinkTo(joined, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	if lates != nil {
		ll := Map(SideOutput(joined, IntervalJoinLateLeft[click]()), "late-left", func(c click) (seqRec, error) {
			return seqRec{Key: fmt.Sprintf("late L%d", c.ID)}, nil
		})
		lr := Map(SideOutput(joined, IntervalJoinLateRight[bid]()), "late-right", func(b bid) (seqRec, error) {
			return seqRec{Key: fmt.Sprintf("late R%d", b.N)}, nil
		})
		SinkTo(Union(ll, "lates", []*Stream[seqRec]{lr}), "late-sink", func() Sink[seqRec] { return &txnSink{txns: lates} })
	}
	return j
}

// runJoin runs j in a mini cluster, across an in-memory exchange between
// two "task managers" if split (and checks that records crossed it).
func runJoin(t *testing.T, j *Job, split bool, opts ...ClusterOpt) {
	t.Helper()
	opts = append([]ClusterOpt{CheckpointInterval(10 * time.Millisecond)}, opts...)
	var sent atomic.Int64
	if split {
		opts = append(opts, Deployment(splitDeployer{job: j, parts: 2, sent: &sent}))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	if _, err := NewMiniCluster(opts...).Run(ctx, j); err != nil {
		t.Fatal(err)
	}
	if split && sent.Load() == 0 {
		t.Fatal("nothing crossed the exchange")
	}
}

// checkLines fails unless got, sorted, is want record by record (so no
// record missing, none extra, none twice).
func checkLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(want) == 0 {
		t.Fatalf("%s: the reference is empty: the test data joins nothing", what)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s: %d records, want %d; first difference:\n%s", what, len(got), len(want), firstDiff(got, want))
	}
}

// An interval join over deterministic out-of-order input, the two inputs
// at different speeds, emits every pair of its definition exactly once,
// at the larger timestamp, record by record: for inclusive, exclusive,
// negative, positive and point intervals, at several parallelisms, in one
// process and across the data plane between two task managers.
func TestIntervalJoinEmitsEveryPairOfItsIntervalOnceRecordByRecord(t *testing.T) {
	cs, bs := joinInputs(7, 1500, 20)
	for _, tc := range []struct {
		iv     Interval
		lo, hi int64
	}{
		{Between(-10*time.Millisecond, 15*time.Millisecond), -10, 15},
		{Between(-10*time.Millisecond, 15*time.Millisecond).LowerBoundExclusive().UpperBoundExclusive(), -9, 14},
		{Between(5*time.Millisecond, 30*time.Millisecond).LowerBoundExclusive(), 6, 30},
		{Between(-30*time.Millisecond, -5*time.Millisecond).UpperBoundExclusive(), -30, -6},
		{Between(0, 0), 0, 0},
	} {
		want := referenceIntervalJoin(cs, bs, tc.lo, tc.hi)
		for _, par := range []int{1, 3} {
			for _, split := range []bool{false, true} {
				// At parallelism 1 the right input runs far ahead of the
				// left; at 3 both run at one record a poll, so records of
				// each side meet the other's after the watermark moved
				// (state cleanup matters).
				leftPoll, rightPoll := 1, 64
				if par == 3 {
					rightPoll = 1
				}
				t.Run(fmt.Sprintf("%v/parallelism=%d/across-an-exchange=%v", tc.iv, par, split), func(t *testing.T) {
					txns, lates := newMemTxns(), newMemTxns()
					j := intervalJoinJob(cs, bs, tc.iv, 2, par, leftPoll, rightPoll, txns, lates, nil)
					runJoin(t, j, split)
					checkLines(t, "joined pairs", sortedLines(txns.output()), want)
					if l := lates.output(); len(l) > 0 {
						t.Fatalf("%d late records (none is late at its source): first %s", len(l), l[0].Key)
					}
				})
			}
		}
	}
}

// Records late at the join (behind the watermark of the other input) are
// never lost silently: each goes to the join's late side output, once;
// every other record joins exactly as the definition says over the
// records that were not late. The left input's timestamps run far ahead
// of the right's within each poll, so many right records arrive behind the
// watermark.
func TestIntervalJoinSendsLateRecordsToItsSideOutputAndJoinsTheRest(t *testing.T) {
	cs, bs := joinInputs(9, 1200, 20)
	// One bid in six arrives 200-400 ms behind its neighbours: behind its
	// own source's watermark, so late at the join.
	for i := range bs {
		if i%6 == 5 {
			bs[i].At -= 200 + int64(i*7919%200)
		}
	}
	txns, lates := newMemTxns(), newMemTxns()
	runJoin(t, intervalJoinJob(cs, bs, Between(-10*time.Millisecond, 15*time.Millisecond), 1, 2, 1, 1, txns, lates, nil), true)
	late := map[int]bool{}
	for _, r := range lates.output() {
		var n int
		if _, err := fmt.Sscanf(r.Key, "late R%d", &n); err != nil {
			t.Fatalf("late record %q: only bids can be late here", r.Key)
		}
		if late[n] {
			t.Fatalf("late bid %d twice", n)
		}
		late[n] = true
	}
	if len(late) == 0 {
		t.Fatal("no bid was late: the test checks nothing")
	}
	var onTime []bid
	for _, b := range bs {
		if !late[b.N] {
			onTime = append(onTime, b)
		} else if b.N%6 != 5 {
			t.Errorf("bid %d (in order at its source) reported late", b.N)
		}
	}
	checkLines(t, "joined pairs", sortedLines(txns.output()), referenceIntervalJoin(cs, onTime, -10, 15))
}

// An interval with no millisecond in it, or bounds finer than a
// millisecond, is an invalid job.
func TestIntervalJoinRefusesAnEmptyInterval(t *testing.T) {
	for _, iv := range []Interval{
		Between(5*time.Millisecond, time.Millisecond),
		Between(0, 0).LowerBoundExclusive(),
		Between(time.Microsecond, time.Millisecond),
	} {
		j := NewJob("bad")
		left, right := joinSources(j, nil, nil, 1, 1, 1, 1, nil)
		SinkTo(IntervalJoin(left, right, "join", iv, func(*JoinContext[string], click, bid, Collector[seqRec]) error { return nil }),
			"sink", func() Sink[seqRec] { return discardSink[seqRec]{} })
		if _, err := j.Describe(); !errors.Is(err, ErrInvalidJob) {
			t.Errorf("%v: %v, want ErrInvalidJob", iv, err)
		}
	}
}

// joinHarness runs an interval join's operator as its task runs it (its
// keyed instance: records, the watermark and timers in; pairs and side
// outputs out, with their timestamps), so which record meets which
// watermark is exact.
type joinHarness struct {
	t      *testing.T
	k      *keyedInstance[string, tagged[click, bid], string]
	joiner *intervalJoiner[string, click, bid, string]
	push   pushFn[tagged[click, bid]]
	out    []string
}

func newJoinHarness(t *testing.T, lo, hi int64) *joinHarness {
	h := &joinHarness{t: t}
	lateL, lateR := IntervalJoinLateLeft[click](), IntervalJoinLateRight[bid]()
	oc := &OperatorContext{sides: map[string]any{
		lateL.ID(): pushFn[click](func(c click) error { h.out = append(h.out, fmt.Sprintf("late L%d", c.ID)); return nil }),
		lateR.ID(): pushFn[bid](func(b bid) error { h.out = append(h.out, fmt.Sprintf("late R%d", b.N)); return nil }),
	}}
	ks := &KeyedStream[string, tagged[click, bid]]{codec: StringCodec(), key: func(v tagged[click, bid]) string {
		if v.second {
			return v.b.User
		}
		return v.a.Key
	}}
	h.joiner = &intervalJoiner[string, click, bid, string]{name: "join", lo: lo, hi: hi, lateL: lateL, lateR: lateR,
		fn: func(_ *JoinContext[string], c click, b bid, out Collector[string]) error {
			out.Collect(fmt.Sprintf("L%d+R%d", c.ID, b.N))
			return nil
		}}
	h.k = newKeyedInstance("join", ks, keyedFunction[string, tagged[click, bid], string]{proc: coProcessor[string, click, bid, string]{fn: h.joiner}},
		keyHasher(StringCodec()), 8, oc, pushFn[string](func(s string) error {
			h.out = append(h.out, fmt.Sprintf("%s@%d", s, h.k.now.ts))
			return nil
		}))
	if err := h.k.open(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.push = h.k.input().(pushFn[tagged[click, bid]])
	return h
}

func (h *joinHarness) left(c click) {
	h.t.Helper()
	h.k.now.ts = c.TS
	if err := h.push(tagged[click, bid]{a: c}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *joinHarness) right(b bid) {
	h.t.Helper()
	h.k.now.ts = b.At
	if err := h.push(tagged[click, bid]{second: true, b: b}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *joinHarness) watermark(wm int64) {
	h.t.Helper()
	if err := h.k.advanceWatermark(h.t.Context(), wm); err != nil {
		h.t.Fatal(err)
	}
}

// held is the number of timestamps each side keeps for key.
func (h *joinHarness) held(key string) (left, right int) {
	h.k.backend.scope.setKey(key, int(keyHasher(StringCodec())(key)%8))
	return h.joiner.left.Len(), h.joiner.right.Len()
}

// A record exactly at the join's watermark is not late: it joins, as in
// Flink, whose IntervalJoinOperator.isLate is timestamp < currentWatermark.
// Only a record below the watermark goes to the late side output. It joins
// every partner, also those whose last possible partner time is the
// watermark (Flink's cleanup timer at that time removes them first).
func TestIntervalJoinJoinsARecordExactlyAtTheWatermark(t *testing.T) {
	h := newJoinHarness(t, -5, 5)
	h.left(click{Key: "ann", TS: 95, ID: 1}) // joins bids at 90..100
	h.watermark(100)
	h.right(bid{User: "ann", At: 100, N: 1})  // at the watermark: joins L1
	h.left(click{Key: "ann", TS: 100, ID: 2}) // at the watermark: joins R1
	h.right(bid{User: "ann", At: 99, N: 2})   // below it: late
	h.left(click{Key: "ann", TS: 99, ID: 3})  // below it: late
	h.watermark(101)
	h.right(bid{User: "ann", At: 101, N: 3}) // L1's last partner was 100: joins only L2
	h.watermark(math.MaxInt64)
	want := []string{"L1+R1@100", "L2+R1@100", "late R2", "late L3", "L2+R3@101"}
	if !slices.Equal(h.out, want) {
		t.Fatalf("emitted %q, want %q", h.out, want)
	}
	if l, r := h.held("ann"); l != 0 || r != 0 {
		t.Fatalf("after the last watermark the join still holds %d left and %d right timestamps", l, r)
	}
}

// State restored from a checkpoint taken while cleanup timers were at the
// last partner's timestamp itself (one millisecond earlier than now) is
// still cleaned up, and kept while a record at the watermark may join it.
func TestIntervalJoinCleansUpRecordsUnderTheEarlierCleanupTimers(t *testing.T) {
	for _, tc := range []struct {
		name string
		wm   []int64 // watermarks after the old timer's time (100)
	}{{"watermark-past-the-timer", []int64{120}}, {"watermark-at-the-timer", []int64{100, 101}}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newJoinHarness(t, -5, 5)
			h.left(click{Key: "ann", TS: 95, ID: 1})
			h.right(bid{User: "ann", At: 200, N: 1}) // last partner 205: stays
			// The timers of the earlier version: at the last partner's time.
			svc := h.k.kctx.service
			svc.DeleteEventTimeTimer(101)
			svc.RegisterEventTimeTimer(100)
			for i, wm := range tc.wm {
				h.watermark(wm)
				if l, _ := h.held("ann"); wm == 100 && l != 1 {
					t.Fatalf("at watermark 100 the left record whose last partner is 100 is gone")
				} else if i == len(tc.wm)-1 && l != 0 {
					t.Fatalf("after watermark %d the join still holds %d left timestamps", wm, l)
				}
			}
			if _, r := h.held("ann"); r != 1 {
				t.Fatalf("the join holds %d right timestamps, want 1 (the bid at 200)", r)
			}
		})
	}
}

// windowOf returns the windows of c holding ts (tumbling, sliding), by
// definition.
func alignedWindowsOf(c windowHarnessConfig, ts int64) []TimeWindow {
	size, slide := c.size, c.slide
	if c.kind == "tumbling" {
		slide = size
	}
	var ws []TimeWindow
	for s := ts - ts%slide; s > ts-size; s -= slide {
		ws = append(ws, TimeWindow{Start: s, End: s + size})
	}
	return ws
}

// referenceWindowJoin is what a window join (every pair) or a window
// co-group (one line per window with records) emits, by definition:
// aligned windows holding both records' timestamps; sessions as the runs
// of a key's sorted timestamps of both sides at most gap apart (windows
// that touch merge, as in Flink).
func referenceWindowJoin(c windowHarnessConfig, cs []click, bs []bid, cogroup bool) []string {
	type members struct {
		ls []click
		rs []bid
	}
	byWindow := map[string]map[TimeWindow]*members{}
	add := func(key string, w TimeWindow) *members {
		if byWindow[key] == nil {
			byWindow[key] = map[TimeWindow]*members{}
		}
		if byWindow[key][w] == nil {
			byWindow[key][w] = &members{}
		}
		return byWindow[key][w]
	}
	if c.kind == "session" {
		type ev struct {
			ts int64
			c  *click
			b  *bid
		}
		evs := map[string][]ev{}
		for i := range cs {
			evs[cs[i].Key] = append(evs[cs[i].Key], ev{ts: cs[i].TS, c: &cs[i]})
		}
		for i := range bs {
			evs[bs[i].User] = append(evs[bs[i].User], ev{ts: bs[i].At, b: &bs[i]})
		}
		for key, es := range evs {
			slices.SortFunc(es, func(a, b ev) int { return int(a.ts - b.ts) })
			for i := 0; i < len(es); {
				k := i + 1
				for k < len(es) && es[k].ts-es[k-1].ts <= c.gap {
					k++
				}
				m := add(key, TimeWindow{Start: es[i].ts, End: es[k-1].ts + c.gap})
				for _, e := range es[i:k] {
					if e.c != nil {
						m.ls = append(m.ls, *e.c)
					} else {
						m.rs = append(m.rs, *e.b)
					}
				}
				i = k
			}
		}
	} else {
		for _, x := range cs {
			for _, w := range alignedWindowsOf(c, x.TS) {
				m := add(x.Key, w)
				m.ls = append(m.ls, x)
			}
		}
		for _, x := range bs {
			for _, w := range alignedWindowsOf(c, x.At) {
				m := add(x.User, w)
				m.rs = append(m.rs, x)
			}
		}
	}
	var want []string
	for key, ws := range byWindow {
		for w, m := range ws {
			if cogroup {
				want = append(want, cogroupLine(key, w, m.ls, m.rs))
				continue
			}
			for _, l := range m.ls {
				for _, r := range m.rs {
					want = append(want, fmt.Sprintf("%s %v L%d R%d", key, w, l.ID, r.N))
				}
			}
		}
	}
	slices.Sort(want)
	return want
}

// cogroupLine prints a co-group firing: the window and each side's ids,
// sorted.
func cogroupLine(key string, w TimeWindow, ls []click, rs []bid) string {
	var l, r []int
	for _, c := range ls {
		l = append(l, c.ID)
	}
	for _, b := range rs {
		r = append(r, b.N)
	}
	slices.Sort(l)
	slices.Sort(r)
	return fmt.Sprintf("%s %v L%v R%v", key, w, l, r)
}

// windowJoinJob joins (or co-groups) cs and bs in the windows of c.
func windowJoinJob(t *testing.T, cs []click, bs []bid, c windowHarnessConfig, cogroup bool, srcPar, par int, txns *memTxns,
	wrap func(func() Source[click]) func() Source[click]) *Job {
	j := NewJob("window-join", DefaultParallelism(par), MaxParallelism(32))
	left, right := joinSources(j, cs, bs, 20, srcPar, 1, 64, wrap)
	var out *Stream[seqRec]
	if cogroup {
		out = CoGroupWindow(left, right, "join", c.assigner(t), func(ctx *WindowContext[string], ls []click, rs []bid, out Collector[seqRec]) error {
			out.Collect(seqRec{Key: cogroupLine(ctx.Key, ctx.Window, ls, rs)})
			return nil
		})
	} else {
		out = WindowJoin(left, right, "join", c.assigner(t), func(ctx *WindowContext[string], l click, r bid, out Collector[seqRec]) error {
			out.Collect(seqRec{Key: fmt.Sprintf("%s %v L%d R%d", ctx.Key, ctx.Window, l.ID, r.N)})
			return nil
		})
	}
	SinkTo(out, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	return j
}

// A window join (every pair of a window) and a window co-group (each
// window's records of both sides) over deterministic out-of-order input
// emit exactly what their definitions say, record by record, for
// tumbling, sliding and session windows (sessions merged over both
// sides), in one process and across the data plane.
func TestWindowJoinAndCoGroupEmitEveryWindowOfTheirDefinitionRecordByRecord(t *testing.T) {
	cs, bs := joinInputs(3, 1200, 20)
	for _, c := range []windowHarnessConfig{
		{kind: "tumbling", size: 40},
		{kind: "sliding", size: 45, slide: 15},
		{kind: "session", gap: 9},
	} {
		c.time = "event"
		for _, cogroup := range []bool{false, true} {
			want := referenceWindowJoin(c, cs, bs, cogroup)
			for _, split := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/cogroup=%v/across-an-exchange=%v", c.kind, cogroup, split), func(t *testing.T) {
					txns := newMemTxns()
					runJoin(t, windowJoinJob(t, cs, bs, c, cogroup, 1, 3, txns, nil), split)
					checkLines(t, "window results", sortedLines(txns.output()), want)
				})
			}
		}
	}
}

// byTimestamp is a KeyedCoProcessor over both inputs with one shared
// keyed state: the ids of both sides by timestamp, each timestamp released
// by an event-time timer as one line, sorted; a record at or below the
// watermark would print a "late" line.
type byTimestamp struct {
	ids *MapState[int64, []string]
}

func (p *byTimestamp) Open(_ context.Context, st *StateRegistry[string]) (err error) {
	p.ids, err = NewMapState[int64, []string](st, "ids", nil, nil)
	return err
}

func (p *byTimestamp) add(ctx *KeyedContext[string], id string, out Collector[seqRec]) error {
	ts := ctx.Timestamp()
	if ts <= ctx.CurrentWatermark() {
		out.Collect(seqRec{Key: fmt.Sprintf("late %s %s", ctx.Key(), id)})
		return nil
	}
	ids, _ := p.ids.Get(ts)
	p.ids.Put(ts, append(slices.Clip(ids), id))
	ctx.TimerService().RegisterEventTimeTimer(ts)
	return nil
}

func (p *byTimestamp) ProcessElement1(ctx *KeyedContext[string], c click, out Collector[seqRec]) error {
	return p.add(ctx, fmt.Sprintf("L%d", c.ID), out)
}

func (p *byTimestamp) ProcessElement2(ctx *KeyedContext[string], b bid, out Collector[seqRec]) error {
	return p.add(ctx, fmt.Sprintf("R%d", b.N), out)
}

func (p *byTimestamp) OnTimer(ctx *KeyedContext[string], ts int64, out Collector[seqRec]) error {
	ids, _ := p.ids.Get(ts)
	p.ids.Delete(ts)
	ids = slices.Sorted(slices.Values(ids)) // a copy: a snapshot may still encode the state's slice
	out.Collect(seqRec{Key: fmt.Sprintf("%s %d %s", ctx.Key(), ts, strings.Join(ids, ","))})
	return nil
}

// referenceByTimestamp is what byTimestamp emits when no record is late.
func referenceByTimestamp(cs []click, bs []bid) []string {
	ids := map[string]map[int64][]string{}
	add := func(key string, ts int64, id string) {
		if ids[key] == nil {
			ids[key] = map[int64][]string{}
		}
		ids[key][ts] = append(ids[key][ts], id)
	}
	for _, c := range cs {
		add(c.Key, c.TS, fmt.Sprintf("L%d", c.ID))
	}
	for _, b := range bs {
		add(b.User, b.At, fmt.Sprintf("R%d", b.N))
	}
	var want []string
	for key, m := range ids {
		for ts, l := range m {
			slices.Sort(l)
			want = append(want, fmt.Sprintf("%s %d %s", key, ts, strings.Join(l, ",")))
		}
	}
	slices.Sort(want)
	return want
}

func connectJob(cs []click, bs []bid, srcPar, par, leftPoll, rightPoll int, txns *memTxns,
	wrap func(func() Source[click]) func() Source[click]) *Job {
	j := NewJob("connect", DefaultParallelism(par), MaxParallelism(32))
	left, right := joinSources(j, cs, bs, 20, srcPar, leftPoll, rightPoll, wrap)
	out := ProcessConnected(Connect(left, right), "by-ts", func() KeyedCoProcessor[string, click, bid, seqRec] { return &byTimestamp{} })
	SinkTo(out, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	return j
}

// Connected keyed streams share one keyed state and one timer service per
// key, and the operator's watermark is the minimum of both inputs': with
// the left input racing ahead (a record a poll on the right, 256 on the
// left), no record of the slow input is ever behind the watermark, and
// every timestamp of every key is released once with the ids of both
// sides, record by record; at several parallelisms, in one process and
// across the data plane.
func TestConnectedStreamsShareStateAndTimersUnderTheMinimumWatermark(t *testing.T) {
	cs, bs := joinInputs(5, 1500, 20)
	want := referenceByTimestamp(cs, bs)
	for _, par := range []int{1, 3} {
		for _, split := range []bool{false, true} {
			t.Run(fmt.Sprintf("parallelism=%d/across-an-exchange=%v", par, split), func(t *testing.T) {
				txns := newMemTxns()
				runJoin(t, connectJob(cs, bs, 2, par, 256, 1, txns, nil), split)
				checkLines(t, "released timestamps", sortedLines(txns.output()), want)
			})
		}
	}
}

// Barriers are aligned across both inputs: through random task failures
// and restarts, with the two inputs at different speeds, the connected
// operator's state and its transactional output are exactly-once: every
// line of a run without failure, once.
func TestConnectedStreamsAreExactlyOnceThroughFailuresWithInputsAtDifferentSpeeds(t *testing.T) {
	cs, bs := joinInputs(6, 1000, 20)
	want := referenceByTimestamp(cs, bs)
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0))
			fp := &randomFailpoints{r: newRand(int64(seed)), left: 2 + r.IntN(3), fired: map[string]int{}, prob: map[string]float64{
				"task.process":                  0.002,
				"jm.after-checkpoint-persisted": 0.1,
			}}
			txns := newMemTxns()
			slow, fast := 1, 1+r.IntN(128)
			if seed%2 == 0 {
				slow, fast = fast, slow
			}
			// Two source subtasks: the split deployment needs a parallelism
			// of two to put tasks on both sides of the exchange.
			runJoin(t, connectJob(cs, bs, 2, 1+r.IntN(3), slow, fast, txns, nil), seed%2 == 1,
				Failpoints(fp), Restarts(50, time.Millisecond), BatchSize(1+r.IntN(32)))
			if len(fp.fired) == 0 {
				t.Fatal("no failure injected: the test checks nothing")
			}
			t.Logf("failures injected: %v", fp.fired)
			checkLines(t, "released timestamps", sortedLines(txns.output()), want)
		})
	}
}

// A join stopped mid-stream (its buffered records and timers in its last
// checkpoint) and resumed with the join at another parallelism commits
// exactly what a run without failure does, record by record: connect,
// interval join and window join.
func TestJoinsRestoredAtAnotherParallelismEqualARunWithoutFailure(t *testing.T) {
	cs, bs := joinInputs(8, 2000, 20)
	jobs := map[string]func(par int, txns *memTxns, wrap stallFn) *Job{
		"connect": func(par int, txns *memTxns, wrap stallFn) *Job {
			return connectJob(cs, bs, 2, par, 1, 1, txns, wrap)
		},
		"interval": func(par int, txns *memTxns, wrap stallFn) *Job {
			return intervalJoinJob(cs, bs, Between(-15*time.Millisecond, 10*time.Millisecond), 2, par, 1, 1, txns, nil, wrap)
		},
		"window-session": func(par int, txns *memTxns, wrap stallFn) *Job {
			return windowJoinJob(t, cs, bs, windowHarnessConfig{kind: "session", gap: 9, time: "event"}, false, 2, par, txns, wrap)
		},
	}
	for _, name := range []string{"connect", "interval", "window-session"} {
		for _, tc := range []struct{ from, to int }{{2, 3}, {3, 1}} {
			t.Run(fmt.Sprintf("%s/%d->%d", name, tc.from, tc.to), func(t *testing.T) {
				ref := newMemTxns()
				runJoin(t, jobs[name](tc.from, ref, nil), false)
				want := sortedLines(ref.output())
				store, err := checkpoint.OpenStore(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				defer store.Close()
				txns := newMemTxns()
				stopMidStream(t, store, len(cs)/4, func(stall stallFn) *Job { return jobs[name](tc.from, txns, stall) })
				before := len(txns.output())
				if before == 0 || before >= len(want) {
					t.Fatalf("first run committed %d of %d results: want a run stopped mid-way", before, len(want))
				}
				runJoin(t, jobs[name](tc.to, txns, nil), false, CheckpointStore(store))
				checkLines(t, "results", sortedLines(txns.output()), want)
			})
		}
	}
}

// An idle input does not stall a two-input operator: with the right input
// idle (nothing to read, never ending), the left input's watermark alone
// releases its timestamps.
func TestAnIdleInputDoesNotStallTheConnectedWatermark(t *testing.T) {
	cs := clicks(400, 5)
	const bound = 500
	var maxTS int64
	for _, c := range cs {
		maxTS = max(maxTS, c.TS)
	}
	var due []click
	for _, c := range cs {
		if c.TS <= maxTS-bound-1 {
			due = append(due, c)
		}
	}
	want := referenceByTimestamp(due, nil)
	txns := newMemTxns()
	j := NewJob("idle-input", MaxParallelism(16))
	left := FromSource(j, "clicks", func() Source[click] { return &splitClicks{items: [][]click{cs}, stall: true} },
		Watermarks(ForBoundedOutOfOrderness[click](bound*time.Millisecond, WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }),
			WithIdleness(50*time.Millisecond), WithWatermarkInterval(5*time.Millisecond))))
	right := FromSource(j, "bids", func() Source[bid] {
		return &lingeringSource[bid]{Source: SliceSource[bid](nil, 1)(), done: func() bool { return false }}
	},
		Watermarks(ForBoundedOutOfOrderness[bid](bound*time.Millisecond, WithTimestampAssigner(func(b bid, _ int64) int64 { return b.At }),
			WithIdleness(50*time.Millisecond), WithWatermarkInterval(5*time.Millisecond))))
	out := ProcessConnected(Connect(KeyBy(left, func(c click) string { return c.Key }, nil), KeyBy(right, func(b bid) string { return b.User }, nil)),
		"by-ts", func() KeyedCoProcessor[string, click, bid, seqRec] { return &byTimestamp{} })
	SinkTo(out, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	mc := NewMiniCluster(CheckpointInterval(10*time.Millisecond), OnCheckpointComplete(func(CheckpointEvent) {
		if len(txns.output()) >= len(want) {
			cancel()
		}
	}))
	if _, err := mc.Run(ctx, j); !errors.Is(err, context.Canceled) {
		t.Fatalf("the job (stopped once every due timestamp was committed): %v", err)
	}
	got := sortedLines(txns.output())
	// Timestamps beyond the due ones may be released too (the watermark
	// moves in steps); every due one must be there, once, whole.
	got = slices.DeleteFunc(got, func(l string) bool {
		_, ok := slices.BinarySearch(want, l)
		return !ok && !strings.HasPrefix(l, "late")
	})
	checkLines(t, "released timestamps", got, want)
}

// Union merges streams of one type: every record of each, once, across
// the data plane too.
func TestUnionHoldsEveryRecordOfEveryInputOnce(t *testing.T) {
	cs, _ := joinInputs(4, 500, 20)
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("across-an-exchange=%v", split), func(t *testing.T) {
			j := NewJob("union", DefaultParallelism(2))
			a := FromSource(j, "a", SliceSource(cs[:200], 3))
			b := FromSource(j, "b", SliceSource(cs[200:], 7), Parallelism(3))
			u := Union(a, "union", []*Stream[click]{Rebalance(b)})
			lines := Map(u, "lines", func(c click) (seqRec, error) { return seqRec{Key: fmt.Sprintf("%d", c.ID)}, nil })
			txns := newMemTxns()
			SinkTo(lines, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
			runJoin(t, j, split)
			var want []string
			for _, c := range cs {
				want = append(want, fmt.Sprintf("%d", c.ID))
			}
			slices.Sort(want)
			checkLines(t, "union", sortedLines(txns.output()), want)
		})
	}
}
