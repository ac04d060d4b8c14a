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
	laneIdle    laneState = iota // may poll (its poller is fetching)
	laneReady                    // a batch arrived, not yet emitted
	laneHolding                  // batch emitted; waiting for its checkpoint
)

// asideRec is a redelivered record covered by a still-open ack marker: not
// emitted, resolved when the lane finalizes.
type asideRec struct {
	r      *kgo.Record
	marker int64 // ack-log offset of the covering marker
}

// lane is one share-consumer client that holds at most one batch: kgo
// auto-accepts the previous poll's records on the next poll, so a lane polls
// again only once its batch is finalized.
type lane struct {
	id   int
	name string
	cl   *kgo.Client

	mu         sync.Mutex
	state      laneState
	batch      []*kgo.Record
	fetchErr   error
	epoch      checkpoint.ID // checkpoint covering the batch; 0 until assigned
	acquiredAt time.Time     // when the batch was polled or last renewed
	lockDur    time.Duration // from the batch's acquisition deadline
	emitted    []*kgo.Record // ACCEPT on completion
	rejected   []*kgo.Record // REJECT on completion (poison, undecodable)
	accepted   []*kgo.Record // already processed (committed marker): ACCEPT
	aside      []asideRec
	perTP      map[acklog.TopicPartition]int // held records per partition, counted at admission

	wake chan struct{} // signals the poller that the lane is idle again
}

func newLane(id int, name string, cl *kgo.Client) *lane {
	return &lane{id: id, name: name, cl: cl, wake: make(chan struct{}, 1)}
}

// run polls whenever the lane is idle and hands batches over through ready.
func (l *lane) run(ctx context.Context, batch int, ready chan<- *lane) {
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
		now := time.Now()
		l.mu.Lock()
		l.state, l.batch, l.fetchErr, l.acquiredAt = laneReady, recs, ferr, now
		l.lockDur = 0
		if len(recs) > 0 {
			l.lockDur = recs[0].AcquisitionDeadline().Sub(now)
		}
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

// offsets returns what the lane's marker must cover: emitted and rejected
// records (already-processed ones and set-aside ones are not this epoch's).
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
	for _, rs := range [][]*kgo.Record{l.emitted, l.rejected, l.accepted} {
		for _, r := range rs {
			l.perTP[acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}]++
		}
	}
	for _, a := range l.aside {
		l.perTP[acklog.TopicPartition{Topic: a.r.Topic, Partition: a.r.Partition}]++
	}
}

// lapsed reports whether, by the lane's own clock, its locks may have expired
// before now+margin.
func (l *lane) lapsed(now time.Time, margin time.Duration) bool {
	return l.lockDur > 0 && l.acquiredAt.Add(l.lockDur-margin).Before(now)
}

// finish acknowledges the lane's batch and makes it poll again: accept
// emitted and already-processed records, reject poison, and resolve records
// set aside by the outcome of their marker.
func (l *lane) finish(ctx context.Context, asideOutcome func(marker int64) kgo.AckStatus) error {
	if len(l.emitted) > 0 {
		l.cl.MarkAcks(kgo.AckAccept, l.emitted...)
	}
	if len(l.accepted) > 0 {
		l.cl.MarkAcks(kgo.AckAccept, l.accepted...)
	}
	if len(l.rejected) > 0 {
		l.cl.MarkAcks(kgo.AckReject, l.rejected...)
	}
	for _, a := range l.aside {
		l.cl.MarkAcks(asideOutcome(a.marker), a.r)
	}
	err := l.cl.FlushAcks(ctx)
	l.reset()
	return err
}

// renew extends the locks of every held record.
func (l *lane) renew(ctx context.Context, now time.Time) error {
	n := 0
	for _, rs := range [][]*kgo.Record{l.emitted, l.rejected, l.accepted} {
		for _, r := range rs {
			r.Ack(kgo.AckRenew)
			n++
		}
	}
	for _, a := range l.aside {
		a.r.Ack(kgo.AckRenew)
		n++
	}
	if n == 0 {
		return nil
	}
	if err := l.cl.FlushAcks(ctx); err != nil {
		return err
	}
	l.acquiredAt = now
	return nil
}

func (l *lane) reset() {
	l.state, l.batch, l.epoch = laneIdle, nil, 0
	l.emitted, l.rejected, l.accepted, l.aside, l.perTP = nil, nil, nil, nil, nil
	select {
	case l.wake <- struct{}{}:
	default:
	}
}
