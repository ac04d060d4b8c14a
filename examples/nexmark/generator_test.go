package nexmark_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/runtime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newGen(t *testing.T, c nexmark.GeneratorConfig) *nexmark.Generator {
	t.Helper()
	if c.Rate == 0 {
		c.Rate = 1000
	}
	if c.BaseTime == 0 {
		c.BaseTime = nexmark.DefaultBaseTime
	}
	g, err := nexmark.NewGenerator(c)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// The published shape of the stream: 1 person, 3 auctions, 46 bids in
// every 50 event numbers; ids from 1000; hot sellers, auctions and bidders;
// log-uniform prices; the published average sizes; event time from the
// event number and the rate.
func TestGeneratorFollowsTheNexmarkSpecification(t *testing.T) {
	const n = 50_000
	g := newGen(t, nexmark.GeneratorConfig{Events: n, Rate: 10_000})
	var persons, auctions, bids int
	var personBytes, auctionBytes, bidBytes int
	var hotAuction, hotBidder, hotSeller int
	var cheap, dear int // prices below $10, above $10000
	lastPerson, lastAuction := int64(999), int64(999)
	for i := range int64(n) {
		e := g.Event(i)
		if want := g.Config().BaseTime + i/10; e.Time() != want {
			t.Fatalf("event %d at %d, want %d (rate 10000/s)", i, e.Time(), want)
		}
		switch off := i % 50; {
		case off == 0:
			if e.Type != nexmark.PersonEvent {
				t.Fatalf("event %d: type %d, want a person", i, e.Type)
			}
			persons++
			p := e.Person
			if p.ID != lastPerson+1 {
				t.Fatalf("person %d after %d", p.ID, lastPerson)
			}
			lastPerson = p.ID
			personBytes += 8 + len(p.Name) + len(p.EmailAddress) + len(p.CreditCard) + len(p.City) + len(p.State) + len(p.Extra)
		case off < 4:
			if e.Type != nexmark.AuctionEvent {
				t.Fatalf("event %d: type %d, want an auction", i, e.Type)
			}
			auctions++
			a := e.Auction
			if a.ID != lastAuction+1 {
				t.Fatalf("auction %d after %d", a.ID, lastAuction)
			}
			lastAuction = a.ID
			if (a.Seller-1000)%100 == 0 {
				hotSeller++
			}
			if a.Category < 10 || a.Category > 14 || a.Expires <= a.DateTime || a.Reserve <= a.InitialBid {
				t.Fatalf("auction %+v", a)
			}
			auctionBytes += len(a.ItemName) + len(a.Description) + 40 + len(a.Extra)
		default:
			if e.Type != nexmark.BidEvent {
				t.Fatalf("event %d: type %d, want a bid", i, e.Type)
			}
			bids++
			b := e.Bid
			if b.Auction%100 == 0 {
				hotAuction++
			}
			if (b.Bidder-1000)%100 == 1 {
				hotBidder++
			}
			if b.Auction < 1000 || b.Auction > lastAuction+10 || b.Bidder < 1000 || b.Bidder > lastPerson+10 {
				t.Fatalf("bid %+v with newest auction %d and person %d", b, lastAuction, lastPerson)
			}
			switch {
			case b.Price < 100 || b.Price > 100_000_000:
				t.Fatalf("bid price %d outside [$1, $10^6]", b.Price)
			case b.Price < 1000:
				cheap++
			case b.Price > 1_000_000:
				dear++
			}
			bidBytes += 32 + len(b.Channel) + len(b.URL) + len(b.Extra)
		}
	}
	if persons != n/50 || auctions != 3*n/50 || bids != 46*n/50 {
		t.Fatalf("%d persons, %d auctions, %d bids", persons, auctions, bids)
	}
	near := func(what string, got, want, tol float64) {
		t.Helper()
		if got < want*(1-tol) || got > want*(1+tol) {
			t.Errorf("%s: %.3f, want %.3f ± %.0f%%", what, got, want, tol*100)
		}
	}
	near("average person size", float64(personBytes)/float64(persons), 200, 0.1)
	near("average auction size", float64(auctionBytes)/float64(auctions), 500, 0.1)
	near("average bid size", float64(bidBytes)/float64(bids), 100, 0.1)
	// Hot: 1 - 1/ratio of the picks, plus the random picks that hit one.
	near("bids on hot auctions", float64(hotAuction)/float64(bids), 0.5, 0.1)
	near("bids by hot bidders", float64(hotBidder)/float64(bids), 0.75, 0.1)
	near("auctions of hot sellers", float64(hotSeller)/float64(auctions), 0.75, 0.1)
	// Log-uniform over 6 decades: one decade is a sixth of the prices.
	near("prices below $10", float64(cheap)/float64(bids), 1.0/6, 0.1)
	near("prices above $10000", float64(dear)/float64(bids), 2.0/6, 0.1)
}

// Out-of-order groups permute the events within each group while their
// times stay in order.
func TestGeneratorOutOfOrderGroupsPermuteEventsWithinAGroup(t *testing.T) {
	const group = 100
	plain := newGen(t, nexmark.GeneratorConfig{})
	ooo := newGen(t, nexmark.GeneratorConfig{OutOfOrderGroup: group})
	moved := 0
	for start := int64(0); start < 10*group; start += group {
		want := map[string]int{}
		for i := start; i < start+group; i++ {
			want[contentOf(plain.Event(i))]++
		}
		for i := start; i < start+group; i++ {
			e := ooo.Event(i)
			if e.Time() != plain.Timestamp(i) {
				t.Fatalf("event %d at %d, want %d", i, e.Time(), plain.Timestamp(i))
			}
			c := contentOf(e)
			if want[c] == 0 {
				t.Fatalf("event %d of the permuted stream is not in its group: %s", i, c)
			}
			want[c]--
			if c != contentOf(plain.Event(i)) {
				moved++
			}
		}
	}
	if moved < 900 {
		t.Fatalf("only %d of 1000 events moved", moved)
	}
}

// contentOf is an event without its time.
func contentOf(e nexmark.Event) string {
	switch e.Type {
	case nexmark.PersonEvent:
		p := *e.Person
		p.DateTime = 0
		return fmt.Sprintf("%+v", p)
	case nexmark.AuctionEvent:
		a := *e.Auction
		a.Expires -= a.DateTime
		a.DateTime = 0
		return fmt.Sprintf("%+v", a)
	}
	b := *e.Bid
	b.DateTime = 0
	return fmt.Sprintf("%+v", b)
}

// Event n is the same whichever generator makes it, and a JSON round trip
// keeps it.
func TestGeneratorIsDeterministicAndItsJSONRoundTrips(t *testing.T) {
	a, b := newGen(t, nexmark.GeneratorConfig{OutOfOrderGroup: 7}), newGen(t, nexmark.GeneratorConfig{OutOfOrderGroup: 7})
	for _, n := range []int64{0, 1, 3, 4, 49, 50, 12345, 1 << 40} {
		ea, eb := a.Event(n), b.Event(n)
		if !reflect.DeepEqual(ea, eb) {
			t.Fatalf("event %d differs: %+v, %+v", n, ea, eb)
		}
		js, err := nexmark.MarshalEvent(ea)
		if err != nil {
			t.Fatal(err)
		}
		back, err := nexmark.UnmarshalEvent(js)
		if err != nil || !reflect.DeepEqual(back, ea) {
			t.Fatalf("event %d: %s decoded as %+v, %v", n, js, back, err)
		}
	}
	for _, bad := range []string{`not json`, `{"event_type":2}`, `{"event_type":0,"bid":{}}`, `{"event_type":7}`} {
		if _, err := nexmark.UnmarshalEvent([]byte(bad)); err == nil {
			t.Errorf("%s decoded as an event", bad)
		}
	}
}

// seenSink keeps the event numbers it wrote in its operator state (one
// entry each), so that a restored sink holds exactly the events written
// before the checkpoint; Close hands them to all.
type seenSink struct {
	oc   *runtime.OperatorContext
	g    *nexmark.Generator
	seen []int64
	last int64 // the last event time written in this run
	all  *seenAll
	// slow makes Write pause 1 ms every 500 events, so that a checkpoint
	// falls in the middle of the stream however fast the machine is.
	slow bool
}

type seenAll struct {
	mu       sync.Mutex
	seen     []int64
	restored int
	bad      []string
}

func (s *seenSink) Open(_ context.Context, oc *runtime.OperatorContext) error {
	s.oc = oc
	for _, e := range oc.Restored {
		n, k := binary.Varint(e)
		if k != len(e) {
			return fmt.Errorf("bad entry %x", e)
		}
		s.seen = append(s.seen, n)
	}
	s.all.mu.Lock()
	s.all.restored += len(oc.Restored)
	s.all.mu.Unlock()
	return nil
}

func (s *seenSink) Write(_ context.Context, e nexmark.Event) error {
	ts := s.oc.RecordTimestamp()
	n := ts - s.g.Config().BaseTime // rate 1000/s: event n at base + n ms
	if want := s.g.Event(n); !reflect.DeepEqual(e, want) || e.Time() != ts {
		s.all.mu.Lock()
		s.all.bad = append(s.all.bad, fmt.Sprintf("at %d: %+v, want %+v", ts, e, want))
		s.all.mu.Unlock()
	}
	if ts < s.last {
		s.all.mu.Lock()
		s.all.bad = append(s.all.bad, fmt.Sprintf("event time went back from %d to %d in one subtask", s.last, ts))
		s.all.mu.Unlock()
	}
	s.last = ts
	s.seen = append(s.seen, n)
	if s.slow && len(s.seen)%500 == 0 {
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (s *seenSink) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	var st runtime.OperatorState
	for _, n := range s.seen {
		st.Entries = append(st.Entries, binary.AppendVarint(nil, n))
	}
	return st, nil
}

func (s *seenSink) Close() error {
	s.all.mu.Lock()
	s.all.seen = append(s.all.seen, s.seen...)
	s.all.mu.Unlock()
	return nil
}

// A job cancelled after a checkpoint and restored from it at another
// parallelism emits every event exactly once overall: the source's
// progressions are dealt to the new subtasks, none lost, none repeated, and
// a subtask with several merges them so its event time never goes back.
func TestGeneratorSourceRestoredAtAnotherParallelismLosesAndRepeatsNoEvent(t *testing.T) {
	for _, tc := range []struct{ from, to int }{{2, 3}, {3, 1}, {1, 2}} {
		t.Run(fmt.Sprintf("%d to %d", tc.from, tc.to), func(t *testing.T) {
			const events = 40_000
			g := newGen(t, nexmark.GeneratorConfig{Events: events, Rate: 1000, OutOfOrderGroup: 5})
			dir := t.TempDir()
			build := func(par int, all *seenAll, slow bool) *runtime.Job {
				j, ev := nexmark.GeneratorJob("nexmark-rescale", g, runtime.DefaultParallelism(par))
				runtime.SinkTo(ev, "seen", func() runtime.Sink[nexmark.Event] { return &seenSink{g: g, all: all, slow: slow} })
				return j
			}
			// Run 1: cancelled once a checkpoint completed.
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			first := &seenAll{}
			_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(20*time.Millisecond), runtime.CheckpointDir(dir),
				runtime.OnCheckpointComplete(func(runtime.CheckpointEvent) { cancel() })).Run(ctx, build(tc.from, first, true))
			if err == nil {
				t.Fatal("run 1 ended before its first checkpoint: make it longer")
			}
			// Run 2: restored at another parallelism, to the end.
			second := &seenAll{}
			if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(20*time.Millisecond), runtime.CheckpointDir(dir)).
				Run(t.Context(), build(tc.to, second, false)); err != nil {
				t.Fatal(err)
			}
			if len(second.bad) > 0 {
				t.Fatalf("%d wrong events (content or order), first: %s", len(second.bad), second.bad[0])
			}
			if second.restored == 0 || second.restored >= events {
				t.Fatalf("run 2 restored %d events of %d: the test needs a checkpoint in the middle", second.restored, events)
			}
			count := make([]int, events)
			for _, n := range second.seen {
				if n < 0 || n >= events {
					t.Fatalf("event number %d out of range", n)
				}
				count[n]++
			}
			for n, c := range count {
				if c != 1 {
					t.Fatalf("event %d emitted %d times", n, c)
				}
			}
			t.Logf("%d events restored from run 1's checkpoint, %d emitted after the restore, each once", second.restored, events-second.restored)
		})
	}
}
