package cluster

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// A leader whose disk hangs lets another node lead.
//
// raft's leader writes an entry to its own log (StoreLogs, in its main
// loop) before it replicates it, while a goroutine per follower sends
// heartbeats on a timer of its own. So a leader whose log write hangs (an
// fsync stuck on a dying disk, a full array rebuilding, a cloud volume
// throttled) goes on heartbeating: its followers never time out, and the
// cluster takes no write until the disk comes back, however long that is
// (issue #33; TestLeaderRaftLogStall in package diskfault showed it).
//
// So the node's transport sends no appends and no heartbeats while a
// write of its raft log has been running for longer than the followers'
// heartbeat timeout (diskGate): they time out and elect a leader among
// themselves. The new leader's heartbeats (which raft handles outside its
// main loop) make the old one a follower of the new term even while its
// write hangs; when the write returns, its leader loop finds it no longer
// leads and fails what it was proposing (outcome unknown). The entries it
// wrote in the meantime were never committed (no majority holds them), so
// it acknowledged none of them, and the new leader's log replaces them. A write that fails outright instead fails
// the log (logStore.fail): raft steps the leader down, and the node takes
// no entries until it is restarted.
//
// A node whose raft log failed (a write or fsync returned an error) takes
// no entries until restarted, so it must not lead: it would be elected,
// fail to write its first entry, step down, and cost the cluster an
// election each time its timer fired first. So it sends no vote or
// pre-vote requests either: with pre-vote, its campaigns then disturb
// no one (the others' terms do not move). It still votes, and forwards.
//
// Reads need no gate: a leader confirms each read with a round of term
// checks (read.go), which a node that the others have left behind fails.

// busyClock is when the current write of the raft log began, if one is
// running.
type busyClock struct {
	mu    sync.Mutex
	since time.Time // zero when no write runs
}

func (b *busyClock) start() {
	b.mu.Lock()
	b.since = time.Now()
	b.mu.Unlock()
}

func (b *busyClock) done() {
	b.mu.Lock()
	b.since = time.Time{}
	b.mu.Unlock()
}

// running is how long the current write has been running, 0 if none is.
func (b *busyClock) running() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.since.IsZero() {
		return 0
	}
	return time.Since(b.since)
}

// diskGate is the node's raft transport (the vote guard's): it refuses to
// send appends and heartbeats while the raft log's current write has run
// for longer than bound.
type diskGate struct {
	*voteGuard
	busy   *busyClock
	bound  time.Duration
	failed func() error // the raft log's failure, or nil
	log    *slog.Logger

	mu     sync.Mutex
	gated  bool // the last send was refused
	gateAt time.Duration
}

func newDiskGate(g *voteGuard, busy *busyClock, bound time.Duration, failed func() error, log *slog.Logger) *diskGate {
	return &diskGate{voteGuard: g, busy: busy, bound: bound, failed: failed, log: log}
}

// campaign is why this node asks for no votes, or nil.
func (g *diskGate) campaign() error {
	if err := g.failed(); err != nil {
		return fmt.Errorf("cluster: this node asks for no votes: %w", err)
	}
	return nil
}

// RequestVote asks for a vote, unless the raft log failed.
func (g *diskGate) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if err := g.campaign(); err != nil {
		return err
	}
	return g.voteGuard.RequestVote(id, target, args, resp)
}

// RequestPreVote asks for a pre-vote, unless the raft log failed.
func (g *diskGate) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if err := g.campaign(); err != nil {
		return err
	}
	return g.voteGuard.RequestPreVote(id, target, args, resp)
}

// stalled is the error a send is refused with, or nil.
func (g *diskGate) stalled() error {
	d := g.busy.running()
	g.mu.Lock()
	defer g.mu.Unlock()
	if d <= g.bound {
		if g.gated {
			g.gated = false
			g.log.Warn("raft's log write finished: sending appends and heartbeats again", "stalled_for_at_least", g.gateAt.Round(time.Millisecond))
		}
		return nil
	}
	if !g.gated {
		g.gated = true
		g.log.Error("raft's log has not finished a write for longer than the heartbeat timeout: this node sends no appends or heartbeats until it does, so that another node can lead",
			"running", d.Round(time.Millisecond), "heartbeat_timeout", g.bound)
	}
	g.gateAt = d
	return fmt.Errorf("cluster: raft's log has been writing for %v (over the heartbeat timeout, %v): the disk hangs", d.Round(time.Millisecond), g.bound)
}

// AppendEntries sends an append or heartbeat, unless the disk hangs.
func (g *diskGate) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if err := g.stalled(); err != nil {
		return err
	}
	return g.voteGuard.AppendEntries(id, target, args, resp)
}

// AppendEntriesPipeline opens a pipeline whose appends are gated too.
func (g *diskGate) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := g.voteGuard.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return gatedPipeline{p, g}, nil
}

type gatedPipeline struct {
	raft.AppendPipeline
	g *diskGate
}

func (p gatedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	if err := p.g.stalled(); err != nil {
		return nil, err
	}
	return p.AppendPipeline.AppendEntries(args, resp)
}
