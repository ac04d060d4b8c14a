// Package runtime is the core of Weir: the typed operator API (sources, map,
// flatMap, filter, keyBy, keyed process with state, sinks), the job graph and
// its chaining into tasks, task execution with bounded batched channels,
// aligned checkpoint barriers, keyed state split into key groups, codecs, and
// an in-process executor (the mini cluster).
//
// A job is code: a JobType registered by name in a Registry builds the same
// graph from (name, parameters) on every node.
//
// runtime knows no connector and no cluster. It uses package checkpoint for
// the listener contracts, snapshot types and the coordinator, and must never
// import jobmanager, taskmanager, sources or sinks.
package runtime
