package cluster

import (
	"log/slog"
	"sync"

	"github.com/hashicorp/raft"
)

// A node that starts without raft state takes no part in elections until
// it holds every entry committed before it started.
//
// Raft is safe only if a voter never forgets what it acknowledged. A node
// whose data dir was lost (a dead disk, an operator's rm -rf) and that
// comes back under its name is still a voter in the configuration, but
// remembers nothing: its vote could elect a node that lacks an entry the
// old node helped commit, and that entry (an acknowledged write, a grant,
// and so the token) would be lost and issued again. So until it has
// caught up, such a node answers every vote and pre-vote request with a
// refusal, and its own campaigns get no vote but its own; a leader is
// then elected only by a quorum of nodes that remember, and replicates its
// log to it like to any follower.
//
// It has caught up once its log holds the entry at the leader's commit
// index and that entry is of the leader's term, or it holds a snapshot of
// that term at or past that index: a leader commits its own term's first
// entry only after every entry committed before its term, all of which
// are then in this node's log (the logs match up to an entry of the same
// term), as is every entry of its term committed before the node started
// (the leader's commit index only grows within its term).
//
// Freshness outlives a restart (a marker file, freshFile): the first
// AppendEntries gives the node a term, and so raft state, long before it
// has caught up.
//
// New nodes are added as non-voters, and promoted once caught up
// (reconcile), so a new node's freshness never costs a quorum. The nodes
// that form a new cluster have no state either, and must vote: they have
// acknowledged nothing yet. One that bootstraps the configuration votes
// from then on (voteGuard.bootstrapped); one that saw another bootstrap
// first, and so waits, votes for a candidate whose log holds no more than
// the bootstrap's configuration (its last index is at most 1), the first
// election's candidates. Left uncovered: a lost data dir whose node votes
// for such a candidate, one that has heard nothing since the bootstrap
// while the others committed (three faults at once in a cluster of
// three); the acknowledgements of a fresh node's appends, which still
// count for a leader's commits, a stale leader's too (a leader paused
// while the others elected another and committed, which then died, while
// this node lost its disk); and a new cluster whose one bootstrapping node
// dies before the others have caught up (they wait for it).

// voteGuard is the raft transport of a node: it passes everything to and
// from raft but the votes of a node that has not caught up.
type voteGuard struct {
	*raft.NetworkTransport
	out    chan raft.RPC
	stop   chan struct{}
	ended  chan struct{}  // closed when run returns: Close waits for it
	header raft.RPCHeader // this node's, on its refusals
	log    *slog.Logger
	// caughtUp reports whether the log holds the entry at index commit
	// with the given term, or a snapshot of that term at or past it.
	caughtUp func(term, commit uint64) bool
	current  func() uint64 // this node's raft term, for its refusals
	// done is called once the node has caught up (or bootstrapped): it
	// removes the marker that keeps the node fresh across restarts.
	done func()

	mu       sync.Mutex
	fresh    bool   // not caught up since it started without raft state
	term     uint64 // the latest AppendEntries' term and leader commit index
	commit   uint64
	refusals int // votes refused while fresh
}

func newVoteGuard(t *raft.NetworkTransport, fresh bool, header raft.RPCHeader, log *slog.Logger,
	caughtUp func(term, commit uint64) bool, current func() uint64, done func()) *voteGuard {
	return &voteGuard{NetworkTransport: t, out: make(chan raft.RPC), stop: make(chan struct{}), ended: make(chan struct{}), header: header, log: log,
		caughtUp: caughtUp, current: current, done: done, fresh: fresh}
}

// Consumer is what raft reads its requests from.
func (g *voteGuard) Consumer() <-chan raft.RPC { return g.out }

// run passes the transport's requests on to raft until Close, answering
// the votes itself while the node is fresh.
func (g *voteGuard) run() {
	defer close(g.ended)
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
			// See whether the entries so far caught the node up, then
			// note this request's commit index. (A request's entries
			// may not be in the log yet: that only delays the news.)
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

// RequestVote asks target for its vote, unless this node is fresh: then
// it answers itself with a refusal (in the campaign's term, which makes
// the candidate neither step down nor count it), so that a fresh node
// never wins an election.
func (g *voteGuard) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if args.LastLogIndex > 1 && g.refuse() {
		*resp = raft.RequestVoteResponse{RPCHeader: g.header, Term: args.Term, Granted: false}
		return nil
	}
	return g.NetworkTransport.RequestVote(id, target, args, resp)
}

// RequestPreVote is RequestVote's pre-vote.
func (g *voteGuard) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if args.LastLogIndex > 1 && g.refuse() {
		*resp = raft.RequestPreVoteResponse{RPCHeader: g.header, Term: args.Term, Granted: false}
		return nil
	}
	return g.NetworkTransport.RequestPreVote(id, target, args, resp)
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
		g.log.Warn("this node started without raft state: it takes no part in elections until it holds every committed entry (a lost data dir must not elect a leader that lacks them)",
			"leader_commit_index", g.commit)
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
	g.done()
	g.log.Info("caught up with the leader: this node votes again", "term", g.term, "commit_index", g.commit,
		"votes_refused", g.refusals)
	return true
}

// bootstrapped lets a node that bootstrapped a new cluster vote: it has
// acknowledged nothing before.
func (g *voteGuard) bootstrapped() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fresh {
		g.fresh = false
		g.done()
	}
}

// isFresh reports whether the node still takes no part in elections.
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
	<-g.ended
	return g.NetworkTransport.Close()
}
