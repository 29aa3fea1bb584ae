// Package cluster runs fencekv on three or five nodes that keep one store:
// hashicorp/raft replicates the engine's commands, hashicorp/memberlist
// finds the nodes and tells which are alive. Every guarantee of a single
// node holds for the cluster as a whole across the loss of any minority of
// nodes, leader changes, pauses and partitions.
//
// The pieces, one file each:
//
//   - fsm.go: raft's FSM is the engine's state machine (state.Machine),
//     applied in batches; its snapshot is the bbolt file.
//   - node.go: Node, which serves the wire protocol's Engine on every
//     node: the leader proposes commands and answers reads after a quorum
//     round (read.go); the others forward to it in one hop (forward.go),
//     but for gets and scans, which they answer themselves with a read
//     index from the leader (followerread.go).
//   - leader.go: what only the leader runs: re-arming leases through a
//     replicated command when it takes over, the expiry loop, the FIFO
//     queues of blocking acquires and their hand-offs.
//   - members.go: gossip membership, bootstrap, adding and reaping raft
//     servers, and the members method.
//   - config.go: Config, DefaultConfig, and the checks Open makes of it.
//   - engine.go: the wire.Engine methods, each routed to the leader (run
//     here, or forwarded) after its arguments are checked.
//   - propose.go: group commit on the leader: the commands proposed at
//     once share one raft entry.
//   - read.go: linearizable reads: a quorum round confirms the leadership
//     before a read is answered.
//   - followerread.go: a follower's linearizable gets and scans, on its
//     own state once it has applied the leader's read index.
//   - rounds.go: one call shared by the callers that joined before it
//     began (the confirmation rounds, the read-index asks).
//   - forward.go: the one connection to the leader that other nodes'
//     requests go over.
//   - votes.go: a node that starts without raft state takes no part in
//     elections until it holds every entry committed before it started.
//   - logstore.go: raft's log on the project's write-ahead log segments,
//     and CheckLog for `fencekv check`.
//   - ops.go: readiness, raft's view for metrics, online backups, seeding
//     a new cluster from a restored backup.
//   - tls.go: raft's stream layer over mutual TLS.
//   - stall.go: a node whose raft log write hangs or failed sends no
//     appends, heartbeats or vote requests (diskGate), so the others lead.
package cluster
