// Package wordcount owns the exactly-once wordcount job: a source on the
// input topic (the share group, or with --set source=kafka the partition
// source; package examples/input builds either), words split with strings.Fields(strings.ToLower(line)),
// a keyed running count, and a transactional Kafka sink writing one record
// per word occurrence (key the word, value its running count in decimal) to
// the output topic, so that read_committed each word's values are exactly
// 1, 2, ..., n.
//
// It uses only what a Weir user may use: runtime's operator API and the
// public connectors (sources/sharegroup, sources/kafka, sinks/kafka). It must not import
// jobmanager, taskmanager or internal packages.
package wordcount
