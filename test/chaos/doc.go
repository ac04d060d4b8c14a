// Package chaos is Weir's chaos suite, in its tests: it builds streamctl,
// runs the embedded broker, a job manager and two task managers as real
// processes with TCP proxies (internal/chaosproxy) between them, runs the
// exactly-once wordcount and two exactly-once jobs chained through a topic
// (uppercase, then wordcount) with input arriving throughout, and injects
// one fault per round: a failpoint crash, a SIGKILL, a network partition
// (connections dropped or black-holed), a second fault during recovery, or
// a paused task manager (a zombie). Each round's output is verified record
// by record with an independent read_committed client.
//
// Modes and the summary are described in docs/guide/guarantees.md.
package chaos
