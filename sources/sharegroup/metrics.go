package sharegroup

import (
	"strconv"
	"sync/atomic"

	"github.com/weirstream/weir/runtime"
)

// A share-group source's metrics (docs/metrics.md), registered through
// runtime.OperatorContext.Metrics: a task manager exposes them as
// weir_sharegroup_* with the labels job_id, operator and subtask.

// sourceCounters count what a source subtask did in this attempt.
type sourceCounters struct {
	deadLetters  atomic.Int64 // records copied to the dead-letter topic
	lapsed       atomic.Int64 // checkpoints declined because locks lapsed
	deduplicated atomic.Int64 // redeliveries the ack-log showed processed
	nearExpiry   atomic.Int64 // records released unprocessed: lock too close to expiry (or refused) at admission
}

// registerMetrics registers the subtask's metrics; the lanes exist.
func (s *Source[T]) registerMetrics(m runtime.Metrics) {
	m.Gauges("sharegroup_heldRecords", "Records the subtask holds (acquired, not yet acknowledged) per topic-partition, against the broker's cap weir_sharegroup_heldRecordsLimit.",
		"partition", func() map[string]float64 {
			out := map[string]float64{}
			for tp, n := range s.inFlight() {
				out[tp.Topic+"-"+strconv.Itoa(int(tp.Partition))] = float64(n)
			}
			return out
		})
	runtime.PendingRecordsMetric(m, "Flink's pendingRecords: records of the share group not yet done per topic-partition (log end offset minus the share partition's start offset), measured by the source's subtask 0 every 5s; the other subtasks report none.",
		"partition", func() map[string]float64 {
			pending := s.pendingRecords()
			if pending == nil {
				return nil
			}
			out := map[string]float64{}
			for tp, n := range pending {
				out[tp.Topic+"-"+strconv.Itoa(int(tp.Partition))] = float64(n)
			}
			return out
		})
	limit := float64(s.limit)
	m.Gauge("sharegroup_heldRecordsLimit", "The broker's cap on held records per share partition (group.share.partition.max.record.locks).",
		func() float64 { return limit })
	m.Gauge("sharegroup_setAsideRecords", "Delivered records the subtask holds aside because a still-open ack marker covers them.",
		func() float64 {
			n := 0
			for _, l := range s.lanes {
				l.mu.Lock()
				n += len(l.aside)
				l.mu.Unlock()
			}
			return float64(n)
		})
	m.Counter("sharegroup_deadLetters_total", "Records copied to the dead-letter topic (poison, undecodable, or re-queued too often).",
		func() float64 { return float64(s.counters.deadLetters.Load()) })
	m.Counter("sharegroup_lapsedLocks_total", "Checkpoints the subtask declined because a lane's record locks may have lapsed (its own clock, a refused renewal, or an offset acquired twice).",
		func() float64 { return float64(s.counters.lapsed.Load()) })
	m.Counter("sharegroup_redeliveriesDeduplicated_total", "Redelivered records the ack-log showed already processed: acknowledged, not emitted again.",
		func() float64 { return float64(s.counters.deduplicated.Load()) })
	m.Counter("sharegroup_releasedNearExpiry_total", "Records released unprocessed because, by the source's lock clock (renewals included), their lock had less than the margin left when they were admitted, or the broker had refused their partition's renewal before: each costs a delivery.",
		func() float64 { return float64(s.counters.nearExpiry.Load()) })
	if s.txn != nil {
		runtime.TransactionMetrics(m, func() int { return len(s.txn.Pending()) }, s.txn.LostTransactions)
	}
}
