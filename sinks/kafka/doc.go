// Package kafka owns Weir's transactional (two-phase commit) Kafka sink: on a
// checkpoint barrier it flushes, pre-commits its transaction and records the
// handle (transactional.id, producer id, epoch) in its snapshot; on
// notification it commits, idempotently; on abort or restore it commits the
// restored checkpoint's handles and aborts anything later.
//
// It is written like user code: against runtime's operator API and
// checkpoint's listener contracts only. It must not import jobmanager or
// taskmanager, and must not assume the embedded broker.
package kafka
