package runtime

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The heap's timer queue fires what a sorted set of (timestamp, owner)
// fires, under random registrations, deletions (of live timers, absent ones,
// and timers deleted and registered again), firings that register more
// timers, and snapshots: each next is the earliest live timer at or before
// the bound, ties by owner, with its key group; its length is the set's;
// its snapshot holds each live timer once. Its buckets hold every live
// timer once, none is empty, and stale heap entries stay bounded.
func TestTimerQueueFiresAsASortedSetOfItsLiveTimers(t *testing.T) {
	for _, order := range []string{"encodings", "owners"} {
		for seed := range uint64(40) {
			t.Run(fmt.Sprint(order, seed), func(t *testing.T) {
				testTimerQueueAgainstASortedSet(t, seed, order == "owners")
			})
		}
	}
}

// testTimerQueueAgainstASortedSet runs one seed of the model test, the
// queue ordering ties by the owners' encodings or by comparing the owners
// (strings.Compare, the order of appendStringOwner's bytes).
func testTimerQueueAgainstASortedSet(t *testing.T, seed uint64, byOwner bool) {
	r := rand.New(rand.NewPCG(seed, 1))
	q := newTimerQueue(appendStringOwner)
	if byOwner {
		q.cmp = strings.Compare
	}
	model := map[timerID[string]]int{} // live timer -> key group
	kgOf := func(owner string) int { return int(owner[1]) % 4 }
	owners, times := 3+r.IntN(20), 2+r.IntN(12)
	randID := func() timerID[string] {
		return timerID[string]{ts: int64(r.IntN(times)), owner: fmt.Sprintf("o%02d", r.IntN(owners))}
	}
	register := func(id timerID[string]) {
		_, had := model[id]
		if got := q.register(kgOf(id.owner), id.owner, id.ts); got == had {
			t.Fatalf("register %v: %v, the model had it: %v", id, got, had)
		}
		model[id] = kgOf(id.owner)
	}
	var fired int64 = -1 // the bound of the last firing
	for step := range 400 {
		switch op := r.IntN(10); {
		case op < 5:
			id := randID()
			id.ts += fired + 1 // timers at or before a fired bound would fire at the next one
			register(id)
		case op < 8:
			id := randID()
			id.ts += fired + 1
			_, had := model[id]
			if got := q.remove(id.owner, id.ts); got != had {
				t.Fatalf("step %d: remove %v: %v, the model had it: %v", step, id, got, had)
			}
			delete(model, id)
		case op < 9:
			upTo := fired + 1 + int64(r.IntN(times))
			for {
				id, kg, ok := q.next(upTo)
				want, wantOK := earliest(model, upTo)
				if ok != wantOK || (ok && id != want) {
					t.Fatalf("step %d: next(%d) = %v %v, the model's %v %v", step, upTo, id, ok, want, wantOK)
				}
				if !ok {
					break
				}
				if kg != model[id] {
					t.Fatalf("step %d: %v fired in key group %d, registered in %d", step, id, kg, model[id])
				}
				delete(model, id)
				// A firing timer registers another, at its time or later.
				if r.IntN(4) == 0 {
					nid := timerID[string]{ts: id.ts + int64(r.IntN(3)), owner: fmt.Sprintf("o%02d", r.IntN(owners))}
					register(nid)
				}
			}
			fired = upTo
		default:
			live := q.live()
			got := map[timerID[string]]int{}
			for _, e := range live {
				if _, dup := got[e.id]; dup {
					t.Fatalf("step %d: the snapshot holds %v twice", step, e.id)
				}
				got[e.id] = int(e.kg)
			}
			if fmt.Sprint(got) != fmt.Sprint(model) {
				t.Fatalf("step %d: the snapshot holds %v, the model %v", step, got, model)
			}
		}
		if q.len() != len(model) {
			t.Fatalf("step %d: len %d, the model %d", step, q.len(), len(model))
		}
		checkTimerBuckets(t, step, q, len(model))
	}
}

// checkTimerBuckets checks q's buckets against the live timers' count: no
// bucket is empty, the buckets and the batch's rest hold every live timer
// once, each bucket's timestamp is in the heap, and stale heap entries do
// not outnumber the buckets by more than compactHeap lets them.
func checkTimerBuckets[T comparable](t *testing.T, step int, q *timerQueue[T], live int) {
	t.Helper()
	n := len(q.batch) - q.cur
	inHeap := map[int64]bool{}
	for _, ts := range q.heap {
		inHeap[ts] = true
	}
	for ts, b := range q.buckets {
		size := 1
		if b.set != nil {
			size = len(b.set)
		}
		if size == 0 {
			t.Fatalf("step %d: the bucket of %d is empty", step, ts)
		}
		if !inHeap[ts] {
			t.Fatalf("step %d: the bucket of %d is not in the heap", step, ts)
		}
		if q.firing() && ts == q.batchTS {
			t.Fatalf("step %d: a bucket of the batch's timestamp %d while it fires", step, ts)
		}
		n += size
	}
	if n != live {
		t.Fatalf("step %d: the buckets and the batch hold %d timers, %d are live", step, n, live)
	}
	if stale := len(q.heap) - len(q.buckets); stale > 64 && stale > len(q.buckets)+1 {
		t.Fatalf("step %d: %d stale heap entries for %d buckets", step, stale, len(q.buckets))
	}
}

// earliest is the model's next timer at or before upTo.
func earliest(model map[timerID[string]]int, upTo int64) (timerID[string], bool) {
	var ids []timerID[string]
	for id := range model {
		if id.ts <= upTo {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return timerID[string]{}, false
	}
	return slices.MinFunc(ids, func(a, b timerID[string]) int {
		return cmp.Or(cmp.Compare(a.ts, b.ts), cmp.Compare(a.owner, b.owner))
	}), true
}

// A timer costs the queue one operation on a set: its insert into its
// timestamp's bucket when registered (which also tells whether it was
// there); firing it costs none, its bucket being taken out whole (before:
// two, the insert and a delete from one set of every timer when it fired;
// before that 13,505 operations for these 2,000 timers). A registration
// of a timer that exists costs one.
func TestTimerQueueProbesItsSetOncePerTimer(t *testing.T) {
	q := newTimerQueue(appendStringOwner)
	const keys, windows = 500, 4
	for w := range int64(windows) {
		for k := range keys {
			q.register(k%128, fmt.Sprintf("k%d", k), 1000*w+999)
		}
	}
	q.register(0, "k0", 999) // there already
	for {
		if _, _, ok := q.next(1 << 40); !ok {
			break
		}
	}
	if want := keys*windows + 1; q.probes != want {
		t.Fatalf("%d timers registered and fired took %d operations on the set, want %d", keys*windows, q.probes, want)
	}
}

// Firing a timer allocates nothing on the heap backend: the firing timer
// handed to OnTimer is reused from timer to timer (it was a new object per
// timer, one allocation per key and window in a window job).
func TestFiringHeapTimersAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	kb := newKeyedBackend[string](StringCodec(), 128)
	tm, err := NewTimers[struct{}](&StateRegistry[string]{b: kb}, "", Codec[struct{}](voidCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	fired := 0
	kb.timers.onTimer = func(*firingTimer) error { fired++; return nil }
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	var wm int64
	allocs := testing.AllocsPerRun(5, func() {
		wm += 10
		for i, k := range keys {
			kb.scope.setKey(k, i%128)
			tm.RegisterEventTimeTimer(struct{}{}, wm)
		}
		if err := kb.timers.advanceWatermark(wm); err != nil {
			t.Fatal(err)
		}
	})
	if fired != 6*len(keys) {
		t.Fatalf("%d timers fired, want %d", fired, 6*len(keys))
	}
	if allocs > 2 {
		t.Fatalf("registering and firing %d timers allocated %.0f times", len(keys), allocs)
	}
}
