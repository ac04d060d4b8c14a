package runtime

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// The window transcripts (testdata/window/*) drive the window operator of
// window_operator.go with records, watermarks and clock ticks and print
// every record it emits, every late record, and on request its state and
// timers. The operator runs on the real keyed state backend; the timers
// are a plain ordered set per key and timestamp, as the runtime's timer
// service keeps them.
//
// Commands:
//
//	init kind=tumbling|sliding|session time=event|processing [size=ms] [slide=ms] [gap=ms]
//	     [offset=ms] [lateness=ms] fn=sum|max|max-panes|last|last-panes|list [late=side|drop] [parallelism=n] [maxpar=n]
//	add              one record a line: key ts value (ts ignored in processing time)
//	watermark ts     advance the watermark, firing the event-time timers up to it
//	advance ts       advance the clock, firing the processing-time timers up to it
//	state            each key's windows (panes) with accumulators, and the timers
//	stats            Add and Merge calls, late records
//	rescale parallelism=n   snapshot every subtask and restore the key groups on n subtasks
func TestWindowTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/window", func(t *testing.T, path string) {
		var h *windowHarness
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			if td.Cmd != "init" && h == nil {
				t.Fatalf("%s: init first", td.Pos)
			}
			var err error
			switch td.Cmd {
			case "init":
				h, err = newWindowHarness(t, parseWindowHarnessConfig(t, td))
				if err != nil {
					return "error: " + err.Error()
				}
				return ""
			case "add":
				for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
					f := strings.Fields(line)
					if len(f) != 3 {
						t.Fatalf("%s: want key ts value, got %q", td.Pos, line)
					}
					if err = h.add(f[0], parseMillis(t, f[1]), parseMillis(t, f[2])); err != nil {
						break
					}
				}
			case "watermark":
				err = h.advance(true, parseMillis(t, td.CmdArgs[0].Key))
			case "advance":
				err = h.advance(false, parseMillis(t, td.CmdArgs[0].Key))
			case "state":
				h.printState()
			case "stats":
				fmt.Fprintf(&h.out, "adds=%d merges=%d late=%d\n", h.adds, h.merges, h.late())
			case "rescale":
				var p int
				td.ScanArgs(t, "parallelism", &p)
				err = h.rescale(p)
			default:
				t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
			}
			if err != nil {
				fmt.Fprintf(&h.out, "error: %v\n", err)
			}
			s := h.out.String()
			h.out.Reset()
			return s
		})
	})
}

func parseMillis(t *testing.T, s string) int64 {
	t.Helper()
	if s == "max" {
		return math.MaxInt64
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// windowMachine is the window operator whatever its accumulator type.
type windowMachine interface {
	processElement(key string, ts int64, v int64) error
	onTimer(key string, ts int64, eventTime bool) error
	lateCount() int64
	dumpState() string
}

func (op *windowOperator[K, IN, ACC, OUT]) lateCount() int64 { return op.lateRecords }

func (op *windowOperator[K, IN, ACC, OUT]) dumpState() string {
	var ws []TimeWindow
	op.state.Range(func(w TimeWindow, _ ACC) bool { ws = append(ws, w); return true })
	slices.SortFunc(ws, func(a, b TimeWindow) int { return cmpInt64(a.Start, b.Start) })
	var parts []string
	for _, w := range ws {
		acc, _ := op.state.Get(w)
		parts = append(parts, fmt.Sprintf("%v=%v", w, acc))
	}
	return strings.Join(parts, " ")
}

// harnessTimers is one subtask's timers and clocks: a set per key and
// timestamp per time domain, as the runtime's timer service keeps them.
type harnessTimers struct {
	scope *keyScope[string]
	wm    int64
	now   int64
	event map[harnessTimer]bool
	proc  map[harnessTimer]bool
}

type harnessTimer struct {
	key string
	ts  int64
}

func (h *harnessTimers) currentWatermark() int64      { return h.wm }
func (h *harnessTimers) currentProcessingTime() int64 { return h.now }
func (h *harnessTimers) registerEventTimeTimer(ts int64) {
	h.event[harnessTimer{h.scope.key, ts}] = true
}
func (h *harnessTimers) deleteEventTimeTimer(ts int64) {
	delete(h.event, harnessTimer{h.scope.key, ts})
}
func (h *harnessTimers) registerProcessingTimeTimer(ts int64) {
	h.proc[harnessTimer{h.scope.key, ts}] = true
}
func (h *harnessTimers) deleteProcessingTimeTimer(ts int64) {
	delete(h.proc, harnessTimer{h.scope.key, ts})
}

// next returns the earliest timer up to ts (by time, then key).
func nextTimer(set map[harnessTimer]bool, upTo int64) (harnessTimer, bool) {
	var best harnessTimer
	found := false
	for tm := range set {
		if tm.ts > upTo {
			continue
		}
		if !found || tm.ts < best.ts || (tm.ts == best.ts && tm.key < best.key) {
			best, found = tm, true
		}
	}
	return best, found
}

func sortedTimers(set map[harnessTimer]bool) []harnessTimer {
	ts := slices.Collect(maps.Keys(set))
	slices.SortFunc(ts, func(a, b harnessTimer) int {
		if c := cmpInt64(a.ts, b.ts); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	return ts
}

type harnessSubtask struct {
	b      *keyedBackend[string]
	timers *harnessTimers
	op     windowMachine
}

type windowHarness struct {
	t        *testing.T
	newOp    func(st *harnessSubtask) (windowMachine, error)
	maxPar   int
	subtasks []*harnessSubtask
	adds     int
	merges   int
	lateOld  int64 // late records of subtasks replaced by a rescale
	keys     map[string]bool
	out      strings.Builder
}

// sumAcc is the transcripts' aggregate accumulator.
type sumAcc struct {
	Sum int64 `json:"sum"`
	N   int64 `json:"n"`
}

func (a sumAcc) String() string { return fmt.Sprintf("sum:%d/n:%d", a.Sum, a.N) }

// countingSum is an AggregateFunction that counts its calls.
type countingSum struct{ h *windowHarness }

func (c countingSum) CreateAccumulator() sumAcc { return sumAcc{} }
func (c countingSum) Add(v int64, acc sumAcc) sumAcc {
	c.h.adds++
	return sumAcc{Sum: acc.Sum + v, N: acc.N + 1}
}
func (c countingSum) GetResult(acc sumAcc) string { return fmt.Sprintf("sum=%d n=%d", acc.Sum, acc.N) }
func (c countingSum) Merge(a, b sumAcc) sumAcc {
	c.h.merges++
	return sumAcc{Sum: a.Sum + b.Sum, N: a.N + b.N}
}

// windowHarnessConfig is a window operator's configuration in the
// harness: kind tumbling|sliding|session, time event|processing, durations
// in ms, fn sum|max|max-panes|last|last-panes|list, late side|drop.
type windowHarnessConfig struct {
	kind, time, fn, late               string
	size, slide, gap, offset, lateness int64
	parallelism, maxPar                int
}

func parseWindowHarnessConfig(t *testing.T, td *datadriven.TestData) windowHarnessConfig {
	c := windowHarnessConfig{late: "side", parallelism: 1, maxPar: 8}
	td.ScanArgs(t, "kind", &c.kind)
	td.ScanArgs(t, "time", &c.time)
	td.ScanArgs(t, "fn", &c.fn)
	td.MaybeScanArgs(t, "size", &c.size)
	td.MaybeScanArgs(t, "slide", &c.slide)
	td.MaybeScanArgs(t, "gap", &c.gap)
	td.MaybeScanArgs(t, "offset", &c.offset)
	td.MaybeScanArgs(t, "lateness", &c.lateness)
	td.MaybeScanArgs(t, "late", &c.late)
	td.MaybeScanArgs(t, "parallelism", &c.parallelism)
	td.MaybeScanArgs(t, "maxpar", &c.maxPar)
	return c
}

// assigner is the configuration's WindowAssigner.
func (c windowHarnessConfig) assigner(t *testing.T) WindowAssigner {
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	event := c.time == "event"
	switch {
	case c.kind == "tumbling" && event:
		return TumblingEventTimeWindows(ms(c.size), WindowOffset(ms(c.offset)))
	case c.kind == "tumbling":
		return TumblingProcessingTimeWindows(ms(c.size), WindowOffset(ms(c.offset)))
	case c.kind == "sliding" && event:
		return SlidingEventTimeWindows(ms(c.size), ms(c.slide), WindowOffset(ms(c.offset)))
	case c.kind == "sliding":
		return SlidingProcessingTimeWindows(ms(c.size), ms(c.slide), WindowOffset(ms(c.offset)))
	case c.kind == "session" && event:
		return EventTimeSessionWindows(ms(c.gap))
	case c.kind == "session":
		return ProcessingTimeSessionWindows(ms(c.gap))
	}
	t.Fatalf("kind %q time %q", c.kind, c.time)
	return WindowAssigner{}
}

func newWindowHarness(t *testing.T, c windowHarnessConfig) (*windowHarness, error) {
	fn, late, lateness, par, maxPar := c.fn, c.late, c.lateness, c.parallelism, c.maxPar
	asg := c.assigner(t)
	h := &windowHarness{t: t, maxPar: maxPar, keys: map[string]bool{}}
	h.newOp = func(st *harnessSubtask) (windowMachine, error) {
		r := &StateRegistry[string]{b: st.b}
		emit := func(w TimeWindow, v string) error {
			fmt.Fprintf(&h.out, "fire %s %v %s\n", st.b.scope.key, w, v)
			return nil
		}
		var lateFn func(int64) error
		if late == "side" {
			lateFn = func(v int64) error {
				fmt.Fprintf(&h.out, "late %s %d\n", st.b.scope.key, v)
				return nil
			}
		}
		switch fn {
		case "sum":
			return newWindowOperator(r, asg, lateness, aggregateWindowFunc[string](AggregateFunction[int64, sumAcc, string](countingSum{h}), nil), st.timers, emit, lateFn)
		case "max", "max-panes":
			// "max-panes" reduces sliding windows pane by pane (as
			// ReduceWindow did before it went per window).
			wf := reduceWindowFunc[string](func(a, b int64) (int64, error) { return max(a, b), nil }, Int64Codec())
			wf.ordered = fn == "max"
			return newWindowOperator(r, asg, lateness, windowFunc[string, int64, reduceAcc[int64], string]{
				create: wf.create, codec: wf.codec, ordered: wf.ordered,
				add: func(acc reduceAcc[int64], v int64) (reduceAcc[int64], error) {
					h.adds++
					return wf.add(acc, v)
				},
				merge: func(a, b reduceAcc[int64]) (reduceAcc[int64], error) {
					h.merges++
					return wf.merge(a, b)
				},
				result: func(ctx *WindowContext[string], acc reduceAcc[int64], out Collector[string]) error {
					return wf.result(ctx, acc, &mapCollector[int64, string]{out, func(v int64) string { return fmt.Sprintf("max=%d", v) }})
				},
			}, st.timers, emit, lateFn)
		case "last", "last-panes":
			// A reduce that is associative but not commutative: the last
			// record to arrive. "last-panes" reduces sliding windows pane by
			// pane (as ReduceWindow did before it went per window).
			wf := reduceWindowFunc[string](func(_, b int64) (int64, error) { return b, nil }, Int64Codec())
			wf.ordered = fn == "last"
			return newWindowOperator(r, asg, lateness, windowFunc[string, int64, reduceAcc[int64], string]{
				create: wf.create, codec: wf.codec, merge: wf.merge, ordered: wf.ordered,
				add: func(acc reduceAcc[int64], v int64) (reduceAcc[int64], error) {
					h.adds++
					return wf.add(acc, v)
				},
				result: func(ctx *WindowContext[string], acc reduceAcc[int64], out Collector[string]) error {
					return wf.result(ctx, acc, &mapCollector[int64, string]{out, func(v int64) string { return fmt.Sprintf("last=%d", v) }})
				},
			}, st.timers, emit, lateFn)
		case "list":
			pf := ProcessWindowFunc[string, int64, string](func(ctx *WindowContext[string], els []int64, out Collector[string]) error {
				s := fmt.Sprintf("key=%s window=%v elements=%v", ctx.Key, ctx.Window, els)
				if ctx.Late {
					s += " (late firing)"
				}
				out.Collect(s)
				return nil
			})
			return newWindowOperator(r, asg, lateness, processWindowFunc[string, int64, string](pf, Int64Codec(), true), st.timers, emit, lateFn)
		}
		t.Fatalf("fn %q", fn)
		return nil, nil
	}
	if err := h.buildAt(par, nil, nil, nil, math.MinInt64, 0); err != nil {
		return nil, err
	}
	return h, nil
}

// mapCollector maps records before collecting them.
type mapCollector[T, U any] struct {
	out Collector[U]
	f   func(T) U
}

func (m *mapCollector[T, U]) Collect(v T) { m.out.Collect(m.f(v)) }

// buildAt makes par subtasks restored from the key-group blobs and timers,
// at watermark wm and processing time now.
func (h *windowHarness) buildAt(par int, blobs map[int][]byte, event, proc map[harnessTimer]bool, wm, now int64) error {
	h.subtasks = nil
	for i := 0; i < par; i++ {
		st := &harnessSubtask{b: newKeyedBackend[string](StringCodec(), h.maxPar)}
		st.timers = &harnessTimers{scope: &st.b.scope, wm: wm, now: now, event: map[harnessTimer]bool{}, proc: map[harnessTimer]bool{}}
		for _, kg := range KeyGroupRange(i, h.maxPar, par) {
			if blob, ok := blobs[kg]; ok {
				if err := st.b.restoreKeyGroup(kg, blob); err != nil {
					return err
				}
			}
		}
		for tm := range event {
			if h.subtaskOf(tm.key, par) == i {
				st.timers.event[tm] = true
			}
		}
		for tm := range proc {
			if h.subtaskOf(tm.key, par) == i {
				st.timers.proc[tm] = true
			}
		}
		op, err := h.newOp(st)
		if err != nil {
			return err
		}
		st.op = op
		h.subtasks = append(h.subtasks, st)
	}
	return nil
}

func (h *windowHarness) keyGroup(key string) int { return int(hashString(key) % uint32(h.maxPar)) }

func (h *windowHarness) subtaskOf(key string, par int) int {
	return SubtaskOf(h.keyGroup(key), h.maxPar, par)
}

func (h *windowHarness) add(key string, ts, v int64) error {
	h.keys[key] = true
	st := h.subtasks[h.subtaskOf(key, len(h.subtasks))]
	st.b.scope.setKey(key, h.keyGroup(key))
	return st.op.processElement(key, ts, v)
}

// advance moves the watermark (event) or the clock to ts on every subtask,
// firing their due timers in order of time, then key.
func (h *windowHarness) advance(event bool, ts int64) error {
	for _, st := range h.subtasks {
		set := st.timers.proc
		if event {
			set = st.timers.event
			st.timers.wm = max(st.timers.wm, ts)
		} else {
			st.timers.now = max(st.timers.now, ts)
		}
		for {
			tm, ok := nextTimer(set, ts)
			if !ok {
				break
			}
			delete(set, tm)
			st.b.scope.setKey(tm.key, h.keyGroup(tm.key))
			if err := st.op.onTimer(tm.key, tm.ts, event); err != nil {
				return err
			}
		}
	}
	return nil
}

func (h *windowHarness) late() int64 {
	n := h.lateOld
	for _, st := range h.subtasks {
		n += st.op.lateCount()
	}
	return n
}

func (h *windowHarness) printState() {
	for _, key := range slices.Sorted(maps.Keys(h.keys)) {
		st := h.subtasks[h.subtaskOf(key, len(h.subtasks))]
		st.b.scope.setKey(key, h.keyGroup(key))
		var ev, pr []string
		for _, tm := range sortedTimers(st.timers.event) {
			if tm.key == key {
				ev = append(ev, strconv.FormatInt(tm.ts, 10))
			}
		}
		for _, tm := range sortedTimers(st.timers.proc) {
			if tm.key == key {
				pr = append(pr, strconv.FormatInt(tm.ts, 10))
			}
		}
		fmt.Fprintf(&h.out, "%s: state {%s} event-timers [%s] processing-timers [%s]\n",
			key, st.op.dumpState(), strings.Join(ev, " "), strings.Join(pr, " "))
	}
}

// rescale snapshots every subtask and restores on par subtasks.
func (h *windowHarness) rescale(par int) error {
	blobs := map[int][]byte{}
	event, proc := map[harnessTimer]bool{}, map[harnessTimer]bool{}
	wm, now := int64(math.MaxInt64), int64(math.MaxInt64)
	for _, st := range h.subtasks {
		b, err := st.b.snapshot()()
		if err != nil {
			return err
		}
		maps.Copy(blobs, b)
		maps.Copy(event, st.timers.event)
		maps.Copy(proc, st.timers.proc)
		wm, now = min(wm, st.timers.wm), min(now, st.timers.now)
		h.lateOld += st.op.lateCount()
	}
	return h.buildAt(par, blobs, event, proc, wm, now)
}
