package nexmark

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
)

// The generator follows the published Nexmark generator specification (the
// Apache Beam Nexmark suite's GeneratorConfig, PersonGenerator,
// AuctionGenerator, BidGenerator and the nexmark-flink port of them): the
// proportions, id spaces, hot ratios, price distribution, field sizes,
// auction lengths and out-of-order groups below are theirs; the code and the
// pseudo-random numbers are Weir's own (a splitmix64 stream seeded by the
// event id, so event n is the same on every run and every parallelism; the
// values differ from the Java generators', their distributions do not).
const (
	// PersonProportion, AuctionProportion and BidProportion are the shares
	// of each event kind: out of every TotalProportion consecutive event
	// numbers, the first is a person, the next three auctions, the rest bids.
	PersonProportion  = 1
	AuctionProportion = 3
	BidProportion     = 46
	TotalProportion   = PersonProportion + AuctionProportion + BidProportion

	// FirstPersonID, FirstAuctionID and FirstCategoryID are the first ids.
	FirstPersonID   = 1000
	FirstAuctionID  = 1000
	FirstCategoryID = 10

	numCategories = 5
	// numActivePeople people are picked from when a random person is needed,
	// personIDLead ids beyond the newest one included (people who will join).
	numActivePeople = 1000
	personIDLead    = 10
	// numInFlightAuctions auctions are picked from for a random auction,
	// auctionIDLead beyond the newest.
	numInFlightAuctions = 100
	auctionIDLead       = 10
	// One in hotXRatio picks a random id, the others a hot one: the newest
	// id rounded down to a multiple of hotXDivisor.
	hotSellersRatio  = 4
	hotAuctionRatio  = 2
	hotBiddersRatio  = 4
	hotSellerDivisor = 100
	hotAuctionDiv    = 100
	hotBidderDivisor = 100
	// Average sizes in bytes the extra field pads each kind to.
	avgPersonBytes  = 200
	avgAuctionBytes = 500
	avgBidBytes     = 100
	// hotChannelsRatio: one bid in hotChannelsRatio gets a random channel,
	// the others one of hotChannels; channelsNumber random channels.
	hotChannelsRatio = 2
	channelsNumber   = 10_000
)

// EventType says which field of an Event is set.
type EventType int

// The event kinds.
const (
	PersonEvent  EventType = 0
	AuctionEvent EventType = 1
	BidEvent     EventType = 2
)

// Person is a new user of the auction site.
type Person struct {
	ID           int64  `json:"id"`
	Name         string `json:"name"`
	EmailAddress string `json:"emailAddress"`
	CreditCard   string `json:"creditCard"`
	City         string `json:"city"`
	State        string `json:"state"`
	DateTime     int64  `json:"dateTime"`
	Extra        string `json:"extra"`
}

// Auction is an item put up for auction by Seller until Expires.
type Auction struct {
	ID          int64  `json:"id"`
	ItemName    string `json:"itemName"`
	Description string `json:"description"`
	InitialBid  int64  `json:"initialBid"`
	Reserve     int64  `json:"reserve"`
	DateTime    int64  `json:"dateTime"`
	Expires     int64  `json:"expires"`
	Seller      int64  `json:"seller"`
	Category    int64  `json:"category"`
	Extra       string `json:"extra"`
}

// Bid is a bid of Bidder on Auction.
type Bid struct {
	Auction  int64  `json:"auction"`
	Bidder   int64  `json:"bidder"`
	Price    int64  `json:"price"`
	Channel  string `json:"channel"`
	URL      string `json:"url"`
	DateTime int64  `json:"dateTime"`
	Extra    string `json:"extra"`
}

// Event is one Nexmark event: exactly one of Person, Auction and Bid is
// set, as Type says. Times are epoch milliseconds. Its JSON is the shape
// nexmark-flink reads from Kafka ({"event_type":0,"person":{...},...}),
// with times as epoch milliseconds.
type Event struct {
	Type    EventType `json:"event_type"`
	Person  *Person   `json:"person,omitempty"`
	Auction *Auction  `json:"auction,omitempty"`
	Bid     *Bid      `json:"bid,omitempty"`
}

// Time is the event's time (its dateTime), epoch milliseconds.
func (e Event) Time() int64 {
	switch e.Type {
	case PersonEvent:
		return e.Person.DateTime
	case AuctionEvent:
		return e.Auction.DateTime
	}
	return e.Bid.DateTime
}

// GeneratorConfig says which events a Generator makes.
type GeneratorConfig struct {
	// Events is how many events there are (0: no end).
	Events int64
	// Rate is the events per second of event time: event n's time is
	// BaseTime + n/Rate seconds. It does not throttle anything.
	Rate int64
	// BaseTime is event 0's time, epoch milliseconds.
	BaseTime int64
	// OutOfOrderGroup, when above 1, permutes the event ids within each
	// group of that many consecutive events while their times stay in
	// order, as the reference generators' out-of-order groups do: an
	// auction's bids may then come before it.
	OutOfOrderGroup int64
}

// DefaultBaseTime is the default time of event 0: 2026-01-01T00:00:00Z.
const DefaultBaseTime = 1_767_225_600_000

// Generator makes Nexmark events from their number: Event(n) depends on
// the config and n only.
type Generator struct {
	cfg GeneratorConfig
}

// NewGenerator returns a generator for cfg; Rate must be positive.
func NewGenerator(cfg GeneratorConfig) (*Generator, error) {
	if cfg.Rate <= 0 {
		return nil, fmt.Errorf("nexmark: rate %d must be positive", cfg.Rate)
	}
	if cfg.Events < 0 {
		return nil, fmt.Errorf("nexmark: events %d must not be negative", cfg.Events)
	}
	return &Generator{cfg: cfg}, nil
}

// Config is the generator's configuration.
func (g *Generator) Config() GeneratorConfig { return g.cfg }

// Timestamp is the time of the n-th event (counting from 0).
func (g *Generator) Timestamp(n int64) int64 {
	// Whole microseconds per event, as the reference generators compute it.
	return g.cfg.BaseTime + n*(1_000_000/g.cfg.Rate)/1000
}

// eventID is the id (the number deciding kind and content) of the n-th
// event: n itself, or n permuted within its out-of-order group.
func (g *Generator) eventID(n int64) int64 {
	size := g.cfg.OutOfOrderGroup
	if size < 2 {
		return n
	}
	start := n / size * size
	// 953 is prime to every group size the generator is used with but
	// multiples of 953: fall back to no permutation there.
	if size%953 == 0 {
		return n
	}
	return start + n*953%size
}

// Event returns the n-th event (counting from 0).
func (g *Generator) Event(n int64) Event {
	id := g.eventID(n)
	ts := g.Timestamp(n)
	r := newRng(uint64(id))
	switch off := id % TotalProportion; {
	case off < PersonProportion:
		return Event{Type: PersonEvent, Person: g.person(id, ts, &r)}
	case off < PersonProportion+AuctionProportion:
		return Event{Type: AuctionEvent, Auction: g.auction(n, id, ts, &r)}
	}
	return Event{Type: BidEvent, Bid: g.bid(id, ts, &r)}
}

// lastBase0PersonID is the newest person id (from 0) at event id.
func lastBase0PersonID(id int64) int64 {
	epoch, off := id/TotalProportion, id%TotalProportion
	if off >= PersonProportion {
		off = PersonProportion - 1
	}
	return epoch*PersonProportion + off
}

// lastBase0AuctionID is the newest auction id (from 0) at event id.
func lastBase0AuctionID(id int64) int64 {
	epoch, off := id/TotalProportion, id%TotalProportion
	switch {
	case off < PersonProportion:
		epoch--
		off = AuctionProportion - 1
	case off >= PersonProportion+AuctionProportion:
		off = AuctionProportion - 1
	default:
		off -= PersonProportion
	}
	return epoch*AuctionProportion + off
}

// nextBase0PersonID picks a recent person, or one who will join soon.
func nextBase0PersonID(id int64, r *rng) int64 {
	people := lastBase0PersonID(id) + 1
	active := min(people, numActivePeople)
	return people - active + r.intn(active+personIDLead)
}

// nextBase0AuctionID picks an auction in flight, or one that will open soon.
func nextBase0AuctionID(id int64, r *rng) int64 {
	hi := lastBase0AuctionID(id)
	lo := max(hi-numInFlightAuctions, 0)
	return lo + r.intn(hi-lo+1+auctionIDLead)
}

// nextPrice is log-uniform between 1 and 10^6 dollars, in cents.
func nextPrice(r *rng) int64 {
	return int64(math.Round(math.Pow(10, r.float64()*6) * 100))
}

var (
	firstNames = []string{"Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"}
	lastNames  = []string{"Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"}
	usStates   = []string{"AZ", "CA", "ID", "OR", "WA", "WY"}
	usCities   = []string{"Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"}
	channels   = []string{"Google", "Facebook", "Baidu", "Apple"}
)

func (g *Generator) person(id, ts int64, r *rng) *Person {
	p := &Person{ID: lastBase0PersonID(id) + FirstPersonID, DateTime: ts}
	p.Name = firstNames[r.intn(int64(len(firstNames)))] + " " + lastNames[r.intn(int64(len(lastNames)))]
	p.EmailAddress = r.str(7) + "@" + r.str(5) + ".com"
	var cc []byte
	for i := range 4 {
		if i > 0 {
			cc = append(cc, ' ')
		}
		cc = fmt.Appendf(cc, "%04d", r.intn(10000))
	}
	p.CreditCard = string(cc)
	p.City = usCities[r.intn(int64(len(usCities)))]
	p.State = usStates[r.intn(int64(len(usStates)))]
	size := 8 + len(p.Name) + len(p.EmailAddress) + len(p.CreditCard) + len(p.City) + len(p.State)
	p.Extra = r.extra(size, avgPersonBytes)
	return p
}

func (g *Generator) auction(n, id, ts int64, r *rng) *Auction {
	a := &Auction{ID: lastBase0AuctionID(id) + FirstAuctionID, DateTime: ts}
	if r.intn(hotSellersRatio) > 0 {
		a.Seller = lastBase0PersonID(id) / hotSellerDivisor * hotSellerDivisor
	} else {
		a.Seller = nextBase0PersonID(id, r)
	}
	a.Seller += FirstPersonID
	a.Category = FirstCategoryID + r.intn(numCategories)
	a.InitialBid = nextPrice(r)
	a.Reserve = a.InitialBid + nextPrice(r)
	a.Expires = ts + g.auctionLength(n, ts, r)
	a.ItemName = r.str(20)
	a.Description = r.str(100)
	size := 8 + len(a.ItemName) + len(a.Description) + 8 + 8 + 8 + 8 + 8
	a.Extra = r.extra(size, avgAuctionBytes)
	return a
}

// auctionLength is a random length up to twice the event time in which
// numInFlightAuctions auctions are created, so about that many are open.
func (g *Generator) auctionLength(n, ts int64, r *rng) int64 {
	events := int64(numInFlightAuctions * TotalProportion / AuctionProportion)
	horizon := g.Timestamp(n+events) - ts
	return 1 + r.intn(max(horizon*2, 1))
}

func (g *Generator) bid(id, ts int64, r *rng) *Bid {
	b := &Bid{DateTime: ts}
	if r.intn(hotAuctionRatio) > 0 {
		b.Auction = lastBase0AuctionID(id) / hotAuctionDiv * hotAuctionDiv
	} else {
		b.Auction = nextBase0AuctionID(id, r)
	}
	b.Auction += FirstAuctionID
	if r.intn(hotBiddersRatio) > 0 {
		b.Bidder = lastBase0PersonID(id)/hotBidderDivisor*hotBidderDivisor + 1
	} else {
		b.Bidder = nextBase0PersonID(id, r)
	}
	b.Bidder += FirstPersonID
	b.Price = nextPrice(r)
	if r.intn(hotChannelsRatio) > 0 {
		i := r.intn(int64(len(channels)))
		b.Channel = channels[i]
		b.URL = "https://www.nexmark.com/" + channels[i] + "/item.htm?query=1"
	} else {
		c := r.intn(channelsNumber)
		b.Channel = "channel-" + strconv.FormatInt(c, 10)
		b.URL = "https://www.nexmark.com/" + r.str(5) + "/item.htm?query=1&channel_id=" + strconv.FormatInt(c, 10)
	}
	size := 8 + 8 + 8 + 8 + len(b.Channel) + len(b.URL)
	b.Extra = r.extra(size, avgBidBytes)
	return b
}

// rng is a splitmix64 stream: small, fast and seeded by the event id.
type rng struct{ s uint64 }

func newRng(seed uint64) rng {
	r := rng{s: seed ^ 0x6a09e667f3bcc909}
	r.next()
	return r
}

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn is uniform in [0, n); n > 0 (Lemire's multiply-shift reduction).
func (r *rng) intn(n int64) int64 {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int64(hi)
}

// float64 is uniform in [0, 1).
func (r *rng) float64() float64 { return float64(r.next()>>11) / (1 << 53) }

// str is a random string of 3 to maxLen-1 lowercase letters and spaces.
func (r *rng) str(maxLen int64) string {
	n := 3 + r.intn(maxLen-3)
	b := make([]byte, n)
	for i := range b {
		if r.intn(13) == 0 {
			b[i] = ' '
		} else {
			b[i] = byte('a' + r.intn(26))
		}
	}
	return string(b)
}

// exact is a random string of exactly n lowercase letters.
func (r *rng) exact(n int64) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.intn(26))
	}
	return string(b)
}

// extra pads a record of size bytes to avg bytes on average: a string of
// avg-size bytes, plus or minus 20%; nothing if the record is already
// larger.
func (r *rng) extra(size, avg int) string {
	if size > avg {
		return ""
	}
	want := int64(avg - size)
	delta := int64(math.Round(float64(want) * 0.2))
	return r.exact(want - delta + r.intn(2*delta+1))
}

// MarshalEvent is e as JSON (the Kafka value `streamctl nexmark generate`
// writes).
func MarshalEvent(e Event) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("nexmark: encode event: %w", err)
	}
	return b, nil
}

// ErrNotAnEvent is the cause of a value that is not a Nexmark event.
var ErrNotAnEvent = errors.New("not a nexmark event")

// UnmarshalEvent decodes a JSON event, checking that the field Type names
// is set.
func UnmarshalEvent(b []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrNotAnEvent, err)
	}
	ok := false
	switch e.Type {
	case PersonEvent:
		ok = e.Person != nil
	case AuctionEvent:
		ok = e.Auction != nil
	case BidEvent:
		ok = e.Bid != nil
	}
	if !ok {
		return Event{}, fmt.Errorf("%w: event_type %d without its object", ErrNotAnEvent, e.Type)
	}
	return e, nil
}
