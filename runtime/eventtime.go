package runtime

import "math"

// NoTimestamp is the event timestamp of a record that has none (Flink's
// Long.MIN_VALUE): a source that assigns none, or a processing-time timer's
// output.
const NoTimestamp int64 = math.MinInt64

// MinWatermark is the watermark of an input that has not announced one yet.
const MinWatermark int64 = math.MinInt64

// MaxWatermark is the final watermark: a bounded input emits it when it
// ends, so every event-time timer (and window) fires.
const MaxWatermark int64 = math.MaxInt64

// TimestampCollector is the Collector a source's Poll receives: a source
// that knows its records' event time (a Kafka record's timestamp) emits
// them with CollectWithTimestamp, in epoch milliseconds. Collect emits a
// record with NoTimestamp. A TimestampAssigner of the source's
// WatermarkStrategy sees the timestamp given here as its second argument.
type TimestampCollector[T any] interface {
	Collector[T]
	CollectWithTimestamp(v T, ts int64)
}

// recordTime is the event timestamp of the record a task is processing,
// shared by the operators of its chain and its output writers: the task
// sets it before it pushes a record into the chain, an output writer reads
// it when it buffers a record. So Map, Filter and FlatMap keep their
// input's timestamp at no cost, as in Flink, and an operator that emits
// with another timestamp (a timer's) sets it before it emits. One task
// goroutine reads and writes it.
type recordTime struct{ ts int64 }
