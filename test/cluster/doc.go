// Package cluster holds tests of a whole Weir cluster in one process: a
// job manager and task managers talking gRPC and the data plane over
// loopback, as separate processes do, with jobs registered by the test. It
// has no code of its own: the tests live here because they need both
// jobmanager and taskmanager, which never import each other.
package cluster
