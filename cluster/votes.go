package cluster

import (
	"log/slog"
	"strconv"
	"sync"

	"github.com/hashicorp/raft"
)

// A node that starts without raft state does not vote until it holds
// every entry committed before it started.
//
// Raft is safe only if a voter never forgets what it acknowledged. A node
// whose data dir was lost (a dead disk, an operator's rm -rf) and that
// comes back under its name is still a voter in the configuration, but
// remembers nothing: its vote could elect a node that lacks an entry the
// old node helped commit, and that entry (an acknowledged write, a grant,
// and so the token) would be lost and issued again. A brand-new node is
// in the same position. So until it has caught up, such a node answers
// every vote and pre-vote request with a refusal; a leader is then
// elected, as before the loss, only by a quorum of nodes that remember,
// and replicates its log to it like to any follower.
//
// It has caught up once its log holds the entry at the leader's commit
// index and that entry is of the leader's term: a leader commits its own
// term's first entry only after every entry committed before its term,
// all of which are then in this node's log (the logs match up to an entry
// of the same term). A snapshot of the leader's term, installed, does the
// same.
//
// The nodes that form a new cluster have no state either, and must vote:
// they have acknowledged nothing yet. One that bootstraps the
// configuration votes from then on (voteGuard.bootstrapped); one that saw
// another bootstrap first, and so waits to be added, votes for a
// candidate whose log holds no more than the bootstrap's configuration
// (its last index is at most 1), the first election's candidates. Left
// uncovered: a lost data dir whose node votes for such a candidate, one
// that has heard nothing since the bootstrap while the others committed
// (three faults at once in a cluster of three).

// voteGuard is the raft transport of a node, which passes every request to
// raft but the votes of a node that has not caught up.
type voteGuard struct {
	*raft.NetworkTransport
	out    chan raft.RPC
	stop   chan struct{}
	header raft.RPCHeader // this node's, on its refusals
	log    *slog.Logger

	mu       sync.Mutex
	fresh    bool   // started without raft state, and not caught up
	term     uint64 // the latest AppendEntries' term and leader commit index
	commit   uint64
	refusals int // votes refused while fresh
	// caughtUp reports whether the log holds the entry at index commit
	// with the given term (or a snapshot of that term).
	caughtUp func(term, commit uint64) bool
	current  func() uint64 // this node's raft term, for the refusals
}

func newVoteGuard(t *raft.NetworkTransport, fresh bool, header raft.RPCHeader, log *slog.Logger) *voteGuard {
	return &voteGuard{NetworkTransport: t, out: make(chan raft.RPC), stop: make(chan struct{}), header: header, fresh: fresh, log: log}
}

// Consumer is what raft reads its requests from.
func (g *voteGuard) Consumer() <-chan raft.RPC { return g.out }

// run passes the transport's requests on to raft until Close, answering
// the votes itself while the node is fresh. It starts once raft exists
// (caughtUp and current use it); requests wait for it meanwhile.
func (g *voteGuard) run(caughtUp func(term, commit uint64) bool, current func() uint64) {
	g.caughtUp, g.current = caughtUp, current
	in := g.NetworkTransport.Consumer()
	for {
		var rpc raft.RPC
		select {
		case rpc = <-in:
		case <-g.stop:
			return
		}
		switch req := rpc.Command.(type) {
		case *raft.AppendEntriesRequest:
			g.mu.Lock()
			// The requests before this one have reached the log:
			// see whether they caught the node up, then note this
			// one's commit index.
			if g.fresh && !g.caughtUpLocked() && req.Term >= g.term {
				g.term, g.commit = req.Term, req.LeaderCommitIndex
			}
			g.mu.Unlock()
		case *raft.RequestVoteRequest:
			if req.LastLogIndex > 1 && g.refuse() {
				rpc.Respond(&raft.RequestVoteResponse{RPCHeader: g.header, Term: g.current(), Granted: false}, nil)
				continue
			}
		case *raft.RequestPreVoteRequest:
			if req.LastLogIndex > 1 && g.refuse() {
				rpc.Respond(&raft.RequestPreVoteResponse{RPCHeader: g.header, Term: g.current(), Granted: false}, nil)
				continue
			}
		}
		select {
		case g.out <- rpc:
		case <-g.stop:
			return
		}
	}
}

// refuse reports whether a vote must be refused: the node is fresh, and
// has not caught up since the last look.
func (g *voteGuard) refuse() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.fresh || g.caughtUpLocked() {
		return false
	}
	g.refusals++
	if g.refusals == 1 {
		g.log.Warn("this node started without raft state: it refuses votes until it holds every committed entry (a lost data dir must not elect a leader that lacks them)",
			"leader_commit_index", strconv.FormatUint(g.commit, 10))
	}
	return true
}

// caughtUpLocked ends the node's freshness if it has caught up with the
// leader it last heard from, and reports whether it did. g.mu is held.
func (g *voteGuard) caughtUpLocked() bool {
	if g.commit == 0 || !g.caughtUp(g.term, g.commit) {
		return false
	}
	g.fresh = false
	g.log.Info("caught up with the leader: this node votes again", "term", g.term, "commit_index", g.commit,
		"votes_refused", g.refusals)
	return true
}

// bootstrapped lets a node that bootstraps a new cluster vote: it has
// acknowledged nothing before.
func (g *voteGuard) bootstrapped() {
	g.mu.Lock()
	g.fresh = false
	g.mu.Unlock()
}

// isFresh reports whether the node still refuses votes.
func (g *voteGuard) isFresh() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fresh
}

// Close stops passing requests and closes the transport.
func (g *voteGuard) Close() error {
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	return g.NetworkTransport.Close()
}
