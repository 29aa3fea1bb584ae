package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/hashicorp/raft"
)

// Linearizable reads (read index). The leader answers a read only after
//
//  1. it is the ready leader of its term (its rearm, and so everything
//     committed before its term, is applied);
//  2. a quorum round that started after the read arrived confirmed it is
//     still the leader: a majority of the voters, itself counted, answered
//     a request sent after the read arrived with a raft term no newer than
//     its own (and it is still leader in that term after the answers). A
//     newer leader needs the votes of a majority, which shares a voter
//     with that one; that voter was still in an older term when it
//     answered, so it voted for no newer leader before the read arrived,
//     and no write a newer leader committed was acknowledged before it.
//     A paused old leader cannot pass it: the answers come from requests
//     it sends after it resumes. No clock-based lease is trusted;
//  3. it has applied everything that was committed when the read arrived.
//
// The round asks each other voter for its term (the wire method term) over
// the client protocol, on a connection kept to each. raft's VerifyLeader is
// not used: it counts any successful answer that arrives after the round
// is registered, among them answers to heartbeats and appends sent before
// it, which a leader paused with them in flight finds waiting when it
// resumes.
//
// Concurrent reads share rounds: a read joins the next round to start,
// never one already in flight (which may predate it).

// verifier runs the leader's confirmation rounds for reads.
type verifier struct {
	n      *Node
	rounds rounds[confirmed] // reads share rounds (rounds.go)
	mu     sync.Mutex        // guards peers and closed
	peers  map[raft.ServerID]*peer
	closed bool
}

// peer is a connection to another voter's client address, and its asks
// (see send). Guarded by the verifier's mu.
type peer struct {
	addr     string
	c        *wire.Client
	busy     bool         // an ask is waiting for its answer
	next     chan<- error // the round waiting for the next ask, if any
	nextTerm uint64       // the term that round confirms
}

// confirmed is a round's outcome: the term it confirmed, or why not.
type confirmed struct {
	term uint64
	err  error
}

// verify waits for a confirmation round that starts after the call, and
// returns the term it confirmed.
func (v *verifier) verify(ctx context.Context) (uint64, error) {
	ch := v.rounds.join(v.n.wg.Go, func() confirmed {
		term, err := v.round()
		return confirmed{term, err}
	})
	// A round waits for each voter's ask in flight before it asks again
	// (send), so it can take up to twice the hold timeout when both are
	// unreachable; the read is answered unavailable after one. Not what is
	// left of the request's hold (see awaitApplied).
	timer := time.NewTimer(v.n.cfg.HoldTimeout)
	defer timer.Stop()
	select {
	case c := <-ch:
		return c.term, c.err
	case <-timer.C:
		return 0, fmt.Errorf("no voter confirmed it within the hold timeout (%v)", v.n.cfg.HoldTimeout)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// round asks the other voters for their terms, and returns this leader's
// term once a majority of the voters (this node counted) are in no newer
// one.
func (v *verifier) round() (uint64, error) {
	n := v.n
	term := n.raft.CurrentTerm()
	if n.raft.State() != raft.Leader {
		return 0, fmt.Errorf("this node is %s: %w", role(n.raft.State()), errDeposed)
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0, err
	}
	var others []raft.ServerID
	voters := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if string(s.ID) != n.cfg.Name {
			others = append(others, s.ID)
		}
	}
	need := voters/2 + 1 - (voters - len(others)) // this node's own vote counts
	if need > 0 {
		// Asks outlive a round that ends without them (each ends within
		// the hold timeout), so the channel has room for all.
		answers := make(chan error, len(others))
		for _, id := range others {
			v.send(id, term, answers)
		}
		var errs []error
		for left := len(others); need > 0; {
			err := <-answers
			left-- // voters yet to answer
			if err == nil {
				need--
				continue
			}
			errs = append(errs, err)
			if left < need {
				return 0, fmt.Errorf("%d of %d voters did not confirm: %w", len(errs), voters, errors.Join(errs...))
			}
		}
	}
	if now := n.raft.CurrentTerm(); now != term || n.raft.State() != raft.Leader {
		return 0, fmt.Errorf("the term moved from %d to %d: %w", term, now, errDeposed)
	}
	return term, nil
}

// errDeposed says a confirmation round found this node no longer leader,
// or a newer term: a newer leader may exist, which the read goes to once
// this node knows it.
var errDeposed = errors.New("a newer term")

// send asks voter id to confirm term, with an ask sent from now on; its
// outcome goes to answers. A voter is asked once at a time: while an ask
// is unanswered, the round waits for the next one, sent as that ask ends
// (a voter paused, say, holds it up for at most the hold timeout, which
// drops the connection). Rounds run one after another, so a voter has
// at most one round waiting: a later round's takes the place of an
// earlier one, already over. An ask left over from a round that ended
// without it only delays the next round's: it can never answer for it,
// nor make it fail (it did, when the stale ask held the voter as the
// next round looked: under load, with both voters so held, linearizable
// gets failed unavailable in a healthy cluster).
func (v *verifier) send(id raft.ServerID, term uint64, answers chan<- error) {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		answers <- errClosed
		return
	}
	p := v.peers[id]
	if p == nil {
		p = &peer{}
		if v.peers == nil {
			v.peers = make(map[raft.ServerID]*peer)
		}
		v.peers[id] = p
	}
	if p.busy {
		p.next, p.nextTerm = answers, term
		v.mu.Unlock()
		return
	}
	p.busy = true
	v.mu.Unlock()
	v.n.wg.Go(func() { v.asks(id, p, term, answers) })
}

// asks asks voter id, then the round waiting for the next ask, if any,
// until none waits. It holds p's busy mark.
func (v *verifier) asks(id raft.ServerID, p *peer, term uint64, answers chan<- error) {
	for {
		answers <- v.ask(id, p, term)
		v.mu.Lock()
		if v.closed {
			next := p.next
			p.busy, p.next = false, nil
			if p.c != nil {
				p.c.Close()
				p.c = nil
			}
			v.mu.Unlock()
			if next != nil {
				next <- errClosed
			}
			return
		}
		if p.next == nil {
			p.busy = false
			v.mu.Unlock()
			return
		}
		answers, term = p.next, p.nextTerm
		p.next = nil
		v.mu.Unlock()
	}
}

// ask confirms term with voter id: its term, asked now, is no newer. It
// dials the voter's client address (gossip gives it) if p has no
// connection to it; a failed call drops the connection, so the next ask
// redials. Called by the holder of p's busy mark.
func (v *verifier) ask(id raft.ServerID, p *peer, term uint64) error {
	m, ok := v.n.mdel.meta(string(id))
	if !ok || m.Client == "" {
		return fmt.Errorf("%s: gossip knows no address for it", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), v.n.cfg.HoldTimeout)
	defer cancel()
	v.mu.Lock()
	if p.c != nil && p.addr != m.Client {
		p.c.Close()
		p.c = nil
	}
	c := p.c
	v.mu.Unlock()
	if c == nil {
		var err error
		if c, err = v.n.dial(ctx, m.Client); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		v.mu.Lock()
		closed := v.closed
		if !closed {
			p.c, p.addr = c, m.Client
		}
		v.mu.Unlock()
		if closed {
			c.Close()
			return errClosed
		}
	}
	t, err := c.Term(ctx)
	if err != nil {
		v.mu.Lock()
		if p.c == c {
			p.c = nil
		}
		v.mu.Unlock()
		c.Close()
		return fmt.Errorf("%s: %w", id, err)
	}
	if t > term {
		return fmt.Errorf("%s is in term %d, after %d: %w", id, t, term, errDeposed)
	}
	return nil
}

func (v *verifier) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.closed = true
	for id, p := range v.peers {
		if p.c != nil && !p.busy { // a busy peer's asks close their own
			p.c.Close()
		}
		delete(v.peers, id)
	}
}

// readIndex returns once a read that arrived now may be answered from this
// node's state, or errForward, or an error.
func (n *Node) readIndex(ctx context.Context) error {
	index, err := n.confirmIndex(ctx)
	if err != nil {
		return err
	}
	return n.awaitApplied(ctx, index)
}

// confirmIndex returns, on the ready leader, the commit index as it was
// when the call began, once a round begun after it confirmed that this
// node leads (steps 1 and 2 above): a read that arrived before the call
// may be answered from a state that has applied the log up to the index.
// Elsewhere it returns errForward, or an error. A round that finds a
// newer term waits for raft to step down (it learns the term from its
// own traffic within a heartbeat or so), and the read then goes to the
// new leader.
func (n *Node) confirmIndex(ctx context.Context) (uint64, error) {
	var deadline <-chan time.Time
	for {
		n.mu.Lock()
		change := n.change
		n.mu.Unlock()
		ready, err := n.awaitReady(ctx)
		if err != nil {
			return 0, err
		}
		index := n.raft.CommitIndex()
		term, err := n.reads.verify(ctx)
		if err == nil && term != ready {
			// Confirmed as leader of a later term than the one it read
			// the commit index in: another leader may have committed
			// writes in between. Start again in the new term.
			err = fmt.Errorf("ready in term %d, confirmed in %d: %w", ready, term, errDeposed)
		}
		if err == nil {
			return index, nil
		}
		if !errors.Is(err, errDeposed) {
			return 0, &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "leadership not confirmed: " + err.Error()}
		}
		if deadline == nil {
			t := time.NewTimer(n.holdLeft(ctx))
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-change: // the leadership changed: look again
		case <-deadline:
			return 0, &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "leadership not confirmed: " + err.Error()}
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-n.stop:
			return 0, errClosed
		}
	}
}

// awaitApplied waits until this node has applied index.
func (n *Node) awaitApplied(ctx context.Context, index uint64) error {
	// Not a wait for a leader (the read has one): a bound of its own,
	// not what is left of the request's hold, which may be nothing.
	timer := time.NewTimer(n.cfg.HoldTimeout)
	defer timer.Stop()
	for {
		applied, change := n.fsm.appliedIndex()
		if appliedTo(applied, n.raft, n.logs, index) {
			return nil
		}
		select {
		case <-change:
		case <-time.After(5 * time.Millisecond): // entries the FSM never sees (barriers) move only raft's index
		case <-timer.C:
			return &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "this node is behind the log"}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// appliedTo reports whether the FSM, which has applied the entries it was
// given up to applied (fsm.appliedIndex), has applied the log up to index:
// whether a read from it now sees every entry committed at or below the
// index. The FSM's own applied index says so for the entries it is given
// (commands and configuration changes). raft's AppliedIndex does not: raft
// moves it when it hands entries to the FSM's goroutine, before they are
// applied, and a follower read answered on its word missed a write
// acknowledged before the read began (TestLinearizableCluster found it;
// TestAppliedToWaitsForTheFSM is the targeted form). It does cover the
// entries the FSM is never given, raft's no-ops and barriers: once raft
// has handed on the entries up to index (so that they are committed here,
// not an old term's uncommitted tail) and none after the FSM's index is a
// command or a configuration change, the state is the index's.
func appliedTo(applied uint64, r *raft.Raft, logs raft.LogStore, index uint64) bool {
	if applied >= index {
		return true
	}
	if r.AppliedIndex() < index || index-applied > maxUnseen {
		return false
	}
	var l raft.Log
	for i := applied + 1; i <= index; i++ {
		if logs.GetLog(i, &l) != nil || l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return false
		}
	}
	return true
}

// maxUnseen bounds the entries appliedTo reads from the log: a leader
// appends a no-op and a barrier as it takes over, then its rearm.
const maxUnseen = 8
