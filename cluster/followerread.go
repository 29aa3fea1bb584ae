package cluster

import (
	"context"
	"errors"
	"sync/atomic"
)

// Follower reads (the raft thesis, §6.4). A linearizable get or scan that
// reaches a follower is answered there instead of being forwarded: the
// follower asks the leader for a read index (the wire method read_index:
// the leader's commit index, read after the ask arrived, once a quorum
// round begun after it confirmed that it still leads, as for its own
// reads: see read.go), and if it has applied the log up to that index,
// reads its own state. Every write acknowledged before the
// read arrived was committed at or below the index, and a follower applies
// only committed entries, so its state then has all of them: the read is
// as linearizable as the leader's own.
//
// The leader's work for such a read is one ask, shared: the reads that
// reach a follower while an ask is in flight wait for the next one (never
// one already sent, which may have been answered from before they
// arrived), so under load one ask serves many reads. The answer, the
// value, travels no further than the follower.
//
// A follower learns that entries are committed from the leader's next
// append, which with no writes flowing can take raft's commit timeout
// (50-100 ms). So a follower that has not applied the index when the
// answer comes forwards the read to the leader after all (it costs the
// ask's round trip more than forwarding at once), as does one whose ask
// fails (no leader, a lost connection, a leader of an older version that
// does not know read_index): the forwarded path waits for a leader and
// reports errors as before. Lock reads (lock_info, locks) are always
// forwarded: the leader commits the expiries they find due.

// indexAsker asks the leader for read indexes on a follower's behalf, one
// ask in flight at a time, shared by the reads that arrived before it.
type indexAsker struct {
	n      *Node
	rounds rounds[askedIndex]     // reads share asks (rounds.go)
	addr   atomic.Pointer[string] // the leader's client address the latest read named
}

// askedIndex is an ask's outcome.
type askedIndex struct {
	index uint64
	err   error
}

// followerRead returns once this follower may answer, from its own state,
// a linearizable read that arrived before the call, the leader being at
// addr; or errForward{addr} if the read should be forwarded instead; or
// the context's error.
func (n *Node) followerRead(ctx context.Context, addr string) error {
	index, err := n.asker.ask(ctx, addr)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errForward{addr}
	}
	if applied, _ := n.fsm.appliedIndex(); !appliedTo(applied, n.raft, n.logs, index) {
		return errForward{addr}
	}
	n.followerReads.Add(1)
	return nil
}

// ask waits for an ask that starts after the call, and returns the index
// the leader gave.
func (a *indexAsker) ask(ctx context.Context, addr string) (uint64, error) {
	a.addr.Store(&addr)
	ch := a.rounds.join(a.n.wg.Go, func() askedIndex {
		index, err := a.once(*a.addr.Load())
		return askedIndex{index, err}
	})
	select {
	case r := <-ch:
		return r.index, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-a.n.stop:
		return 0, errClosed
	}
}

// once asks the leader at addr for a read index, on the forwarder's
// connection, within the hold timeout.
func (a *indexAsker) once(addr string) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), a.n.cfg.HoldTimeout)
	defer cancel()
	c, err := a.n.fwd.client(ctx, addr)
	if err != nil {
		return 0, err
	}
	index, err := c.ReadIndex(ctx)
	if err != nil {
		return 0, a.n.fwd.forwardError(c, err, false) // drops a broken connection
	}
	return index, nil
}

// ReadIndex answers the wire method read_index: on the ready leader, its
// commit index once a quorum round begun after the call confirmed that it
// leads; elsewhere not_leader, naming the leader if this node knows it
// (the asker forwards its reads instead).
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	index, err := n.confirmIndex(n.held(ctx))
	var fw errForward
	if errors.As(err, &fw) {
		return 0, notLeader(fw.addr)
	}
	return index, err
}
