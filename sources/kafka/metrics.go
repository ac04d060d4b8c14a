package kafka

import (
	"github.com/weirstream/weir/runtime"
)

// A Kafka partition source's metrics (docs/reference/metrics.md), in
// Flink's KafkaSource names, registered through
// runtime.OperatorContext.Metrics: a task manager exposes them as
// weir_kafka_* (and weir_pendingRecords) with the labels job_id, operator
// and subtask, per partition with the label partition ("topic-N").

// registerMetrics registers the subtask's metrics.
func (s *Source[T]) registerMetrics(m runtime.Metrics) {
	m.Gauges("kafka_currentOffset", "Flink's currentOffset: the position of the subtask in each partition it reads (the offset of the next record to read).",
		"partition", func() map[string]float64 {
			return s.eachPartition(func(ps *partition) (float64, bool) { return float64(ps.next.Load()), true })
		})
	m.Gauges("kafka_committedOffset", "Flink's committedOffset: the offset last committed to the consumer group (Group) for each partition, on checkpoint completion, for monitoring only.",
		"partition", func() map[string]float64 {
			return s.eachPartition(func(ps *partition) (float64, bool) {
				c := ps.committed.Load()
				return float64(c), c >= 0
			})
		})
	runtime.PendingRecordsMetric(m, "Flink's pendingRecords: records of each partition the subtask reads not yet read (the log end of the last fetch, its high watermark, minus currentOffset).",
		"partition", func() map[string]float64 {
			return s.eachPartition(func(ps *partition) (float64, bool) { return lag(ps) })
		})
	m.Gauge("kafka_records_lag_max", "Flink's records-lag-max: the largest pendingRecords over the subtask's partitions.",
		func() float64 {
			var hi float64
			for _, v := range s.eachPartition(func(ps *partition) (float64, bool) { return lag(ps) }) {
				hi = max(hi, v)
			}
			return hi
		})
	m.Counter("kafka_recordsSkipped_total", "Records skipped because a partition's position left the log (retention, truncation) and the source reset to the log start (OnOutOfRange(ResetToEarliest)); each reset is logged at error level.",
		func() float64 { return float64(s.skipped.Load()) })
	m.Counter("kafka_deadLetters_total", "Records that failed to decode, copied to the dead-letter topic.",
		func() float64 { return float64(s.deadLetters.Load()) })
	w := s.dlq
	runtime.TransactionMetrics(m, func() int { return len(w.Pending()) }, w.LostTransactions)
	m.Counter("kafka_commitsFailed_total", "Commits of checkpoint offsets to the consumer group that failed (monitoring only: what is read is unaffected).",
		func() float64 { return float64(s.commitFails.Load()) })
}

// lag is a partition's pendingRecords, unknown before its first fetch; a
// bounded partition's end is its stop offset at most.
func lag(ps *partition) (float64, bool) {
	end := ps.end.Load()
	if end < 0 {
		return 0, false
	}
	if ps.stop >= 0 {
		end = min(end, ps.stop)
	}
	return float64(max(0, end-ps.next.Load())), true
}

// eachPartition returns f of every partition the subtask reads, by label.
func (s *Source[T]) eachPartition(f func(*partition) (float64, bool)) map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]float64, len(s.parts))
	for k, ps := range s.parts {
		if v, ok := f(ps); ok {
			out[k.String()] = v
		}
	}
	return out
}
