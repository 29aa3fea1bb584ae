// Package state is fencekv's deterministic state machine: the data file
// (keys, values, fences, revisions, the token sequence), the leases, and
// the watch hub, changed only by Machine.Apply, one Command after another.
//
// Two drivers feed it commands: the single node (package fencekv: group
// commit, its own write-ahead log, the expiry loop) and a cluster node
// (package cluster: raft's FSM applies each committed entry's batch). Both
// see the same Machine; neither reaches inside it. What a driver needs
// beyond Apply (the expiry index, the watchers) is a method here, safe from
// the goroutines its comment names. The queues of callers waiting for locks
// are each driver's own (Queues: in memory, never replicated); the machine
// only counts them (SetQueues).
//
// The contract a driver keeps (see Machine): commands carry their time and
// term; Apply runs on one goroutine at a time; Publish ends a batch once it
// is durable; Fail discards an open batch that could not be made durable.
package state
