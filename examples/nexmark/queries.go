package nexmark

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/weirstream/weir/runtime"
)

// The queries, each built on the one stream of Nexmark events (all three
// kinds come from one source, so a join is a keyed operator on the tagged
// union: Flink's own window join is a keyed coGroup of a union too). Each
// query's definition is the Nexmark one (nexmark-flink's SQL, Beam's
// Query*.java where the SQL leaves a choice); docs/guide/nexmark.md states
// each precisely.

// Window sizes of the windowed queries, as nexmark-flink runs them.
const (
	Q5Size   = 10 * time.Second
	Q5Slide  = 2 * time.Second
	Q7Size   = 10 * time.Second
	Q8Size   = 10 * time.Second
	Q11Gap   = 10 * time.Second
	q2Modulo = 123
)

// Q3States are the states of q3's sellers.
var Q3States = []string{"OR", "ID", "CA"}

// Q3Category is the category of q3's auctions.
const Q3Category = FirstCategoryID

// Q2Result is an output of q2.
type Q2Result struct {
	Auction int64 `json:"auction"`
	Price   int64 `json:"price"`
}

// Q3Result is an output of q3: a seller and one of its auctions.
type Q3Result struct {
	Name    string `json:"name"`
	City    string `json:"city"`
	State   string `json:"state"`
	Auction int64  `json:"id"`
}

// Q4Result is an output of q4: after a new winning bid in Category, the
// number of closed auctions with a winner, the sum of their winning prices
// and their average.
type Q4Result struct {
	Category int64   `json:"category"`
	Count    int64   `json:"count"`
	Sum      int64   `json:"sum"`
	Avg      float64 `json:"avg"`
}

// Q5Result is an output of q5: an auction with the most bids in the sliding
// window [Start, End).
type Q5Result struct {
	Auction int64 `json:"auction"`
	Num     int64 `json:"num"`
	Start   int64 `json:"starttime"`
	End     int64 `json:"endtime"`
}

// Q7Result is an output of q7: a bid with the highest price of the tumbling
// window ending at WindowEnd.
type Q7Result struct {
	Auction   int64  `json:"auction"`
	Price     int64  `json:"price"`
	Bidder    int64  `json:"bidder"`
	DateTime  int64  `json:"dateTime"`
	Extra     string `json:"extra"`
	WindowEnd int64  `json:"windowEnd"`
}

// Q8Result is an output of q8: a person who joined and opened an auction in
// the same tumbling window starting at Start.
type Q8Result struct {
	ID    int64  `json:"id"`
	Name  string `json:"name"`
	Start int64  `json:"starttime"`
}

// Q11Result is an output of q11: a bidder's session of Count bids.
type Q11Result struct {
	Bidder int64 `json:"bidder"`
	Count  int64 `json:"bid_count"`
	Start  int64 `json:"starttime"`
	End    int64 `json:"endtime"`
}

// bids is the stream of bids.
func bids(events *runtime.Stream[Event]) *runtime.Stream[Bid] {
	return runtime.FlatMap(events, "bids", func(e Event, out runtime.Collector[Bid]) error {
		if e.Type == BidEvent {
			out.Collect(*e.Bid)
		}
		return nil
	})
}

// Q0 passes every bid through.
func Q0(events *runtime.Stream[Event]) *runtime.Stream[Bid] { return bids(events) }

// Q1Price converts a price in dollars to euros (0.908 dollars to the euro,
// nexmark-flink's rate), in whole cents rounded down.
func Q1Price(p int64) int64 { return p * 908 / 1000 }

// Q1 converts every bid's price to euros.
func Q1(events *runtime.Stream[Event]) *runtime.Stream[Bid] {
	return runtime.FlatMap(events, "q1", func(e Event, out runtime.Collector[Bid]) error {
		if e.Type == BidEvent {
			b := *e.Bid
			b.Price = Q1Price(b.Price)
			out.Collect(b)
		}
		return nil
	})
}

// Q2 keeps the bids on auctions whose id is a multiple of 123.
func Q2(events *runtime.Stream[Event]) *runtime.Stream[Q2Result] {
	return runtime.FlatMap(events, "q2", func(e Event, out runtime.Collector[Q2Result]) error {
		if e.Type == BidEvent && e.Bid.Auction%q2Modulo == 0 {
			out.Collect(Q2Result{Auction: e.Bid.Auction, Price: e.Bid.Price})
		}
		return nil
	})
}

// q3Side is one side of q3's join: a seller of Q3States (Person set) or an
// auction of Q3Category (Auction set), keyed by the person id.
type q3Side struct {
	Key     int64
	Person  *Person  `json:",omitempty"`
	Auction *Auction `json:",omitempty"`
}

// q3Sides selects q3's join inputs from an event.
func q3Sides(e Event, out runtime.Collector[q3Side]) error {
	switch {
	case e.Type == PersonEvent && slices.Contains(Q3States, e.Person.State):
		out.Collect(q3Side{Key: e.Person.ID, Person: e.Person})
	case e.Type == AuctionEvent && e.Auction.Category == Q3Category:
		out.Collect(q3Side{Key: e.Auction.Seller, Auction: e.Auction})
	}
	return nil
}

// Q3 joins each auction of category 10 with its seller when the seller lives
// in Oregon, Idaho or California: one result per such pair, whichever comes
// first (an unbounded inner join, as Flink's regular join).
func Q3(events *runtime.Stream[Event]) *runtime.Stream[Q3Result] { return Q3WithStateTTL(0)(events) }

// Q3WithStateTTL is Q3 whose join state (each seller, and the auctions
// waiting for their seller) lives ttl of processing time after it was
// last written (0: forever), as Flink runs q3 with a state TTL
// (table.exec.state.ttl): the unbounded join's state is bounded by what
// arrives within ttl, and a seller and an auction further apart than ttl
// no longer join.
func Q3WithStateTTL(ttl time.Duration) func(*runtime.Stream[Event]) *runtime.Stream[Q3Result] {
	return func(events *runtime.Stream[Event]) *runtime.Stream[Q3Result] {
		sides := runtime.FlatMap(events, "q3-select", q3Sides)
		keyed := runtime.KeyBy(sides, func(s q3Side) int64 { return s.Key }, runtime.Int64Codec())
		return runtime.Process(keyed, "q3-join", func() runtime.KeyedProcessFunction[int64, q3Side, Q3Result] { return &q3Join{ttl: ttl} })
	}
}

// q3Seller is what q3 keeps of a seller.
type q3Seller struct{ Name, City, State string }

// q3Join keeps per person id the seller (once seen) and the ids of its
// auctions seen before it.
type q3Join struct {
	ttl     time.Duration // 0: none
	seller  *runtime.ValueState[q3Seller]
	pending *runtime.ValueState[[]int64]
}

func (j *q3Join) Open(_ context.Context, st *runtime.StateRegistry[int64]) error {
	var opts []runtime.StateOpt
	if j.ttl > 0 {
		opts = append(opts, runtime.WithTTL(runtime.StateTTLConfig{TTL: j.ttl}))
	}
	var err error
	if j.seller, err = runtime.NewValueState[q3Seller](st, "seller", q3SellerCodec, opts...); err != nil {
		return err
	}
	j.pending, err = runtime.NewValueState[[]int64](st, "pending-auctions", int64sCodec, opts...)
	return err
}

func (j *q3Join) Process(_ int64, v q3Side, out runtime.Collector[Q3Result]) error {
	if v.Person != nil {
		s := q3Seller{Name: v.Person.Name, City: v.Person.City, State: v.Person.State}
		j.seller.Update(s)
		if ids, ok := j.pending.Value(); ok {
			for _, id := range ids {
				out.Collect(q3Joined(s, id))
			}
			j.pending.Clear()
		}
		return nil
	}
	if s, ok := j.seller.Value(); ok {
		out.Collect(q3Joined(s, v.Auction.ID))
		return nil
	}
	ids, _ := j.pending.Value()
	j.pending.Update(append(slices.Clip(ids), v.Auction.ID))
	return nil
}

func q3Joined(s q3Seller, auction int64) Q3Result {
	return Q3Result{Name: s.Name, City: s.City, State: s.State, Auction: auction}
}

// q4Side is one side of q4's join, keyed by auction id.
type q4Side struct {
	Key      int64
	Category int64 // an auction's
	Expires  int64 // an auction's; 0 for a bid
	Time     int64
	Price    int64 // a bid's
}

// q4Winner is an auction's winning price.
type q4Winner struct {
	Auction, Category, Price int64
}

// q4Sides selects q4's join inputs from an event.
func q4Sides(e Event, out runtime.Collector[q4Side]) error {
	switch e.Type {
	case AuctionEvent:
		a := e.Auction
		out.Collect(q4Side{Key: a.ID, Category: a.Category, Expires: a.Expires, Time: a.DateTime})
	case BidEvent:
		out.Collect(q4Side{Key: e.Bid.Auction, Time: e.Bid.DateTime, Price: e.Bid.Price})
	}
	return nil
}

// Q4 is the average winning price per category: an auction's winning price
// is its highest bid made between its start and its expiry (both included),
// known when the watermark passes the expiry; each new winner updates its
// category's count, sum and average.
func Q4(events *runtime.Stream[Event]) *runtime.Stream[Q4Result] {
	sides := runtime.FlatMap(events, "q4-select", q4Sides)
	keyed := runtime.KeyBy(sides, func(s q4Side) int64 { return s.Key }, runtime.Int64Codec())
	winners := runtime.ProcessKeyed(keyed, "q4-winners", func() runtime.KeyedProcessor[int64, q4Side, q4Winner] { return &q4Winners{} })
	byCat := runtime.KeyBy(winners, func(w q4Winner) int64 { return w.Category }, runtime.Int64Codec())
	return runtime.Process(byCat, "q4-average", func() runtime.KeyedProcessFunction[int64, q4Winner, Q4Result] { return &q4Average{} })
}

// q4Auction is an open auction in q4's state.
type q4Auction struct {
	Category, Start, Expires int64
	Max                      int64
	HasBid                   bool
}

// q4Bid is a bid that came before its auction.
type q4Bid struct{ Time, Price int64 }

// q4Winners keeps per auction id its auction (once seen) with its highest
// valid bid so far, and the bids seen before it. A timer at the expiry
// emits the winner; a timer at a waiting bid's time drops the bids no
// auction can take any more (an auction not yet seen by then starts after
// the watermark, so after them).
type q4Winners struct {
	auction *runtime.ValueState[q4Auction]
	early   *runtime.ValueState[[]q4Bid]
}

func (w *q4Winners) Open(_ context.Context, st *runtime.StateRegistry[int64]) error {
	var err error
	if w.auction, err = runtime.NewValueState[q4Auction](st, "auction", q4AuctionCodec); err != nil {
		return err
	}
	w.early, err = runtime.NewValueState[[]q4Bid](st, "early-bids", q4BidsCodec)
	return err
}

// take adds a bid to an open auction if it falls in its lifetime.
func (a *q4Auction) take(t, price int64) {
	if t >= a.Start && t <= a.Expires && (!a.HasBid || price > a.Max) {
		a.Max, a.HasBid = price, true
	}
}

func (w *q4Winners) ProcessElement(ctx *runtime.KeyedContext[int64], v q4Side, _ runtime.Collector[q4Winner]) error {
	if v.Expires != 0 {
		a := q4Auction{Category: v.Category, Start: v.Time, Expires: v.Expires}
		if bs, ok := w.early.Value(); ok {
			for _, b := range bs {
				a.take(b.Time, b.Price)
			}
			w.early.Clear()
		}
		w.auction.Update(a)
		ctx.TimerService().RegisterEventTimeTimer(a.Expires)
		return nil
	}
	if a, ok := w.auction.Value(); ok {
		a.take(v.Time, v.Price)
		w.auction.Update(a)
		return nil
	}
	bs, _ := w.early.Value()
	w.early.Update(append(slices.Clip(bs), q4Bid{Time: v.Time, Price: v.Price}))
	ctx.TimerService().RegisterEventTimeTimer(v.Time)
	return nil
}

func (w *q4Winners) OnTimer(ctx *runtime.KeyedContext[int64], ts int64, out runtime.Collector[q4Winner]) error {
	if a, ok := w.auction.Value(); ok {
		if ts >= a.Expires {
			if a.HasBid {
				out.Collect(q4Winner{Auction: ctx.Key(), Category: a.Category, Price: a.Max})
			}
			w.auction.Clear()
		}
		return nil
	}
	bs, ok := w.early.Value()
	if !ok {
		return nil
	}
	bs = slices.DeleteFunc(slices.Clone(bs), func(b q4Bid) bool { return b.Time <= ts })
	if len(bs) == 0 {
		w.early.Clear()
	} else {
		w.early.Update(bs)
	}
	return nil
}

// q4Average keeps each category's count and sum of winning prices.
type q4Average struct {
	acc *runtime.ValueState[[2]int64]
}

func (q *q4Average) Open(_ context.Context, st *runtime.StateRegistry[int64]) error {
	var err error
	q.acc, err = runtime.NewValueState[[2]int64](st, "count-sum", pairCodec)
	return err
}

func (q *q4Average) Process(cat int64, w q4Winner, out runtime.Collector[Q4Result]) error {
	acc, _ := q.acc.Value()
	acc[0]++
	acc[1] += w.Price
	q.acc.Update(acc)
	out.Collect(Q4Result{Category: cat, Count: acc[0], Sum: acc[1], Avg: float64(acc[1]) / float64(acc[0])})
	return nil
}

// countBids counts a window's bids.
type countBids struct{}

func (countBids) CreateAccumulator() int64                { return 0 }
func (countBids) Add(_ Bid, n int64) int64                { return n + 1 }
func (countBids) GetResult(n int64) int64                 { return n }
func (countBids) Merge(a, b int64) int64                  { return a + b }
func bidAuction(b Bid) int64                              { return b.Auction }
func bidBidder(b Bid) int64                               { return b.Bidder }
func q5Score(r Q5Result) int64                            { return r.Num }
func q5Window(r Q5Result) int64                           { return r.Start }
func q7Score(r Q7Result) int64                            { return r.Price }
func q7Window(r Q7Result) int64                           { return r.WindowEnd }
func windowStart(ctx *runtime.WindowContext[int64]) int64 { return ctx.Window.Start }

// Q5 is the hot items query: per sliding window of 10 s every 2 s, the
// auctions with the most bids (all of them on a tie).
func Q5(events *runtime.Stream[Event]) *runtime.Stream[Q5Result] {
	byAuction := runtime.KeyBy(bids(events), bidAuction, runtime.Int64Codec())
	windows := runtime.Window(byAuction, runtime.SlidingEventTimeWindows(Q5Size, Q5Slide))
	counts := runtime.AggregateProcess(windows, "q5-count", countBids{},
		runtime.ProcessWindowFunc[int64, int64, Q5Result](func(ctx *runtime.WindowContext[int64], n []int64, out runtime.Collector[Q5Result]) error {
			out.Collect(Q5Result{Auction: ctx.Key, Num: n[0], Start: ctx.Window.Start, End: ctx.Window.End})
			return nil
		}), runtime.Int64Codec())
	return topPerWindowOf(counts, "q5-top", q5Window, q5Score, q5ResultCodec)
}

// topPerWindowOf keeps, per window (window(v) identifies it), the records of
// the highest score (all of them on a tie) and emits them when the
// watermark passes the window: records are window results, whose
// timestamp is their window's last millisecond. codec encodes a record in
// state.
func topPerWindowOf[T any](s *runtime.Stream[T], name string, window, score func(T) int64, codec binCodec[T]) *runtime.Stream[T] {
	keyed := runtime.KeyBy(s, window, runtime.Int64Codec())
	top := sliceCodec(codec)
	return runtime.ProcessKeyed(keyed, name, func() runtime.KeyedProcessor[int64, T, T] { return &topPerWindow[T]{score: score, codec: top} })
}

type topPerWindow[T any] struct {
	score func(T) int64
	codec runtime.Codec[[]T]
	top   *runtime.ValueState[[]T]
}

func (p *topPerWindow[T]) Open(_ context.Context, st *runtime.StateRegistry[int64]) error {
	var err error
	p.top, err = runtime.NewValueState[[]T](st, "top", p.codec)
	return err
}

func (p *topPerWindow[T]) ProcessElement(ctx *runtime.KeyedContext[int64], v T, _ runtime.Collector[T]) error {
	top, ok := p.top.Value()
	switch {
	case !ok:
		ctx.TimerService().RegisterEventTimeTimer(ctx.Timestamp())
		top = []T{v}
	case p.score(v) > p.score(top[0]):
		top = []T{v}
	case p.score(v) == p.score(top[0]):
		top = append(slices.Clip(top), v)
	default:
		return nil
	}
	p.top.Update(top)
	return nil
}

func (p *topPerWindow[T]) OnTimer(_ *runtime.KeyedContext[int64], _ int64, out runtime.Collector[T]) error {
	top, _ := p.top.Value()
	for _, v := range top {
		out.Collect(v)
	}
	p.top.Clear()
	return nil
}

// q7Acc is the highest bids of an auction in a window.
type q7Acc struct {
	Bids []Bid
}

// topBids keeps the highest-priced bids (all of them on a tie).
type topBids struct{}

func (topBids) CreateAccumulator() q7Acc { return q7Acc{} }
func (topBids) Add(b Bid, acc q7Acc) q7Acc {
	switch {
	case len(acc.Bids) == 0 || b.Price > acc.Bids[0].Price:
		acc.Bids = []Bid{b}
	case b.Price == acc.Bids[0].Price:
		acc.Bids = append(slices.Clip(acc.Bids), b)
	}
	return acc
}
func (topBids) GetResult(acc q7Acc) q7Acc { return acc }
func (t topBids) Merge(a, b q7Acc) q7Acc {
	for _, x := range b.Bids {
		a = t.Add(x, a)
	}
	return a
}

// Q7 is the highest bid per tumbling window of 10 s: the bids of the
// window's highest price (all of them on a tie), computed per auction and
// then per window.
func Q7(events *runtime.Stream[Event]) *runtime.Stream[Q7Result] {
	byAuction := runtime.KeyBy(bids(events), bidAuction, runtime.Int64Codec())
	windows := runtime.Window(byAuction, runtime.TumblingEventTimeWindows(Q7Size))
	tops := runtime.AggregateProcess(windows, "q7-auction-max", topBids{},
		runtime.ProcessWindowFunc[int64, q7Acc, Q7Result](func(ctx *runtime.WindowContext[int64], accs []q7Acc, out runtime.Collector[Q7Result]) error {
			for _, b := range accs[0].Bids {
				out.Collect(Q7Result{Auction: b.Auction, Price: b.Price, Bidder: b.Bidder, DateTime: b.DateTime, Extra: b.Extra, WindowEnd: ctx.Window.End})
			}
			return nil
		}), q7AccCodec)
	return topPerWindowOf(tops, "q7-max", q7Window, q7Score, q7ResultCodec)
}

// q8Acc is what a person id's tumbling window holds: the person if they
// joined in it, and whether they opened an auction in it.
type q8Acc struct {
	Name      string
	Joined    bool
	Auctioned bool
}

// q8Side is one side of q8's window join, keyed by person id.
type q8Side struct {
	Key    int64
	Name   string
	Person bool
}

// q8Sides selects q8's join inputs from an event.
func q8Sides(e Event, out runtime.Collector[q8Side]) error {
	switch e.Type {
	case PersonEvent:
		out.Collect(q8Side{Key: e.Person.ID, Name: e.Person.Name, Person: true})
	case AuctionEvent:
		out.Collect(q8Side{Key: e.Auction.Seller})
	}
	return nil
}

// q8CoGroup is q8's window join as a coGroup aggregate.
type q8CoGroup struct{}

func (q8CoGroup) CreateAccumulator() q8Acc { return q8Acc{} }
func (q8CoGroup) Add(v q8Side, acc q8Acc) q8Acc {
	if v.Person {
		acc.Name, acc.Joined = v.Name, true
	} else {
		acc.Auctioned = true
	}
	return acc
}
func (q8CoGroup) GetResult(acc q8Acc) q8Acc { return acc }
func (q8CoGroup) Merge(a, b q8Acc) q8Acc {
	if b.Joined {
		a.Name, a.Joined = b.Name, true
	}
	a.Auctioned = a.Auctioned || b.Auctioned
	return a
}

// Q8 is the new users query: the people who joined and opened an auction in
// the same tumbling window of 10 s (a window join of persons and auctions on
// person id = seller).
func Q8(events *runtime.Stream[Event]) *runtime.Stream[Q8Result] {
	sides := runtime.FlatMap(events, "q8-select", q8Sides)
	keyed := runtime.KeyBy(sides, func(s q8Side) int64 { return s.Key }, runtime.Int64Codec())
	windows := runtime.Window(keyed, runtime.TumblingEventTimeWindows(Q8Size))
	return runtime.AggregateProcess(windows, "q8-join", q8CoGroup{},
		runtime.ProcessWindowFunc[int64, q8Acc, Q8Result](func(ctx *runtime.WindowContext[int64], accs []q8Acc, out runtime.Collector[Q8Result]) error {
			if a := accs[0]; a.Joined && a.Auctioned {
				out.Collect(Q8Result{ID: ctx.Key, Name: a.Name, Start: windowStart(ctx)})
			}
			return nil
		}), q8AccCodec)
}

// Q11 is the user sessions query: per bidder, the number of bids in each
// session with a gap of 10 s.
func Q11(events *runtime.Stream[Event]) *runtime.Stream[Q11Result] {
	byBidder := runtime.KeyBy(bids(events), bidBidder, runtime.Int64Codec())
	windows := runtime.Window(byBidder, runtime.EventTimeSessionWindows(Q11Gap))
	return runtime.AggregateProcess(windows, "q11-sessions", countBids{},
		runtime.ProcessWindowFunc[int64, int64, Q11Result](func(ctx *runtime.WindowContext[int64], n []int64, out runtime.Collector[Q11Result]) error {
			out.Collect(Q11Result{Bidder: ctx.Key, Count: n[0], Start: ctx.Window.Start, End: ctx.Window.End})
			return nil
		}), runtime.Int64Codec())
}

// Q14Result is an output of q14: a bid in a price range, its price in
// euros, the kind of hour it was made at and the number of 'c' in its
// extra field.
type Q14Result struct {
	Auction     int64  `json:"auction"`
	Bidder      int64  `json:"bidder"`
	Price       int64  `json:"price"`
	BidTimeType string `json:"bidTimeType"`
	DateTime    int64  `json:"dateTime"`
	Extra       string `json:"extra"`
	CCounts     int64  `json:"c_counts"`
}

// Q14BidTimeType is q14's kind of hour of an epoch-ms time, in UTC:
// dayTime from 8:00 to 18:59, nightTime up to 6:59 and from 20:00,
// otherTime else.
func Q14BidTimeType(ms int64) string {
	switch h := time.UnixMilli(ms).UTC().Hour(); {
	case h >= 8 && h <= 18:
		return "dayTime"
	case h <= 6 || h >= 20:
		return "nightTime"
	}
	return "otherTime"
}

// Q14 keeps the bids whose price in euros (0.908 dollars to the euro) is
// above 1,000,000 and below 50,000,000 cents, with their kind of hour and
// the count of 'c' in extra (nexmark-flink's q14, its UDF as a function).
func Q14(events *runtime.Stream[Event]) *runtime.Stream[Q14Result] {
	return runtime.FlatMap(events, "q14", func(e Event, out runtime.Collector[Q14Result]) error {
		if e.Type != BidEvent {
			return nil
		}
		b := e.Bid
		if p := b.Price * 908; p <= 1_000_000*1000 || p >= 50_000_000*1000 {
			return nil
		}
		out.Collect(Q14Result{Auction: b.Auction, Bidder: b.Bidder, Price: Q1Price(b.Price), BidTimeType: Q14BidTimeType(b.DateTime),
			DateTime: b.DateTime, Extra: b.Extra, CCounts: int64(strings.Count(b.Extra, "c"))})
		return nil
	})
}
