package runtime

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// sessionSide is one session window operator of the pebble session test:
// its backend, timers, operator and what it emitted.
type sessionSide struct {
	b      *keyedBackend[string]
	timers *harnessTimers
	op     *windowOperator[string, int64, []int64, string]
	out    []string
}

// newSessionSide declares a session window operator (gap 10 ms, allowed
// lateness 25 ms, every record kept in arrival order within a session) on
// b, with the timers and watermark given.
func newSessionSide(t *testing.T, b *keyedBackend[string], event map[harnessTimer]bool, wm int64) *sessionSide {
	t.Helper()
	s := &sessionSide{b: b}
	s.timers = &harnessTimers{scope: &b.scope, wm: wm, event: maps.Clone(event), proc: map[harnessTimer]bool{}}
	if s.timers.event == nil {
		s.timers.event = map[harnessTimer]bool{}
	}
	pf := ProcessWindowFunc[string, int64, string](func(ctx *WindowContext[string], els []int64, out Collector[string]) error {
		out.Collect(fmt.Sprintf("%s %v late=%v %v", ctx.Key, ctx.Window, ctx.Late, els))
		return nil
	})
	emit := func(_ TimeWindow, v string) error {
		s.out = append(s.out, v)
		return nil
	}
	late := func(v int64) error {
		s.out = append(s.out, fmt.Sprintf("late %s %d", b.scope.key, v))
		return nil
	}
	op, err := newWindowOperator(&StateRegistry[string]{b: b}, EventTimeSessionWindows(10*time.Millisecond), 25,
		processWindowFunc[string, int64, string](pf, Int64Codec(), true), s.timers, emit, late)
	if err != nil {
		t.Fatal(err)
	}
	s.op = op
	return s
}

func (s *sessionSide) scope(key string) {
	s.b.scope.setKey(key, int(hashString(key)%uint32(s.b.maxPar)))
}

func (s *sessionSide) add(t *testing.T, key string, ts, v int64) {
	t.Helper()
	s.scope(key)
	if err := s.op.processElement(key, ts, v); err != nil {
		t.Fatal(err)
	}
}

// watermark moves the watermark to wm, firing the due timers by time,
// then key.
func (s *sessionSide) watermark(t *testing.T, wm int64) {
	t.Helper()
	s.timers.wm = max(s.timers.wm, wm)
	for {
		tm, ok := nextTimer(s.timers.event, wm)
		if !ok {
			return
		}
		delete(s.timers.event, tm)
		s.scope(tm.key)
		if err := s.op.onTimer(tm.key, tm.ts, true); err != nil {
			t.Fatal(err)
		}
	}
}

// sessions is every key's sessions and their records.
func (s *sessionSide) sessions(keys []string) map[string]string {
	out := map[string]string{}
	for _, k := range keys {
		s.scope(k)
		if d := s.op.dumpState(); d != "" {
			out[k] = d
		}
	}
	return out
}

// Session windows on pebble, their map state cached under a bound far
// below the state (keys evicted and read back all the time, keys with
// more sessions than the cache holds per key), merge, fire, fire late and
// go exactly as on the heap: after every step the emitted results are
// equal, and every key's sessions (each with its records in order) are
// equal after a native checkpoint restored into a fresh instance and
// after a canonical snapshot restored on the heap and on pebble.
func TestSessionWindowsOnPebbleUnderATinyCacheEqualTheHeapThroughANativeAndACanonicalRestore(t *testing.T) {
	const maxPar, nkeys = 8, 400
	mem := testStateMemory(t)
	st, err := storage.Open(t.Context(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	openPebble := func(name string, handles []*checkpoint.NativeState) *keyedBackend[string] {
		p, err := mem.openInstanceFrom(t.Context(), name, maxPar, 0, maxPar, 1, st, handles)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.close() })
		// A cache bound far below the state: keys go and come back.
		p.cacheLimit = 4 << 10
		b := newKeyedBackend[string](DefaultCodec[string](), maxPar)
		b.usePebble(p)
		return b
	}
	heap := newSessionSide(t, newKeyedBackend[string](DefaultCodec[string](), maxPar), nil, math.MinInt64)
	peb := newSessionSide(t, openPebble("sessions", nil), nil, math.MinInt64)
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("bidder-%d", i)
	}
	rng := rand.New(rand.NewPCG(11, 37))
	var v, wm int64
	// round adds records at and ahead of the watermark: most keys get a
	// few records that open and merge sessions (some out of order, some
	// late), every tenth key many sessions apart, more than the cache
	// holds per key.
	round := func(sides ...*sessionSide) {
		for range 6 {
			for i, k := range keys {
				n := 1 + rng.IntN(3)
				if i%10 == 0 {
					n += 4
				}
				for range n {
					ts := wm - 40 + rng.Int64N(90)
					if i%10 == 0 {
						ts = wm + 20*rng.Int64N(mapCacheEntries+6)
					}
					v++
					for _, s := range sides {
						s.add(t, k, ts, v)
					}
				}
			}
			wm += 15
			for _, s := range sides {
				s.watermark(t, wm)
			}
			if got, want := strings.Join(sides[1].out, "\n"), strings.Join(sides[0].out, "\n"); got != want {
				t.Fatalf("at watermark %d pebble emitted\n%s\nwant\n%s", wm, got, want)
			}
		}
	}
	equalSessions := func(what string, got, want map[string]string) {
		t.Helper()
		if len(want) == 0 {
			t.Fatalf("%s: no sessions: the test checks nothing", what)
		}
		for _, k := range keys {
			if got[k] != want[k] {
				t.Fatalf("%s: %s holds %q; want %q", what, k, got[k], want[k])
			}
		}
	}

	round(heap, peb)
	if peb.b.pebble.cached == 0 {
		t.Fatal("nothing cached: the test checks nothing")
	}
	live := heap.sessions(keys)
	equalSessions("live", peb.sessions(keys), live)
	most := 0
	for _, d := range live {
		most = max(most, strings.Count(d, "="))
	}
	out := strings.Join(heap.out, "\n")
	if most <= mapCacheEntries || !strings.Contains(out, "late=true") || !strings.Contains(out, "late bidder") {
		t.Fatalf("at most %d sessions per key, late firings %v, late records %v: the test checks less than it says",
			most, strings.Contains(out, "late=true"), strings.Contains(out, "late bidder"))
	}
	// A native checkpoint, restored into a fresh instance that goes on.
	h, _, _ := nativeCheckpoint(t, st, nativeStates{b: peb.b}, "op#0", 1, nil)
	native := newSessionSide(t, openPebble("native", []*checkpoint.NativeState{h}), peb.timers.event, peb.timers.wm)
	equalSessions("native checkpoint", native.sessions(keys), heap.sessions(keys))
	heap.out, native.out = nil, nil
	round(heap, native)
	// A canonical snapshot, restored on the heap and on pebble.
	blobs := encoded(t, native.b.snapshot())
	fromBlobs := func(b *keyedBackend[string]) *sessionSide {
		for kg, blob := range blobs {
			if err := b.restoreKeyGroup(kg, blob); err != nil {
				t.Fatal(err)
			}
		}
		return newSessionSide(t, b, native.timers.event, native.timers.wm)
	}
	onHeap := fromBlobs(newKeyedBackend[string](DefaultCodec[string](), maxPar))
	onPebble := fromBlobs(openPebble("canonical", nil))
	want := heap.sessions(keys)
	equalSessions("canonical snapshot on the heap", onHeap.sessions(keys), want)
	equalSessions("canonical snapshot on pebble", onPebble.sessions(keys), want)
	// Every session left fires, the same on each.
	for _, s := range []*sessionSide{heap, native, onHeap, onPebble} {
		s.out = nil
		s.watermark(t, math.MaxInt64)
	}
	for what, s := range map[string]*sessionSide{"native": native, "canonical on the heap": onHeap, "canonical on pebble": onPebble} {
		if got, want := strings.Join(s.out, "\n"), strings.Join(heap.out, "\n"); got != want || len(heap.out) == 0 {
			t.Fatalf("%s fired\n%s\nwant\n%s", what, got, want)
		}
		if left := s.sessions(keys); len(left) != 0 {
			t.Fatalf("%s: sessions left after the last watermark: %v", what, left)
		}
	}
}
