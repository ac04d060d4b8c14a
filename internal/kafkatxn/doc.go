// Package kafkatxn owns what both Kafka connectors need for Kafka
// transactions: the per-checkpoint transactional writer (TxnWriter, a pool
// of transactional ids per subtask, pre-commit and commit by recorded
// handle), the raw EndTxn that commits or aborts a transaction by its handle
// from any client, recovery of a restored checkpoint's handles (commit, then
// abort lingering transactions of the writer's own ids), the checks of the
// transaction timeout against the brokers, and (package committed) the
// read_committed reader that verifies output.
//
// The Kafka sink (sinks/kafka) and the share-group source
// (sources/sharegroup, for its ack markers and dead letters) both import it;
// neither imports the other (docs/architecture.md, "Which package may
// import which"). It knows no operator, no runtime and no cluster: it deals
// in records, checkpoint ids and checkpoint.TxnHandle. It must not assume
// the embedded broker.
package kafkatxn
