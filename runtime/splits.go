package runtime

// UnionState is implemented by a Source or Sink whose operator state is
// Flink's union list state: on restore every subtask gets every entry of
// every subtask of the operator in OperatorContext.Restored, at any
// parallelism (the same one included), and keeps what it needs; its
// snapshot holds only what the subtask itself owns. A source that deals
// its splits by a rule every subtask can compute (the Kafka partition
// source) uses it to find its splits' positions, whichever subtask wrote
// them. Without it entries are split over the subtasks (AssignState).
type UnionState interface {
	// UnionState marks the operator; it is never called.
	UnionState()
}

// SplitCollector is the Collector a source's Poll receives when the source
// has a WatermarkStrategy (it is a TimestampCollector too). A source that
// owns its splits (a Kafka partition read by one subtask) emits each record
// with its split (CollectFromSplit) and says which splits it reads
// (SetSplits); the runtime then keeps one WatermarkGenerator per split, as
// Flink does per split, and the subtask's watermark is the minimum over the
// splits that are not idle. A split is idle once it emitted nothing for the
// strategy's idleness timeout (time spent blocked downstream does not
// count); when every split is idle the subtask emits the largest watermark
// any split reached and is idle, and a subtask that reads no split is
// idle. A split that has emitted nothing yet holds the watermark back
// until it is idle; a split with records waiting in the source
// (SplitPending) is not idle. Without a strategy both methods only emit (or do
// nothing).
type SplitCollector[T any] interface {
	TimestampCollector[T]
	// CollectFromSplit emits v with event timestamp ts (as
	// CollectWithTimestamp) from split.
	CollectFromSplit(split string, v T, ts int64)
	// SetSplits declares every split the subtask reads now: a split
	// missing from it (finished, or moved) no longer counts, a new one
	// holds the watermark until it emits or is idle.
	SetSplits(splits []string)
	// SplitPending says split has records to read that the source has not
	// emitted yet (a Kafka partition's records fetched into the client
	// behind another partition's, or readable at the broker and not
	// fetched yet): its idleness clock restarts, as if it had emitted. A source that reads several splits calls it after each
	// Poll for each such split; otherwise a split that waits behind
	// another's backlog for longer than the idleness timeout is taken for
	// idle, the subtask's watermark moves to the others', and the split's
	// own records arrive late.
	SplitPending(split string)
}
