// Package weirtest is Weir's test kit for users' jobs, as Flink's operator
// test harnesses and Kafka Streams' TopologyTestDriver are for theirs.
//
// It owns two things:
//
//   - Operator harnesses (NewKeyedHarness, NewKeyedTwoInputHarness,
//     NewHarness) that drive one subtask of one operator on the test's
//     goroutine: records with event timestamps in, watermarks, a
//     processing-time clock the test sets (timers fire as it passes, with
//     no sleep), the main output and every side output collected with
//     their timestamps in order, keyed state and timers read by key, and
//     snapshots restored into a fresh harness, also as one subtask of
//     another parallelism. A harness runs the operator the runtime runs
//     (the instance a task makes from the job graph, through the seam
//     runtime.OperatorHarness), never a copy of it.
//   - A job kit (StartKafka, StartJob) that runs a whole runtime.Job on the
//     mini cluster against Weir's embedded Kafka broker in the test
//     process: topics, input (also in transactions, committed or aborted),
//     output read read_committed once a checkpoint committed it, the
//     exactly-once checks of the common output shapes (CheckRunningCounts,
//     CheckEachOnce), and failures to inject (a task failure, a restart of
//     the job from its latest checkpoint, a broker restart).
//
// It must not re-implement what the runtime does (operators, restore
// assignment, key groups: it calls the runtime's own code), must not be
// imported by any non-test package of Weir (a lint test enforces it), and
// must not sleep on the wall clock to make something happen: an operator
// harness is driven by the test's calls alone, and the job kit waits for
// events (a completed checkpoint, the job's end) within a deadline.
//
// Broadcast state has no harness yet (Weir has no broadcast state). Keyed
// state runs on the runtime's heap backend, the only one there is.
package weirtest
