package sharegroup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// This file is the core that the framework source's lanes and the plain-Go
// Session share: how close to a lock's expiry a record is at risk, the
// holder's own clock of a held batch's locks, and acknowledgements whose
// refusals are seen (docs/architecture.md, "Transactional acknowledgements").

// maxLockMargin caps the default lock margin.
const maxLockMargin = 5 * time.Second

// lockMargin returns how close to its lock's expiry a held record counts as
// lost: configured when set (a negative value switches the holder's own
// clock off, which only tests do), else a quarter of the lock duration, at
// most maxLockMargin. Records acquired with less than the margin left are
// released unprocessed, and an epoch whose locks may have lapsed by the
// holder's clock declines its checkpoint.
func lockMargin(configured, lockDur time.Duration) time.Duration {
	if configured != 0 {
		return configured
	}
	return min(maxLockMargin, lockDur/4)
}

// lockClock is, by the holder's own clock, until when the locks of one
// acquired batch hold. A renewal the broker accepted moves it; a refused
// acknowledgement (the broker refuses a partition's whole batch when one of
// its records is no longer held) marks the partition lost for good: its
// records count as lapsed and are never ACCEPTed by this holder.
type lockClock struct {
	dur       time.Duration // lock duration, from the earliest acquisition deadline
	until     time.Time     // earliest acquisition deadline, or last accepted renewal's start + dur
	byRenewal bool          // until is a renewal's: every held record's lock runs to it
	lost      map[acklog.TopicPartition]error
}

// newLockClock starts the clock of a batch acquired at now: every record's
// lock runs from its own acquisition, so the earliest deadline counts.
func newLockClock(recs []*kgo.Record, now time.Time) lockClock {
	var c lockClock
	for _, r := range recs {
		if dl := r.AcquisitionDeadline(); !dl.IsZero() && (c.until.IsZero() || dl.Before(c.until)) {
			c.until = dl
		}
	}
	if !c.until.IsZero() {
		c.dur = c.until.Sub(now)
	}
	return c
}

// renewed records a renewal, sent at start, that the broker accepted for
// every partition.
func (c *lockClock) renewed(start time.Time) {
	if c.dur > 0 {
		c.until, c.byRenewal = start.Add(c.dur), true
	}
}

// refuse marks partitions whose acknowledgement the broker refused.
func (c *lockClock) refuse(refused map[acklog.TopicPartition]error) {
	for tp, err := range refused {
		if c.lost == nil {
			c.lost = make(map[acklog.TopicPartition]error)
		}
		c.lost[tp] = err
	}
}

// isLost reports whether r's partition was refused.
func (c *lockClock) isLost(r *kgo.Record) bool {
	_, lost := c.lost[acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}]
	return lost
}

// lapsed reports why the batch's locks may be gone at now, or nil: a refused
// acknowledgement, or (margin >= 0) less than margin left by the clock.
func (c *lockClock) lapsed(now time.Time, margin time.Duration) error {
	if len(c.lost) > 0 {
		tps := make([]string, 0, len(c.lost))
		var errs []error
		for tp, err := range c.lost {
			tps = append(tps, tp.String())
			errs = append(errs, err)
		}
		slices.Sort(tps)
		return fmt.Errorf("the broker refused to acknowledge held records of %s: %w", strings.Join(tps, ", "), errors.Join(errs...))
	}
	if margin >= 0 && !c.until.IsZero() && now.Add(margin).After(c.until) {
		return fmt.Errorf("by its own clock the batch's locks may have expired (held until %s, margin %v)",
			c.until.Format(time.RFC3339Nano), margin)
	}
	return nil
}

// expiresSoon reports whether r's lock, by this clock, has less than
// margin left at now: such a record is not processed. Once a renewal of
// the batch was accepted, r's lock runs to the renewal's deadline (kgo's
// AcquisitionDeadline is the original fetch's and never moves); before,
// to r's own acquisition deadline.
func (c *lockClock) expiresSoon(r *kgo.Record, now time.Time, margin time.Duration) bool {
	dl := r.AcquisitionDeadline()
	if c.byRenewal {
		dl = c.until
	}
	return margin >= 0 && !dl.IsZero() && dl.Sub(now) < margin
}

// acker acknowledges through one share-consumer client and sees what the
// broker refused. kgo's FlushAcks returns nil when the broker refuses an
// acknowledgement; the per-partition outcome reaches only the client's
// kgo.ShareAckCallback, which must be acker.callback.
type acker struct {
	mu sync.Mutex // one flush at a time, so each outcome belongs to one flush

	rmu     sync.Mutex
	refused map[acklog.TopicPartition]error

	cl *kgo.Client // set once, right after the client is made
}

// callback is the client's kgo.ShareAckCallback.
func (a *acker) callback(_ *kgo.Client, rs kgo.ShareAckResults) {
	a.rmu.Lock()
	defer a.rmu.Unlock()
	for _, r := range rs {
		if r.Err == nil {
			continue
		}
		if a.refused == nil {
			a.refused = make(map[acklog.TopicPartition]error)
		}
		a.refused[acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}] = r.Err
	}
}

// ack marks recs with st (none: flush what is marked) and flushes, returning
// the partitions whose acknowledgement the broker refused, and the flush's
// own error (the outcome of what was not confirmed is unknown).
func (a *acker) ack(ctx context.Context, st kgo.AckStatus, recs ...*kgo.Record) (map[acklog.TopicPartition]error, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ackLocked(ctx, st, recs...)
}

// ackLocked is ack with a.mu held.
func (a *acker) ackLocked(ctx context.Context, st kgo.AckStatus, recs ...*kgo.Record) (map[acklog.TopicPartition]error, error) {
	a.rmu.Lock()
	a.refused = nil
	a.rmu.Unlock()
	if len(recs) > 0 {
		if st == kgo.AckRenew {
			for _, r := range recs {
				r.Ack(kgo.AckRenew)
			}
		} else {
			a.cl.MarkAcks(st, recs...)
		}
	}
	err := a.cl.FlushAcks(ctx)
	a.rmu.Lock()
	refused := a.refused
	a.refused = nil
	a.rmu.Unlock()
	return refused, err
}

// refusedErr joins refused partitions into one error (nil if none).
func refusedErr(refused map[acklog.TopicPartition]error) error {
	var errs []error
	for tp, err := range refused {
		errs = append(errs, fmt.Errorf("%s: %w", tp, err))
	}
	return errors.Join(errs...)
}

// abortStaleMarker aborts the transaction of an open ack marker that
// outstayed a wait, with a raw EndTxn carrying the marker's transactional id
// and producer id and the epoch the coordinator reports. If that
// transaction committed or ended meanwhile, the request fails (or finds
// nothing to abort) and the ack-log shows the outcome.
func abortStaleMarker(ctx context.Context, admin *kgo.Client, e acklog.Entry, waited time.Duration, log *zap.Logger) {
	id := e.Marker.TransactionalID
	log = log.With(zap.Int64("marker", e.Offset), zap.String("txn", id), zap.Int64("producer_id", e.Marker.ProducerID))
	if id == "" {
		log.Warn("an earlier overlapping ack marker stays open and names no transactional id; cannot abort it")
		return
	}
	ds, err := kadm.NewClient(admin).DescribeTransactions(ctx, id)
	var d kadm.DescribedTransaction
	if err == nil {
		var ok bool
		if d, ok = ds[id]; !ok {
			err = errors.New("not in the response")
		} else {
			err = d.Err
		}
	}
	if err != nil {
		log.Warn("describing the transaction of a stale ack marker failed", zap.Error(err))
		return
	}
	if d.State != "Ongoing" || (e.Marker.ProducerID != 0 && d.ProducerID != e.Marker.ProducerID) {
		log.Info("the transaction of a stale ack marker already ended", zap.String("state", d.State))
		return
	}
	h := checkpoint.TxnHandle{TransactionalID: id, ProducerID: d.ProducerID, Epoch: d.ProducerEpoch}
	if err := kafkatxn.EndTxn(ctx, admin, h, false); err != nil {
		log.Info("aborting the transaction of a stale ack marker failed (it may have ended)", zap.Error(err))
		return
	}
	log.Warn("aborted the stale transaction of an open ack marker", zap.Int16("epoch", d.ProducerEpoch), zap.Duration("waited", waited))
}
