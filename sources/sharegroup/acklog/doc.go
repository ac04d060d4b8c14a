// Package acklog owns the share-group ack-log: the one-partition, compacted
// Kafka topic per share group in which every exactly-once checkpoint writes,
// inside its Kafka transaction, an ack marker naming the offsets it will
// ACCEPT once that transaction commits (Weir's stand-in for KIP-1289's
// transactional acknowledgements).
//
// It provides the marker (its ranges, its binary encoding as a Kafka record,
// the topic name and topic creation) and the Index: a read_uncommitted reader
// of the ack-log that follows every marker's transaction to commit or abort
// through the control records, answers the redelivery lookup ("is this offset
// covered by a committed or still-open marker?"), runs the conflict check
// ("is an EARLIER marker of another transaction, open or committed,
// overlapping mine?": the first committed marker in log order wins), and
// proposes tombstones for markers that can no longer matter.
//
// It must not decide anything: it does not acknowledge share records, does
// not produce markers or tombstones (the caller produces the records it
// builds, in its own transaction), does not commit or abort transactions,
// and does not wait on open markers. It knows nothing of Weir's runtime,
// checkpoint coordinator or cluster, and imports no other Weir package.
package acklog
