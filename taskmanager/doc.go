// Package taskmanager owns the worker side of a Weir cluster: slots, the
// deployment and execution of tasks handed out by the job manager, the data
// plane between task managers (credit-based, so backpressure crosses process
// boundaries without unbounded buffers), heartbeats to the job manager
// (carrying every task's counters), finding the leader among several job
// managers and refusing a deposed leader's messages (fencing tokens), and
// its tasks' Prometheus metrics.
//
// It must not import jobmanager: the two share only the RPC contract in
// internal. It must not import sources or sinks: it runs whatever operators
// runtime instantiates from a registered job name and its parameters.
package taskmanager
