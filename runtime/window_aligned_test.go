package runtime

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// alignedHarness runs event-time tumbling windows of 10 ms with allowed
// lateness lat summing clicks (aligned windows, or the general path with
// general) in a harness of subtask sub of par restored from restore; each
// result and late record goes into out as a line with its timestamp.
func alignedHarness(t *testing.T, general bool, lat int64, sub, par int, restore []checkpoint.OperatorSnapshot, out *[]string) *OperatorHarness {
	t.Helper()
	j := NewJob("aligned", MaxParallelism(8))
	src := FromSource(j, "clicks", SliceSource([]click{}, 1))
	opts := []WindowOpt{AllowedLateness(time.Duration(lat) * time.Millisecond), LateOutput(NewOutputTag[click]("late"))}
	if general {
		opts = append(opts, generalWindows())
	}
	ws := Window(KeyBy(src, func(c click) string { return c.Key }, nil), TumblingEventTimeWindows(10*time.Millisecond), opts...)
	res := AggregateProcess(ws, "windows", AggregateFunction[click, sumAcc, sumAcc](clickSum{}),
		ProcessWindowFunc[string, sumAcc, string](func(ctx *WindowContext[string], rs []sumAcc, out Collector[string]) error {
			out.Collect(fmt.Sprintf("fire %s %v sum=%d n=%d late=%v wm=%d", ctx.Key, ctx.Window, rs[0].Sum, rs[0].N, ctx.Late, ctx.Watermark))
			return nil
		}), nil)
	h, err := NewOperatorHarness(t.Context(), res, HarnessConfig{Subtask: sub, Parallelism: par, Restore: restore,
		Output: func(v any, ts int64) { *out = append(*out, fmt.Sprintf("%v @%d", v, ts)) },
		Side:   func(tag string, v any, ts int64) { *out = append(*out, fmt.Sprintf("%s %+v @%d", tag, v, ts)) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// alignedRun is what one run of alignedHarness gives: every line out, and
// the keyed state (windows and timers) at the snapshot.
type alignedRun struct {
	out, state []string
}

// runAlignedWindows pushes cs[:cut] into one subtask (aligned windows or
// the general path), the watermark after each record the punctuated one
// of bound 20, snapshots it and restores the snapshot into par subtasks
// (restoredGeneral: on the general path), which take the watermark it had
// and then the rest of cs, and a final watermark.
func runAlignedWindows(t *testing.T, general, restoredGeneral bool, lat int64, cs []click, cut, par int) alignedRun {
	t.Helper()
	var r alignedRun
	hs := []*OperatorHarness{alignedHarness(t, general, lat, 0, 1, nil, &r.out)}
	g := &punctuatedWatermarks{bound: 20}
	wm := int64(MinWatermark)
	advance := func(to int64) {
		t.Helper()
		for _, h := range hs {
			if err := h.Watermark(t.Context(), to); err != nil {
				t.Fatal(err)
			}
		}
	}
	push := func(c click) {
		t.Helper()
		_, sub, _ := HarnessKeyGroup(hs[0], 0, c)
		if err := PushInput(hs[sub], 0, c, c.TS); err != nil {
			t.Fatal(err)
		}
		if w := g.next(c.TS); w > wm {
			wm = w
			advance(wm)
		}
	}
	for _, c := range cs[:cut] {
		push(c)
	}
	snap, err := hs[0].Snapshot(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := hs[0].KeyedState(func(s StateRecord) error {
		r.state = append(r.state, fmt.Sprintf("%d %s %v %v %v %+v", s.KeyGroup, s.State, s.Key, s.Namespace, s.Value, s.Timer))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(r.state)
	_ = hs[0].Close()
	hs = nil
	for sub := range par {
		hs = append(hs, alignedHarness(t, restoredGeneral, lat, sub, par, []checkpoint.OperatorSnapshot{snap}, &r.out))
	}
	advance(wm) // the sources' watermark again after a restore
	for _, c := range cs[cut:] {
		push(c)
	}
	advance(math.MaxInt64)
	slices.Sort(r.out)
	return r
}

// Aligned windows (a window's keys together, fired in one pass) emit what
// the general path (each key's windows and a timer per key and window)
// emits, result by result and late record by late record, with and
// without allowed lateness (20 ms: a window's cleanup time is another's
// fire time), and their snapshot holds the same windows and timers, so
// that a snapshot of either restores into the other at another
// parallelism with the same results: a window that fired before the
// snapshot does not fire again (only late records fire it), one that had
// not fires once.
func TestAlignedWindowsEmitAndSnapshotWhatTheGeneralPathDoes(t *testing.T) {
	for _, lat := range []int64{0, 20, 25} {
		for seed := range uint64(4) {
			cs := windowClicks(seed, 400, 20, true)
			cut := 150 + int(seed)*40
			want := runAlignedWindows(t, true, true, lat, cs, cut, 3)
			lateRecords := slices.ContainsFunc(want.out, func(l string) bool { return strings.HasPrefix(l, "late ") })
			lateFirings := slices.ContainsFunc(want.out, func(l string) bool { return strings.Contains(l, "late=true") })
			if len(want.out) < 100 || !lateRecords || (lat > 0 && !lateFirings) {
				t.Fatalf("lateness %d seed %d: the general path's %d lines lack late records or late firings", lat, seed, len(want.out))
			}
			for _, tc := range []struct {
				name              string
				general, restored bool
			}{{"aligned", false, false}, {"aligned-restored-general", false, true}, {"general-restored-aligned", true, false}} {
				got := runAlignedWindows(t, tc.general, tc.restored, lat, cs, cut, 3)
				if !slices.Equal(got.out, want.out) {
					t.Errorf("lateness %d seed %d %s: %d lines out, the general path %d; first difference: %s",
						lat, seed, tc.name, len(got.out), len(want.out), firstDiff(got.out, want.out))
				}
				if !slices.Equal(got.state, want.state) {
					t.Errorf("lateness %d seed %d %s: snapshot state differs from the general path's: %s",
						lat, seed, tc.name, firstDiff(got.state, want.state))
				}
			}
		}
	}
}

// Event-time tumbling windows register no timer per key and window: a
// window's keys fire in one pass when the watermark reaches its end (the
// general path registers a timer per key and window in the operator's
// timer queue, each inserted, ordered and fired on its own).
func TestTumblingEventTimeWindowsRegisterNoTimerPerKey(t *testing.T) {
	for _, tc := range []struct {
		name    string
		general bool
		timers  int
	}{{"aligned", false, 0}, {"general", true, 100}} {
		var out []string
		h := alignedHarness(t, tc.general, 0, 0, 1, nil, &out)
		for i := range 100 {
			if err := PushInput(h, 0, click{Key: fmt.Sprintf("k%d", i), TS: int64(i % 30), ID: i}, int64(i%30)); err != nil {
				t.Fatal(err)
			}
		}
		k, ok := h.inst.(*keyedInstance[string, click, string])
		if !ok {
			t.Fatalf("instance %T", h.inst)
		}
		dt := k.backend.timers.services[0].(*Timers[string, struct{}])
		if n := dt.Len(EventTime); n != tc.timers {
			t.Fatalf("%s: %d event-time timers registered for 100 keys' windows, want %d", tc.name, n, tc.timers)
		}
		if err := h.Watermark(t.Context(), math.MaxInt64); err != nil {
			t.Fatal(err)
		}
		if len(out) != 100 {
			t.Fatalf("%s: %d results for 100 key-windows", tc.name, len(out))
		}
	}
}

// A restore into aligned windows moves what the window store's codec
// decoded into the windows: the codec keeps no key (its index would hold
// every restored key's memory for the operator's life).
func TestAlignedWindowsRestoredKeepNothingInTheirCodec(t *testing.T) {
	var out []string
	h := alignedHarness(t, false, 0, 0, 1, nil, &out)
	for i := range 100 {
		if err := PushInput(h, 0, click{Key: fmt.Sprintf("k%d", i), TS: int64(i % 30), ID: i}, int64(i%30)); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := h.Snapshot(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	_ = h.Close()
	r := alignedHarness(t, false, 0, 0, 1, []checkpoint.OperatorSnapshot{snap}, &out)
	k, ok := r.inst.(*keyedInstance[string, click, string])
	if !ok {
		t.Fatalf("instance %T", r.inst)
	}
	found := false
	for _, s := range k.backend.states {
		a, ok := s.(*alignedWindows[string, sumAcc])
		if !ok {
			continue
		}
		found = true
		if n := len(a.codec.idx); n != 0 {
			t.Errorf("the codec's index holds %d keys after the restore, want none", n)
		}
		for kg, g := range a.codec.groups {
			if g != nil {
				t.Errorf("the codec holds key group %d after the restore", kg)
			}
		}
	}
	if !found {
		t.Fatalf("no aligned windows among the states %T", k.backend.states)
	}
	if err := r.Watermark(t.Context(), math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	if len(out) != 100 {
		t.Fatalf("%d results for 100 restored key-windows", len(out))
	}
}
