// Package jobmanager owns the control side of a Weir cluster: the job store
// and checkpoint store (pebble under the data directory, or, highly
// available, etcd and the shared checkpoint storage, behind the same two
// interfaces), the scheduler that deploys a job's tasks into task manager
// slots, the checkpoint driver around checkpoint's coordinator (trigger,
// collect acks, persist the completed checkpoint, then notify), failover
// (restart from the latest completed checkpoint, committing its handles and
// aborting later ones before any source reads), leadership among the job
// managers of a highly available cluster (a standby serves only who leads;
// a leader that loses its leadership suspends its jobs), and the REST API.
//
// It must not import taskmanager: the two share only the RPC contract in
// internal. It must not import sources or sinks: connectors reach it only
// through runtime's operator API and checkpoint's listener contracts. Its
// correctness must never depend on a checkpoint notification arriving.
package jobmanager
