package sharegroup

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/runtime"
)

// This file is the share-group source's watermark hold
// (docs/internals/event-time.md, the share-group rule 3). After a
// restart, records that consumers of the failed attempt held (a crashed
// process releases nothing) come back only once their locks lapse, behind
// records the restarted job read at once: without a hold, a watermark made
// from those later records would make every one of them late. So a restarted
// source emits no watermark (and is never idle) until those records can have
// come back and been emitted: the group's record-lock duration (plus the
// broker's lock sweep interval, when it reports one) after Open, and then
// until every lane of the subtask has fetched since. Share fetch acquires
// the lowest available offsets first, so a fetch after the locks lapsed
// acquires the redelivered records before any newer one of their
// partition; the subtask whose lane got them emits them before its hold
// ends, and the job's watermark, the minimum over the subtasks, cannot pass
// them before. A lane that releases records unprocessed (a lock too close
// to its expiry) holds the subtask's watermark again until every lane has
// fetched since.

// watermarkHold is a source subtask's hold: no watermark until until has
// passed and every lane fetched at or after it. Zero: no hold.
type watermarkHold struct {
	until  time.Time
	reason string
}

var _ runtime.WatermarkHolder = (*Source[int])(nil)

// lockDuration returns the group's record-lock duration: the larger of the
// group's share.record.lock.duration.ms (Kafka 4.2) and the brokers'
// group.share.record.lock.duration.ms, Kafka's default (30 s) when neither
// can be read.
func lockDuration(ctx context.Context, cl *kgo.Client, adm *kadm.Client, group string) time.Duration {
	ms := brokerIntConfig(ctx, adm, "group.share.record.lock.duration.ms", 30_000)
	if g := groupIntConfig(ctx, cl, group, "share.record.lock.duration.ms"); g > ms {
		ms = g
	}
	return time.Duration(ms) * time.Millisecond
}

// groupIntConfig reads an integer group config (DescribeConfigs, resource
// type GROUP), 0 when it cannot.
func groupIntConfig(ctx context.Context, cl *kgo.Client, group, key string) int {
	v, _, err := describeGroupConfig(ctx, cl, group, key)
	if err != nil || v == nil {
		return 0
	}
	n, err := strconv.Atoi(*v)
	if err != nil {
		return 0
	}
	return n
}

// holdAfterRestart starts the hold when this Open follows a failure (a
// restart, or a restore from a checkpoint): records of the failed attempt
// may still be locked by consumers that are gone.
func (s *Source[T]) holdAfterRestart(ctx context.Context, adm *kadm.Client, oc *runtime.OperatorContext) {
	if oc.Attempt == 0 && oc.RestoredFrom == 0 && len(oc.CommitHandles) == 0 {
		return
	}
	sweep := time.Duration(brokerIntConfig(ctx, adm, "share.record.lock.sweep.interval.ms", 0)) * time.Millisecond
	s.wmHold = watermarkHold{until: time.Now().Add(s.lockDur + sweep),
		reason: "records held before the restart come back once their locks lapse"}
	s.log.Info("holding the watermark until records in flight at the failure can have come back",
		zap.Duration("lock_duration", s.lockDur), zap.Duration("sweep_interval", sweep), zap.Time("until", s.wmHold.until))
}

// holdUntilRefetched holds the watermark until every lane has fetched after
// now (records released now are available at once). Task goroutine only.
func (s *Source[T]) holdUntilRefetched(now time.Time, reason string) {
	if now.After(s.wmHold.until) {
		s.wmHold = watermarkHold{until: now, reason: reason}
	}
}

// HoldWatermark implements runtime.WatermarkHolder: true while the hold
// lasts (see the top of this file).
func (s *Source[T]) HoldWatermark(now time.Time) bool {
	h := s.wmHold
	if h.until.IsZero() {
		return false
	}
	if now.Before(h.until) {
		return true
	}
	s.life.Lock()
	lanes, started := s.lanes, s.nextLane
	s.life.Unlock()
	if started < len(lanes) {
		return true
	}
	for _, l := range lanes {
		l.mu.Lock()
		// A batch acquired since, or nothing to read: two fetches sent
		// since were answered and the lane still waits for records (a
		// fetch that acquired records makes the lane ready long before
		// kgo's next fetch is answered).
		fetched := !l.admittedAt.IsZero() && !l.admittedAt.Before(h.until) ||
			l.state == laneIdle && l.fetches.fetchedTwiceSince(h.until)
		l.mu.Unlock()
		if !fetched {
			return true
		}
	}
	s.wmHold = watermarkHold{}
	s.log.Info("watermark hold over: every lane fetched since", zap.String("reason", h.reason), zap.Time("since", h.until))
	return false
}

// acquiredAt is when a batch was acquired, at the latest: a record's lock
// runs lock from its acquisition, and kgo dates its deadline from when it
// decoded the fetch (kgo may hand a poll a fetch sent long before it).
func acquiredAt(recs []*kgo.Record, lock time.Duration) time.Time {
	var at time.Time
	for _, r := range recs {
		if dl := r.AcquisitionDeadline(); !dl.IsZero() && (at.IsZero() || dl.Add(-lock).Before(at)) {
			at = dl.Add(-lock)
		}
	}
	return at
}
