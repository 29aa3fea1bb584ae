package cluster

import (
	"sync/atomic"

	"github.com/fencekv/fencekv/state"
)

// stamps, when set, is told when the proposer hands an entry's commands
// to raft and when raft has committed and applied it. Only the timeline
// benchmark (wiretimeline_test.go) sets it; unset, the proposer pays one
// atomic load per entry.
var stamps atomic.Pointer[stampHooks]

type stampHooks struct {
	dispatch func(cmds []state.Command) // just before raft.Apply
	done     func(cmds []state.Command) // raft's future returned (committed, applied on the leader)
}
