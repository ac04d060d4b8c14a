package runtime

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// windowInput is one record of the model tests.
type windowInput struct {
	key   string
	ts, v int64
}

// outOfOrderInput returns n records over keys, their timestamps rising by
// 0-4 ms a record and each out of order by up to bound ms.
func outOfOrderInput(seed uint64, n int, keys []string, bound int64) []windowInput {
	r := rand.New(rand.NewPCG(seed, seed+1))
	in := make([]windowInput, n)
	base := int64(1000)
	for i := range in {
		base += r.Int64N(5)
		in[i] = windowInput{key: keys[r.IntN(len(keys))], ts: base - r.Int64N(bound+1), v: int64(i + 1)}
	}
	return in
}

// referenceWindows computes what windows of records that are never late
// hold, straight from the definitions: every aligned window holding a
// record's timestamp; sessions as the runs of a key's sorted timestamps
// at most gap apart in event time (Flink's sessions: windows that touch
// merge), less than gap apart in processing time. Lines as the harness prints them (fn=sum).
func referenceWindows(c windowHarnessConfig, in []windowInput) []string {
	type kw struct {
		key string
		w   TimeWindow
	}
	acc := map[kw]sumAcc{}
	add := func(k kw, v int64) {
		a := acc[k]
		acc[k] = sumAcc{Sum: a.Sum + v, N: a.N + 1}
	}
	if c.kind == "session" {
		byKey := map[string][]windowInput{}
		for _, r := range in {
			byKey[r.key] = append(byKey[r.key], r)
		}
		for key, rs := range byKey {
			slices.SortStableFunc(rs, func(a, b windowInput) int { return cmpInt64(a.ts, b.ts) })
			// In event time windows that touch merge (a record exactly
			// gap after the previous one joins its session); in
			// processing time the harness's clock reaches a session's
			// end, firing it, before a record processed at that time.
			next := func(a, b int64) bool { return b > a+c.gap }
			if c.time == "processing" {
				next = func(a, b int64) bool { return b >= a+c.gap }
			}
			start := 0
			for i := range rs {
				if i+1 == len(rs) || next(rs[i].ts, rs[i+1].ts) {
					w := TimeWindow{Start: rs[start].ts, End: rs[i].ts + c.gap}
					for _, r := range rs[start : i+1] {
						add(kw{key, w}, r.v)
					}
					start = i + 1
				}
			}
		}
	} else {
		slide := c.slide
		if c.kind == "tumbling" {
			slide = c.size
		}
		for _, r := range in {
			for s := windowStart(r.ts, c.offset, slide); s > r.ts-c.size; s -= slide {
				add(kw{r.key, TimeWindow{Start: s, End: s + c.size}}, r.v)
			}
		}
	}
	var out []string
	for k, a := range acc {
		out = append(out, fmt.Sprintf("fire %s %v sum=%d n=%d", k.key, k.w, a.Sum, a.N))
	}
	slices.Sort(out)
	return out
}

// Every window type, in event time (out-of-order records, a bounded
// out-of-orderness watermark) and in processing time (the clock at each
// record's timestamp), with and without rescaling the operator in the
// middle of its windows (1 -> 3 -> 2 subtasks, state and timers restored by
// key group): every window fires once with exactly the records the
// definitions put in it, record by record, and each record costs one Add
// whatever the number of windows holding it.
func TestWindowsMatchTheirDefinitionRecordByRecord(t *testing.T) {
	const n, bound = 3000, 20
	keys := []string{"ann", "bob", "cyd", "dee", "eve"}
	cases := []windowHarnessConfig{
		{kind: "tumbling", size: 10},
		{kind: "tumbling", size: 50, offset: 7},
		{kind: "sliding", size: 30, slide: 10},
		{kind: "sliding", size: 25, slide: 10, offset: 3},
		{kind: "sliding", size: 60, slide: 1},
		{kind: "session", gap: 12},
		{kind: "session", gap: 40},
	}
	for _, c := range cases {
		for _, tm := range []string{"event", "processing"} {
			for _, rescale := range []bool{false, true} {
				c := c
				c.time, c.fn, c.late, c.parallelism, c.maxPar = tm, "sum", "side", 1, 16
				name := fmt.Sprintf("%s/size=%d,slide=%d,gap=%d,offset=%d/%s/rescale=%v", c.kind, c.size, c.slide, c.gap, c.offset, tm, rescale)
				t.Run(name, func(t *testing.T) {
					in := outOfOrderInput(uint64(len(name)), n, keys, bound)
					if tm == "processing" {
						// The clock is monotonic: records come at their ts.
						slices.SortStableFunc(in, func(a, b windowInput) int { return cmpInt64(a.ts, b.ts) })
					}
					h, err := newWindowHarness(t, c)
					if err != nil {
						t.Fatal(err)
					}
					var got []string
					take := func() {
						for _, l := range strings.Split(strings.TrimSpace(h.out.String()), "\n") {
							if l != "" {
								got = append(got, l)
							}
						}
						h.out.Reset()
					}
					maxTs := int64(math.MinInt64)
					for i, r := range in {
						if rescale && (i == n/3 || i == 2*n/3) {
							if err := h.rescale(map[bool]int{true: 3, false: 2}[i == n/3]); err != nil {
								t.Fatal(err)
							}
						}
						if tm == "processing" {
							if err := h.advance(false, r.ts); err != nil {
								t.Fatal(err)
							}
						}
						if err := h.add(r.key, r.ts, r.v); err != nil {
							t.Fatal(err)
						}
						maxTs = max(maxTs, r.ts)
						if tm == "event" && i%7 == 0 {
							if err := h.advance(true, maxTs-bound-1); err != nil {
								t.Fatal(err)
							}
						}
						take()
					}
					if err := h.advance(tm == "event", math.MaxInt64); err != nil {
						t.Fatal(err)
					}
					take()
					for _, l := range got {
						if strings.HasPrefix(l, "late") {
							t.Fatalf("record late within the out-of-orderness bound: %s", l)
						}
					}
					slices.Sort(got)
					want := referenceWindows(c, in)
					if !slices.Equal(got, want) {
						t.Fatalf("%d firings, want %d; first difference:\n%s", len(got), len(want), firstDiff(got, want))
					}
					if h.adds != n {
						t.Fatalf("Add called %d times for %d records", h.adds, n)
					}
				})
			}
		}
	}
}

// firstDiff describes the first line where got and want differ.
func firstDiff(got, want []string) string {
	for i := 0; i < max(len(got), len(want)); i++ {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("got  %q\nwant %q", g, w)
		}
	}
	return ""
}

// flinkAlignedWindows is Flink's WindowOperator for tumbling and sliding
// event-time windows with the default trigger, written plainly: every
// record copied into each of its windows that is not past its cleanup
// time, a late firing for each such window whose end the watermark passed,
// the record to the late output when it went into none. The window
// operator's panes must give the same results.
type flinkAlignedWindows struct {
	c        windowHarnessConfig
	wm       int64
	contents map[string]map[TimeWindow]sumAcc
	out      []string
	adds     int // records copied into windows
}

func (f *flinkAlignedWindows) cleanup(w TimeWindow) int64 {
	return addSat(w.MaxTimestamp(), f.c.lateness)
}

func (f *flinkAlignedWindows) add(key string, ts, v int64) {
	slide := f.c.slide
	if f.c.kind == "tumbling" {
		slide = f.c.size
	}
	skipped := true
	for s := windowStart(ts, f.c.offset, slide); s > ts-f.c.size; s -= slide {
		w := TimeWindow{Start: s, End: s + f.c.size}
		if f.cleanup(w) <= f.wm {
			continue
		}
		skipped = false
		if f.contents[key] == nil {
			f.contents[key] = map[TimeWindow]sumAcc{}
		}
		a := f.contents[key][w]
		a = sumAcc{Sum: a.Sum + v, N: a.N + 1}
		f.adds++
		f.contents[key][w] = a
		if w.MaxTimestamp() <= f.wm {
			f.out = append(f.out, fmt.Sprintf("fire %s %v sum=%d n=%d", key, w, a.Sum, a.N))
		}
	}
	if skipped {
		f.out = append(f.out, fmt.Sprintf("late %s %d", key, v))
	}
}

func (f *flinkAlignedWindows) watermark(wm int64) {
	if wm <= f.wm {
		return
	}
	for key, ws := range f.contents {
		for w, a := range ws {
			if w.MaxTimestamp() > f.wm && w.MaxTimestamp() <= wm {
				f.out = append(f.out, fmt.Sprintf("fire %s %v sum=%d n=%d", key, w, a.Sum, a.N))
			}
			if f.cleanup(w) <= wm {
				delete(ws, w)
			}
		}
	}
	f.wm = wm
}

// With records later than the watermark (some within the allowed
// lateness, some beyond it), tumbling and sliding event-time windows give,
// record by record, what Flink's copy-per-window operator gives: the same
// firings, the same late firings with the updated results, the same
// records on the late output; with one Add per record that is not late
// instead of one per window.
func TestAlignedWindowsWithLatenessEqualCopyingEachRecordIntoEveryWindow(t *testing.T) {
	const n, bound = 4000, 10
	keys := []string{"ann", "bob", "cyd"}
	cases := []windowHarnessConfig{
		{kind: "tumbling", size: 10, lateness: 15},
		{kind: "tumbling", size: 20, offset: 5, lateness: 0},
		{kind: "sliding", size: 30, slide: 10, lateness: 20},
		{kind: "sliding", size: 24, slide: 9, offset: 4, lateness: 7},
		{kind: "sliding", size: 60, slide: 1, lateness: 5},
	}
	for _, c := range cases {
		for _, rescale := range []bool{false, true} {
			c := c
			c.time, c.fn, c.late, c.parallelism, c.maxPar = "event", "sum", "side", 2, 16
			name := fmt.Sprintf("%s/size=%d,slide=%d,offset=%d,lateness=%d/rescale=%v", c.kind, c.size, c.slide, c.offset, c.lateness, rescale)
			t.Run(name, func(t *testing.T) {
				r := rand.New(rand.NewPCG(7, uint64(len(name))))
				in := outOfOrderInput(uint64(len(name)), n, keys, bound)
				for i := range in {
					if r.IntN(8) == 0 { // later than the watermark, by up to 12x the bound
						in[i].ts -= r.Int64N(12 * bound)
					}
				}
				h, err := newWindowHarness(t, c)
				if err != nil {
					t.Fatal(err)
				}
				ref := &flinkAlignedWindows{c: c, wm: math.MinInt64, contents: map[string]map[TimeWindow]sumAcc{}}
				var got []string
				take := func() {
					for _, l := range strings.Split(strings.TrimSpace(h.out.String()), "\n") {
						if l != "" {
							got = append(got, l)
						}
					}
					h.out.Reset()
				}
				maxTs, accepted := int64(math.MinInt64), 0
				for i, rec := range in {
					if rescale && i%1000 == 500 {
						if err := h.rescale(1 + i%3); err != nil {
							t.Fatal(err)
						}
					}
					lateBefore := h.late()
					if err := h.add(rec.key, rec.ts, rec.v); err != nil {
						t.Fatal(err)
					}
					if h.late() == lateBefore {
						accepted++
					}
					ref.add(rec.key, rec.ts, rec.v)
					maxTs = max(maxTs, rec.ts)
					if i%5 == 0 {
						if err := h.advance(true, maxTs-bound-1); err != nil {
							t.Fatal(err)
						}
						ref.watermark(maxTs - bound - 1)
					}
					take()
				}
				if err := h.advance(true, math.MaxInt64); err != nil {
					t.Fatal(err)
				}
				ref.watermark(math.MaxInt64)
				take()
				slices.Sort(got)
				slices.Sort(ref.out)
				if !slices.Equal(got, ref.out) {
					t.Fatalf("%d outputs, Flink's operator %d; first difference:\n%s", len(got), len(ref.out), firstDiff(got, ref.out))
				}
				lates := 0
				for _, l := range got {
					if strings.HasPrefix(l, "late ") {
						lates++
					}
				}
				if lates == 0 || int64(lates) != h.late() {
					t.Fatalf("%d late records out, %d counted (the input must have some)", lates, h.late())
				}
				if h.adds != accepted {
					t.Fatalf("Add called %d times for %d records not late", h.adds, accepted)
				}
				t.Logf("%d records (%d late): %d Add calls, %d Merge calls; copying into every window: %d Add calls",
					n, lates, h.adds, h.merges, ref.adds)
			})
		}
	}
}

// A checkpoint's window state is what the windows held when it was taken,
// although it is encoded later while records keep coming into the same
// windows (lists appended to, sessions merged, panes cleaned up), as the
// asynchronous part of a checkpoint does.
func TestWindowSnapshotIsTheStateWhenTakenWhateverChangesAfter(t *testing.T) {
	for _, c := range []windowHarnessConfig{
		{kind: "sliding", size: 30, slide: 10, lateness: 5},
		{kind: "session", gap: 15, lateness: 5},
	} {
		c.time, c.fn, c.late, c.parallelism, c.maxPar = "event", "list", "side", 1, 8
		t.Run(c.kind, func(t *testing.T) {
			in := outOfOrderInput(3, 2000, []string{"ann", "bob", "cyd"}, 10)
			h, err := newWindowHarness(t, c)
			if err != nil {
				t.Fatal(err)
			}
			dump := func(h *windowHarness) string {
				h.printState()
				s := h.out.String()
				h.out.Reset()
				return s
			}
			maxTs := int64(math.MinInt64)
			for i, r := range in {
				if i%400 == 200 {
					enc := h.subtasks[0].b.snapshot()
					event := maps.Clone(h.subtasks[0].timers.event)
					wm := h.subtasks[0].timers.wm
					want := dump(h)
					for _, r := range in[i : i+150] { // the same windows change
						if err := h.add(r.key, r.ts, r.v); err != nil {
							t.Fatal(err)
						}
					}
					if err := h.advance(true, maxTs); err != nil {
						t.Fatal(err)
					}
					h.out.Reset()
					restored, err := newWindowHarness(t, c)
					if err != nil {
						t.Fatal(err)
					}
					restored.keys = h.keys
					if err := restored.buildAt(1, encoded(t, enc), event, nil, wm, 0); err != nil {
						t.Fatal(err)
					}
					if got := dump(restored); got != want {
						t.Fatalf("snapshot taken at record %d restores\n%s\nwant\n%s", i, got, want)
					}
				}
				if err := h.add(r.key, r.ts, r.v); err != nil {
					t.Fatal(err)
				}
				maxTs = max(maxTs, r.ts)
				if i%5 == 0 {
					if err := h.advance(true, maxTs-11); err != nil {
						t.Fatal(err)
					}
				}
				h.out.Reset()
			}
		})
	}
}

// A reduce over sliding windows reduces each window's records in arrival
// order, as Flink's WindowOperator (one reducing state per window, each
// record added to every window it belongs to): with a function that is
// associative but not commutative, the last record to arrive, every
// window's result is its last record by arrival, whatever the panes, the
// out-of-order input, the time domain and a rescale in the middle.
func TestSlidingReduceWindowsReduceInArrivalOrder(t *testing.T) {
	const n, bound = 3000, 20
	keys := []string{"ann", "bob", "cyd"}
	for _, c := range []windowHarnessConfig{
		{kind: "sliding", size: 30, slide: 10},
		{kind: "sliding", size: 25, slide: 10, offset: 3},
		{kind: "sliding", size: 12, slide: 8},
	} {
		for _, tm := range []string{"event", "processing"} {
			for _, rescale := range []bool{false, true} {
				c := c
				c.time, c.fn, c.late, c.parallelism, c.maxPar = tm, "last", "side", 1, 16
				t.Run(fmt.Sprintf("size=%d,slide=%d,offset=%d/%s/rescale=%v", c.size, c.slide, c.offset, tm, rescale), func(t *testing.T) {
					in := outOfOrderInput(7, n, keys, bound)
					if tm == "processing" {
						slices.SortStableFunc(in, func(a, b windowInput) int { return cmpInt64(a.ts, b.ts) })
					}
					type kw struct {
						key string
						w   TimeWindow
					}
					last := map[kw]int64{}
					for _, r := range in {
						for s := windowStart(r.ts, c.offset, c.slide); s > r.ts-c.size; s -= c.slide {
							last[kw{r.key, TimeWindow{Start: s, End: s + c.size}}] = r.v
						}
					}
					var want []string
					for k, v := range last {
						want = append(want, fmt.Sprintf("fire %s %v last=%d", k.key, k.w, v))
					}
					slices.Sort(want)
					got := runWindowHarness(t, c, in, tm == "event", rescale, bound)
					if !slices.Equal(got, want) {
						t.Fatalf("%d firings, want %d; first difference:\n%s", len(got), len(want), firstDiff(got, want))
					}
				})
			}
		}
	}
}

// runWindowHarness feeds in to a harness of c (event time: a watermark of
// bound every 7 records; processing time: the clock at each record's ts),
// rescaling 1 -> 3 -> 2 subtasks with rescale, and returns every line,
// sorted, after the last watermark or the end of time.
func runWindowHarness(t *testing.T, c windowHarnessConfig, in []windowInput, event, rescale bool, bound int64) []string {
	t.Helper()
	h, err := newWindowHarness(t, c)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	maxTs := int64(math.MinInt64)
	for i, r := range in {
		if rescale && (i == len(in)/3 || i == 2*len(in)/3) {
			if err := h.rescale(map[bool]int{true: 3, false: 2}[i == len(in)/3]); err != nil {
				t.Fatal(err)
			}
		}
		if !event {
			if err := h.advance(false, r.ts); err != nil {
				t.Fatal(err)
			}
		}
		if err := h.add(r.key, r.ts, r.v); err != nil {
			t.Fatal(err)
		}
		maxTs = max(maxTs, r.ts)
		if event && i%7 == 0 {
			if err := h.advance(true, maxTs-bound-1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := h.advance(event, math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(h.out.String()), "\n") {
		if l != "" {
			got = append(got, l)
		}
	}
	slices.Sort(got)
	return got
}

// A sliding reduce restored from a checkpoint taken when it kept one
// accumulator per pane (before reduces went per window) turns each key's
// panes into its windows: with a commutative function (max) the results
// are those of the definition, record by record, and no pane is left in
// state once every window has fired and gone.
func TestSlidingReduceRestoredFromPanesFiresEveryWindowOfItsDefinition(t *testing.T) {
	const n, bound = 2000, 20
	keys := []string{"ann", "bob", "cyd", "dee"}
	for _, lateness := range []int64{0, 15} {
		t.Run(fmt.Sprintf("lateness=%d", lateness), func(t *testing.T) {
			c := windowHarnessConfig{kind: "sliding", size: 30, slide: 10, lateness: lateness, time: "event", fn: "max-panes", late: "side", parallelism: 1, maxPar: 8}
			in := outOfOrderInput(11, n, keys, bound)
			before, err := newWindowHarness(t, c)
			if err != nil {
				t.Fatal(err)
			}
			c.fn = "max"
			after, err := newWindowHarness(t, c)
			if err != nil {
				t.Fatal(err)
			}
			h := before
			maxTs := int64(math.MinInt64)
			for i, r := range in {
				if i == n/2 {
					st := before.subtasks[0]
					after.keys = before.keys
					if err := after.buildAt(1, encoded(t, st.b.snapshot()), st.timers.event, nil, st.timers.wm, 0); err != nil {
						t.Fatal(err)
					}
					h = after
				}
				if err := h.add(r.key, r.ts, r.v); err != nil {
					t.Fatal(err)
				}
				maxTs = max(maxTs, r.ts)
				if i%7 == 0 {
					if err := h.advance(true, maxTs-bound-1); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := h.advance(true, math.MaxInt64); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range strings.Split(before.out.String()+after.out.String(), "\n") {
				if l != "" && !strings.Contains(l, "late") {
					got = append(got, l)
				}
			}
			// The last firing of each window is its result (a late firing
			// repeats it with the records it gained).
			final := map[string]string{}
			var order []string
			for _, l := range got {
				f := strings.Fields(l) // fire key [s,e) max=v
				id := f[1] + " " + f[2]
				if _, ok := final[id]; !ok {
					order = append(order, id)
				}
				final[id] = l
			}
			got = got[:0]
			for _, id := range order {
				got = append(got, final[id])
			}
			slices.Sort(got)
			type kw struct {
				key string
				w   TimeWindow
			}
			mx := map[kw]int64{}
			for _, r := range in {
				for s := windowStart(r.ts, 0, c.slide); s > r.ts-c.size; s -= c.slide {
					k := kw{r.key, TimeWindow{Start: s, End: s + c.size}}
					if v, ok := mx[k]; !ok || r.v > v {
						mx[k] = r.v
					}
				}
			}
			var want []string
			for k, v := range mx {
				want = append(want, fmt.Sprintf("fire %s %v max=%d", k.key, k.w, v))
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("%d windows, want %d; first difference:\n%s", len(got), len(want), firstDiff(got, want))
			}
			if h.late() != 0 {
				t.Fatalf("%d late records (none is late within the bound)", h.late())
			}
			after.out.Reset()
			after.printState()
			for _, l := range strings.Split(strings.TrimSpace(after.out.String()), "\n") {
				if !strings.Contains(l, "state {}") || !strings.Contains(l, "event-timers []") {
					t.Fatalf("state left after the end of time: %s", l)
				}
			}
		})
	}
}
