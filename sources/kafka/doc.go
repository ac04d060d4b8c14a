// Package kafka owns the replayable Kafka partition source (Flink's
// KafkaSource): each subtask reads the partitions a deterministic rule deals
// it (Owner), from offsets kept in the operator state of every checkpoint
// (one entry per partition, restored at any parallelism through the
// runtime's union redistribution, runtime.UnionStateSource), and emits each
// record tagged with its partition so that the runtime keeps a watermark per
// partition (runtime.SplitCollector). It reads read_committed only (set and
// verified), discovers new partitions and matching topics periodically,
// starts at the earliest, latest, a timestamp, the group's committed offsets
// or given offsets, and in bounded mode stops at the latest offsets at start,
// at given offsets or at a timestamp, ending its input so the job finishes.
// Offsets are committed to the consumer group on checkpoint completion for
// monitoring only: what is read on restore comes from the checkpoint alone.
// Undecodable (poison) records go to a dead-letter topic through
// internal/deadletter, the share-group source's code, inside a Kafka
// transaction per checkpoint (internal/kafkatxn).
//
// It is written like user code: against runtime's operator API and
// checkpoint's listener contracts only. It must not import jobmanager,
// taskmanager, a sink or the share-group source (sources/sharegroup), and
// must not assume the embedded broker: it must work against any Kafka broker.
package kafka
