// Package sharegroup owns the Kafka share-group (KIP-932) source and the
// transactional-acknowledgement library: records acquired in a checkpoint's
// epoch stay unacknowledged until that checkpoint completes, an ack marker is
// written into the checkpoint's Kafka transaction (the ack-log), the conflict
// check (the first committed marker in log order wins) declines a checkpoint
// that holds records someone else processed, and the records are ACCEPTed
// after the commit or RELEASEd on abort. It also offers at-least-once and
// implicit (at-most-once) acknowledgement, and Session, the same
// transactional acknowledgement for plain Go programs without the framework.
// The ack-log itself (markers, index, conflict check) is package acklog.
// Source and Session read committed records only: they set
// share.isolation.level=read_committed on their group and check it
// (isolation.go). Its snapshots carry the lineage position (lineage.go), by
// which it refuses a restore of state behind the group's committed
// acknowledgements (share groups cannot rewind).
//
// It is written like user code: against runtime's operator API and
// checkpoint's listener contracts only. It must not import jobmanager or
// taskmanager, and must not assume the embedded broker: it must work against
// any broker with share groups (Apache Kafka 4.2+).
package sharegroup
