package nexmark_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/runtime"
)

// The batch versions of the queries: plain loops and maps over the whole
// event list, written from each query's definition (docs/guide/nexmark.md).

func bidsOf(evs []nexmark.Event) []nexmark.Bid {
	var out []nexmark.Bid
	for _, e := range evs {
		if e.Type == nexmark.BidEvent {
			out = append(out, *e.Bid)
		}
	}
	return out
}

func batchQ0(evs []nexmark.Event) []any {
	var out []any
	for _, b := range bidsOf(evs) {
		out = append(out, b)
	}
	return out
}

func batchQ1(evs []nexmark.Event) []any {
	var out []any
	for _, b := range bidsOf(evs) {
		b.Price = b.Price * 908 / 1000
		out = append(out, b)
	}
	return out
}

func batchQ2(evs []nexmark.Event) []any {
	var out []any
	for _, b := range bidsOf(evs) {
		if b.Auction%123 == 0 {
			out = append(out, nexmark.Q2Result{Auction: b.Auction, Price: b.Price})
		}
	}
	return out
}

func batchQ3(evs []nexmark.Event) []any {
	sellers := map[int64]*nexmark.Person{}
	for _, e := range evs {
		if e.Type == nexmark.PersonEvent && (e.Person.State == "OR" || e.Person.State == "ID" || e.Person.State == "CA") {
			sellers[e.Person.ID] = e.Person
		}
	}
	var out []any
	for _, e := range evs {
		if e.Type == nexmark.AuctionEvent && e.Auction.Category == 10 {
			if p, ok := sellers[e.Auction.Seller]; ok {
				out = append(out, nexmark.Q3Result{Name: p.Name, City: p.City, State: p.State, Auction: e.Auction.ID})
			}
		}
	}
	return out
}

// batchQ4 is each category's count and sum of winning prices: an auction's
// winning price is its highest bid made between its start and its expiry.
func batchQ4(evs []nexmark.Event) map[int64][2]int64 {
	out := map[int64][2]int64{}
	bids := bidsOf(evs)
	for _, e := range evs {
		if e.Type != nexmark.AuctionEvent {
			continue
		}
		a := e.Auction
		best, found := int64(0), false
		for _, b := range bids {
			if b.Auction == a.ID && b.DateTime >= a.DateTime && b.DateTime <= a.Expires && (!found || b.Price > best) {
				best, found = b.Price, true
			}
		}
		if found {
			acc := out[a.Category]
			out[a.Category] = [2]int64{acc[0] + 1, acc[1] + best}
		}
	}
	return out
}

func batchQ5(evs []nexmark.Event) []any {
	size, slide := nexmark.Q5Size.Milliseconds(), nexmark.Q5Slide.Milliseconds()
	counts := map[int64]map[int64]int64{} // window start -> auction -> bids
	for _, b := range bidsOf(evs) {
		last := b.DateTime - b.DateTime%slide
		for start := last; start > b.DateTime-size; start -= slide {
			if counts[start] == nil {
				counts[start] = map[int64]int64{}
			}
			counts[start][b.Auction]++
		}
	}
	var out []any
	for start, byAuction := range counts {
		var most int64
		for _, n := range byAuction {
			most = max(most, n)
		}
		for a, n := range byAuction {
			if n == most {
				out = append(out, nexmark.Q5Result{Auction: a, Num: n, Start: start, End: start + size})
			}
		}
	}
	return out
}

func batchQ7(evs []nexmark.Event) []any {
	size := nexmark.Q7Size.Milliseconds()
	top := map[int64]int64{}
	bids := bidsOf(evs)
	for _, b := range bids {
		w := b.DateTime - b.DateTime%size
		top[w] = max(top[w], b.Price)
	}
	var out []any
	for _, b := range bids {
		w := b.DateTime - b.DateTime%size
		if b.Price == top[w] {
			out = append(out, nexmark.Q7Result{Auction: b.Auction, Price: b.Price, Bidder: b.Bidder, DateTime: b.DateTime, Extra: b.Extra, WindowEnd: w + size})
		}
	}
	return out
}

func batchQ8(evs []nexmark.Event) []any {
	size := nexmark.Q8Size.Milliseconds()
	type pw struct{ id, start int64 }
	sold := map[pw]bool{}
	for _, e := range evs {
		if e.Type == nexmark.AuctionEvent {
			sold[pw{e.Auction.Seller, e.Auction.DateTime - e.Auction.DateTime%size}] = true
		}
	}
	var out []any
	for _, e := range evs {
		if e.Type == nexmark.PersonEvent {
			start := e.Person.DateTime - e.Person.DateTime%size
			if sold[pw{e.Person.ID, start}] {
				out = append(out, nexmark.Q8Result{ID: e.Person.ID, Name: e.Person.Name, Start: start})
			}
		}
	}
	return out
}

func batchQ11(evs []nexmark.Event) []any {
	gap := nexmark.Q11Gap.Milliseconds()
	times := map[int64][]int64{}
	for _, b := range bidsOf(evs) {
		times[b.Bidder] = append(times[b.Bidder], b.DateTime)
	}
	var out []any
	for bidder, ts := range times {
		slices.Sort(ts)
		start, n := ts[0], int64(1)
		for i := 1; i <= len(ts); i++ {
			// A bid exactly a gap after the last one touches the session
			// and joins it: session windows [t, t+gap) merge when they
			// intersect or touch, as Flink's TimeWindow.intersects.
			if i == len(ts) || ts[i] > ts[i-1]+gap {
				out = append(out, nexmark.Q11Result{Bidder: bidder, Count: n, Start: start, End: ts[i-1] + gap})
				if i < len(ts) {
					start, n = ts[i], 0
				}
			}
			n++
		}
	}
	return out
}

func batchQ14(evs []nexmark.Event) []any {
	var out []any
	for _, b := range bidsOf(evs) {
		euros := 0.908 * float64(b.Price)
		if euros <= 1_000_000 || euros >= 50_000_000 {
			continue
		}
		kind := "otherTime"
		switch h := time.UnixMilli(b.DateTime).UTC().Hour(); {
		case 8 <= h && h <= 18:
			kind = "dayTime"
		case h <= 6 || 20 <= h:
			kind = "nightTime"
		}
		out = append(out, nexmark.Q14Result{Auction: b.Auction, Bidder: b.Bidder, Price: b.Price * 908 / 1000, BidTimeType: kind,
			DateTime: b.DateTime, Extra: b.Extra, CCounts: int64(strings.Count(b.Extra, "c"))})
	}
	return out
}

// runQuery runs the query on the generator in-process and returns every
// result its sink received.
func runQuery(t *testing.T, g *nexmark.Generator, query string, par int) []any {
	t.Helper()
	return runQueryOn(t, g, query, runtime.HeapState, par)
}

// runQueryOn is runQuery with the job's keyed state on backend (pebble
// under a budget of 16 MiB, the least allowed: the smallest caches, so that keys and timers
// go to pebble and back).
func runQueryOn(t *testing.T, g *nexmark.Generator, query string, backend runtime.StateBackendKind, par int) []any {
	t.Helper()
	j, events := nexmark.GeneratorJob("nexmark-"+query, g, runtime.DefaultParallelism(par), runtime.StateBackend(backend))
	var mu sync.Mutex
	var got []any
	if err := nexmark.AddQuery(query, events, nexmark.Sinks{Collect: func(v any) {
		mu.Lock()
		got = append(got, v)
		mu.Unlock()
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(50*time.Millisecond), runtime.StateMemoryLimit(16<<20)).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	return got
}

// sameRecords fails unless got and want hold the same records, each as
// many times (compared as JSON).
func sameRecords(t *testing.T, got, want []any) {
	t.Helper()
	count := map[string]int{}
	for _, w := range want {
		count[jsonOf(t, w)]++
	}
	for _, g := range got {
		count[jsonOf(t, g)]--
	}
	var missing, extra []string
	for k, n := range count {
		switch {
		case n > 0:
			missing = append(missing, fmt.Sprintf("%dx %s", n, k))
		case n < 0:
			extra = append(extra, fmt.Sprintf("%dx %s", -n, k))
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing)+len(extra) > 0 {
		t.Fatalf("%d results, the batch computation %d: %d missing (first %v), %d extra (first %v)",
			len(got), len(want), len(missing), first(missing), len(extra), first(extra))
	}
}

func first(s []string) []string { return s[:min(len(s), 3)] }

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkQ4 checks q4's changelog: per category, the counts 1, 2, ..., n in
// order (each winner once), every average its sum over its count, and the
// last sum and count the batch computation's.
func checkQ4(t *testing.T, got []any, want map[int64][2]int64) {
	t.Helper()
	last := map[int64]nexmark.Q4Result{}
	for _, v := range got {
		r := v.(nexmark.Q4Result)
		if prev := last[r.Category]; r.Count != prev.Count+1 || r.Avg != float64(r.Sum)/float64(r.Count) {
			t.Fatalf("category %d: %+v after %+v", r.Category, r, prev)
		}
		last[r.Category] = r
	}
	if len(last) != len(want) {
		t.Fatalf("%d categories, the batch computation %d", len(last), len(want))
	}
	for c, acc := range want {
		if r := last[c]; r.Count != acc[0] || r.Sum != acc[1] {
			t.Fatalf("category %d: %d winners summing %d, the batch computation %d summing %d", c, r.Count, r.Sum, acc[0], acc[1])
		}
	}
}

// Every query's output, run through the runtime with the generator source
// at parallelism 2, is the batch computation's, record by record: with the
// events in order, and with out-of-order groups (bids before their auction,
// auctions before their seller).
func TestQueriesMatchTheirBatchComputationRecordByRecord(t *testing.T) {
	batch := map[string]func([]nexmark.Event) []any{
		"q0": batchQ0, "q1": batchQ1, "q2": batchQ2, "q3": batchQ3, "q5": batchQ5, "q7": batchQ7, "q8": batchQ8, "q11": batchQ11, "q14": batchQ14,
	}
	for _, cfg := range []struct {
		name string
		c    nexmark.GeneratorConfig
	}{
		{"in order", nexmark.GeneratorConfig{Events: 10_000, Rate: 150}},
		{"out-of-order groups", nexmark.GeneratorConfig{Events: 10_000, Rate: 150, OutOfOrderGroup: 50}},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			g := newGen(t, cfg.c)
			evs := make([]nexmark.Event, cfg.c.Events)
			for i := range evs {
				evs[i] = g.Event(int64(i))
			}
			for _, q := range nexmark.Queries() {
				t.Run(q, func(t *testing.T) {
					got := runQuery(t, g, q, 2)
					if q == "q4" {
						checkQ4(t, got, batchQ4(evs))
						t.Logf("%d results", len(got))
						return
					}
					want := batch[q](evs)
					if len(want) == 0 {
						t.Fatalf("the batch computation of %s has no result: the test data proves nothing", q)
					}
					sameRecords(t, got, want)
					t.Logf("%d results, each once", len(got))
				})
			}
		})
	}
}

// The windowed queries on the pebble backend under the smallest caches, at
// volume, equal their batch computations record by record: q5's sliding
// windows (a new pane skips the timers its key's cached panes set; the
// rest are written without a read), q7's tumbling windows, q11's sessions,
// with out-of-order events, the caches at their bound and most timers
// beyond their key group's cached head.
func TestWindowedQueriesOnPebbleUnderSmallCachesMatchTheirBatchComputationAtVolume(t *testing.T) {
	cfg := nexmark.GeneratorConfig{Events: 200_000, Rate: 1000, OutOfOrderGroup: 50}
	g := newGen(t, cfg)
	evs := make([]nexmark.Event, cfg.Events)
	for i := range evs {
		evs[i] = g.Event(int64(i))
	}
	for q, batch := range map[string]func([]nexmark.Event) []any{"q5": batchQ5, "q7": batchQ7, "q11": batchQ11} {
		t.Run(q, func(t *testing.T) {
			want := batch(evs)
			if len(want) == 0 {
				t.Fatalf("the batch computation of %s has no result: the test data proves nothing", q)
			}
			got := runQueryOn(t, g, q, runtime.PebbleState, 2)
			sameRecords(t, got, want)
			t.Logf("%d results, each once", len(got))
		})
	}
}

// q14's kinds of hour, at their boundaries (UTC).
func TestQ14BidTimeTypeByHour(t *testing.T) {
	day := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		at   time.Duration
		want string
	}{
		{0, "nightTime"}, {6*time.Hour + 59*time.Minute, "nightTime"}, {7 * time.Hour, "otherTime"},
		{8 * time.Hour, "dayTime"}, {18*time.Hour + 59*time.Minute, "dayTime"}, {19 * time.Hour, "otherTime"},
		{20 * time.Hour, "nightTime"}, {23*time.Hour + 59*time.Minute, "nightTime"},
	} {
		if got := nexmark.Q14BidTimeType(day.Add(tc.at).UnixMilli()); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.at, got, tc.want)
		}
	}
}

// q3 with a state TTL far above the run's length (the q3-state-ttl
// parameter) joins exactly what q3 joins: the TTL's bookkeeping loses and
// adds nothing while the state is live.
func TestQ3WithAStateTTLMatchesTheBatchComputationWhileTheStateLives(t *testing.T) {
	c := nexmark.GeneratorConfig{Events: 10_000, Rate: 150, OutOfOrderGroup: 50}
	g := newGen(t, c)
	evs := make([]nexmark.Event, c.Events)
	for i := range evs {
		evs[i] = g.Event(int64(i))
	}
	j, events := nexmark.GeneratorJob("nexmark-q3-ttl", g, runtime.DefaultParallelism(2))
	var mu sync.Mutex
	var got []any
	runtime.SinkTo(nexmark.Q3WithStateTTL(time.Hour)(events), "results", runtime.SinkFunc(func(_ context.Context, r nexmark.Q3Result) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r)
		return nil
	}))
	if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(50*time.Millisecond)).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	sameRecords(t, got, batchQ3(evs))
}
