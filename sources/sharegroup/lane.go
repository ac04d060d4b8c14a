package sharegroup

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

type laneState uint8

const (
	laneIdle      laneState = iota // may poll (its poller is fetching)
	laneReady                      // a batch arrived, not yet admitted
	laneAdmitting                  // the task goroutine is sorting and emitting the batch
	laneHolding                    // batch emitted; waiting for its checkpoint
	laneParked                     // epoch finished; records set aside behind open markers still held
)

// asideRec is a delivered record covered by a still-open ack marker: not
// emitted, held (renewed, so no delivery is burnt) until that marker
// resolves: ACCEPTed if it committed, RELEASEd if it aborted.
type asideRec struct {
	r      *kgo.Record
	marker acklog.Entry // the covering marker, as first seen
}

// lane is one share-consumer client that holds at most one batch: kgo
// auto-accepts the previous poll's records on the next poll, so a lane polls
// again only once every record of its batch is acknowledged.
//
// Locking: ack.mu (one acknowledgement flush at a time) is taken before mu;
// mu is never held across emission or a broker round trip other than an
// acknowledgement flush, so back-pressure never stops renewals.
type lane struct {
	id   int
	name string
	cl   *kgo.Client
	ack  *acker

	mu       sync.Mutex
	state    laneState
	batch    []*kgo.Record // ready, not yet admitted
	fetchErr error
	epoch    checkpoint.ID // checkpoint covering the batch; 0 until assigned
	clock    lockClock     // of the batch's locks, by our clock
	renewed  time.Time     // last renewal attempt (or the acquisition)
	held     []*kgo.Record // acquired and not yet acknowledged: what renewals cover
	emitted  []*kgo.Record // ACCEPT on completion
	rejected []*kgo.Record // REJECT on completion (poison, undecodable)
	accepted []*kgo.Record // already processed (committed marker or watermark): ACCEPT
	aside    []asideRec
	perTP    map[acklog.TopicPartition]int // held records per partition, counted at admission

	wake chan struct{} // signals the poller that the lane is idle again
}

func newLane(id int, name string) *lane {
	return &lane{id: id, name: name, ack: &acker{}, wake: make(chan struct{}, 1)}
}

// run polls whenever the lane is idle and hands batches over through ready.
func (l *lane) run(ctx context.Context, batch int, ready chan<- *lane, acquired func(string, []*kgo.Record)) {
	for {
		fs := l.cl.PollRecords(ctx, batch)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		var recs []*kgo.Record
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.Canceled) && ferr == nil {
				ferr = err
			}
		})
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		if len(recs) == 0 && ferr == nil {
			continue
		}
		if acquired != nil {
			acquired(l.name, recs)
		}
		now := time.Now()
		l.mu.Lock()
		l.state, l.batch, l.fetchErr = laneReady, recs, ferr
		l.clock, l.renewed, l.held = newLockClock(recs, now), now, recs
		l.mu.Unlock()
		select {
		case ready <- l:
		case <-ctx.Done():
			return
		}
		select { // wait until finalized
		case <-l.wake:
		case <-ctx.Done():
			return
		}
	}
}

// offsets adds what the lane's marker must cover: emitted and rejected
// records (already-processed and set-aside ones are not this epoch's).
func (l *lane) offsets(into map[acklog.TopicPartition][]int64) {
	for _, rs := range [][]*kgo.Record{l.emitted, l.rejected} {
		for _, r := range rs {
			tp := acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}
			into[tp] = append(into[tp], r.Offset)
		}
	}
}

// count tallies the held records per topic-partition (once per batch: the
// in-flight window is read on every poll).
func (l *lane) count() {
	l.perTP = map[acklog.TopicPartition]int{}
	for _, r := range l.held {
		l.perTP[acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}]++
	}
}

// drop removes acknowledged records from held. l.mu is held.
func (l *lane) drop(done []*kgo.Record) {
	if len(done) == 0 {
		return
	}
	gone := make(map[*kgo.Record]bool, len(done))
	for _, r := range done {
		gone[r] = true
	}
	kept := l.held[:0:0]
	for _, r := range l.held {
		if !gone[r] {
			kept = append(kept, r)
		}
	}
	l.held = kept
}

// finish acknowledges the lane's epoch: ACCEPT emitted and already-processed
// records, REJECT poison, and resolve set-aside records by their marker's
// outcome (outcome returns 0 for a marker still open: the record stays held
// and the lane parks). Records of a partition whose acknowledgement the
// broker refused are not ACCEPTed: they are no longer ours. The lane polls
// again once nothing is held. It returns the partitions the broker refused
// and the flush error.
func (l *lane) finish(ctx context.Context, outcome func(acklog.Entry) kgo.AckStatus) (map[acklog.TopicPartition]error, error) {
	l.ack.mu.Lock()
	defer l.ack.mu.Unlock()
	l.mu.Lock()
	var accept, reject, release, done []*kgo.Record
	for _, rs := range [][]*kgo.Record{l.emitted, l.accepted} {
		for _, r := range rs {
			if !l.clock.isLost(r) {
				accept = append(accept, r)
			}
			done = append(done, r)
		}
	}
	for _, r := range l.rejected {
		if !l.clock.isLost(r) {
			reject = append(reject, r)
		}
		done = append(done, r)
	}
	var still []asideRec
	for _, a := range l.aside {
		switch st := outcome(a.marker); st {
		case 0:
			still = append(still, a)
		case kgo.AckAccept:
			accept = append(accept, a.r)
			done = append(done, a.r)
		default:
			release = append(release, a.r)
			done = append(done, a.r)
		}
	}
	l.emitted, l.accepted, l.rejected, l.aside, l.epoch = nil, nil, nil, still, 0
	l.drop(done)
	l.state = laneParked
	l.mu.Unlock()

	for st, rs := range map[kgo.AckStatus][]*kgo.Record{kgo.AckAccept: accept, kgo.AckReject: reject, kgo.AckRelease: release} {
		if len(rs) > 0 {
			l.cl.MarkAcks(st, rs...)
		}
	}
	refused, err := l.ack.ackLocked(ctx, 0)

	l.mu.Lock()
	defer l.mu.Unlock()
	l.clock.refuse(refused)
	if len(l.aside) == 0 {
		l.reset()
	}
	l.count()
	return refused, err
}

// reset makes the lane poll again. l.mu is held.
func (l *lane) reset() {
	l.state, l.batch, l.epoch, l.clock = laneIdle, nil, 0, lockClock{}
	l.held, l.emitted, l.rejected, l.accepted, l.aside, l.perTP = nil, nil, nil, nil, nil, nil
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// renew extends the locks of every record the lane holds (ready, being
// admitted, holding or parked), if due at now: every third of the lock
// duration. A renewal
// the broker refused for a partition marks it lost: its records count as
// lapsed and are never ACCEPTed by this lane.
func (l *lane) renew(ctx context.Context, now time.Time) error {
	l.ack.mu.Lock()
	defer l.ack.mu.Unlock()
	l.mu.Lock()
	due := l.state != laneIdle && l.clock.dur > 0 && len(l.held) > 0 && now.Sub(l.renewed) >= l.clock.dur/3
	held := l.held
	if due {
		l.renewed = now
	}
	l.mu.Unlock()
	if !due {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, max(l.clock.dur/2, time.Second))
	defer cancel()
	refused, err := l.ack.ackLocked(rctx, kgo.AckRenew, held...)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case len(refused) > 0:
		l.clock.refuse(refused)
		return refusedErr(refused)
	case err != nil:
		return err // unconfirmed: the clock does not move
	}
	l.clock.renewed(now)
	return nil
}
