package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wire"
	"github.com/hashicorp/raft"
)

// What only the leader does. When raft makes this node leader, it first
// applies everything committed (a barrier), then proposes a rearm stamped
// with its time and term: every live lease gets its full TTL again on the
// new leader's clock (G7). Only once the rearm is applied does it take
// commands (ready), so every command of its term comes after the rearm in
// the log, and an expiry proposed by an older leader can never land (the
// machine ignores expiries from a term before the last rearm). While it
// leads it runs the expiry loop and hands freed locks to queued waiters.

// watchLeader follows raft's view of who leads, for the forwarder.
func (n *Node) watchLeader(obs chan raft.Observation) {
	for {
		select {
		case <-n.stop:
			return
		case o := <-obs:
			lo, ok := o.Data.(raft.LeaderObservation)
			if !ok {
				continue
			}
			n.leaderChanges.Add(1)
			addr := ""
			if m, ok := n.mdel.meta(string(lo.LeaderID)); ok && string(lo.LeaderID) != n.cfg.Name {
				addr = m.Client
			}
			n.fwd.leaderChanged(addr)
			n.setLeadership(n.isReady()) // wake requests waiting for a leader
		}
	}
}

// watchLeadership follows raft's leadership notifications.
func (n *Node) watchLeadership() {
	var stopLeading func()
	defer func() {
		if stopLeading != nil {
			stopLeading()
		}
	}()
	for {
		select {
		case <-n.stop:
			return
		case leader := <-n.notify:
			// Whatever comes, the leadership this node had is over: no
			// request may be served as its leader while its loops stop
			// (the state machine refuses what still carries its term).
			n.setLeadership(false, 0)
			if stopLeading != nil {
				stopLeading()
				stopLeading = nil
			}
			if !leader {
				n.drainWaiters(errLostLeadership)
				continue
			}
			stopLeading = n.startLeading()
		}
	}
}

// startLeading runs lead until the returned stop is called.
func (n *Node) startLeading() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.lead(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

var errLostLeadership = &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "this node lost the leadership; queue again"}

// lead runs while this node is leader.
func (n *Node) lead(ctx context.Context) {
	term := n.raft.CurrentTerm()
	for {
		err := n.takeOver(term)
		if err == nil {
			break
		}
		n.log.Warn("taking over as leader", "term", term, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
		if n.raft.State() != raft.Leader {
			return
		}
	}
	if n.seeding() {
		// A dir restored from a backup: put its state into the raft log as
		// a snapshot before taking any command (ops.go).
		for {
			err := n.seed()
			if err == nil {
				break
			}
			n.log.Warn("seeding the cluster from the restored store", "err", err)
			if !n.pause(ctx, 200*time.Millisecond) || n.raft.State() != raft.Leader {
				return
			}
		}
	}
	if err := n.m.Failed(); err != nil {
		n.abdicate(ctx)
		return
	}
	n.log.Info("leading", "term", term)
	n.setLeadership(true, term)
	if n.m.Failed() != nil { // failed in between: machineFailed missed this leadership
		n.setLeadership(false, 0)
		n.abdicate(ctx)
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { n.expiryLoop(ctx, term) })
	wg.Go(func() { n.handoffLoop(ctx, term) })
	wg.Go(func() { n.reconcileLoop(ctx) })
	wg.Wait()
	n.setLeadership(false, 0)
}

// machineFailed runs once the state machine has failed (a storage error):
// a node that cannot apply must not lead. Its reads would miss what it
// commits, and its writes, which the other nodes apply, would be answered
// with an unknown outcome. It stops serving as leader at once (requests
// wait for a leader, then go to it) and hands the leadership over; it
// forwards requests, and serves nothing from its own state, until it is
// restarted. Called from raft's FSM goroutine.
func (n *Node) machineFailed(err error) {
	n.log.Error("the state machine failed: this node hands over the leadership and takes no part but forwarding until restarted", "err", err)
	n.setLeadership(false, 0)
	n.wg.Go(func() { n.abdicate(context.Background()) })
}

// abdicate transfers the leadership away while this node holds it.
func (n *Node) abdicate(ctx context.Context) {
	for n.raft.State() == raft.Leader {
		if err := n.raft.LeadershipTransfer().Error(); err != nil {
			n.log.Warn("handing over the leadership of a node whose state machine failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-n.stop:
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// takeOver applies everything committed, then re-arms every lease.
func (n *Node) takeOver(term uint64) error {
	if err := n.raft.Barrier(n.cfg.HoldTimeout).Error(); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	_, err := n.apply(state.Command{Op: state.OpRearm}, term)
	return err
}

func (n *Node) isReady() (bool, uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ready, n.term
}

// setLeadership records whether this node is a ready leader, and wakes
// everyone waiting for a change.
func (n *Node) setLeadership(ready bool, term uint64) {
	n.mu.Lock()
	n.ready, n.term = ready, term
	close(n.change)
	n.change = make(chan struct{})
	n.mu.Unlock()
}

// errForward says the request is for the leader at addr.
type errForward struct{ addr string }

func (e errForward) Error() string { return "forward to " + e.addr }

// holdKey is the context key of the time a request stops waiting for a
// leader (see held).
type holdKey struct{}

// held returns ctx with the time its request stops waiting for a leader:
// HoldTimeout from now, unless ctx has that time already. route sets it as
// a request reaches the node, so that all the request's waits together
// (for a leader, for a read's confirmation, between forwarding attempts)
// take at most HoldTimeout, not HoldTimeout each (awaitApplied, which
// waits for this node's own state machine, not for a leader, keeps a bound
// of its own).
func (n *Node) held(ctx context.Context) context.Context {
	if _, ok := ctx.Value(holdKey{}).(time.Time); ok {
		return ctx
	}
	return context.WithValue(ctx, holdKey{}, time.Now().Add(n.cfg.HoldTimeout))
}

// holdLeft is how long ctx's request may still wait for a leader:
// HoldTimeout if it has no hold time (held).
func (n *Node) holdLeft(ctx context.Context) time.Duration {
	if t, ok := ctx.Value(holdKey{}).(time.Time); ok {
		return max(time.Until(t), 0)
	}
	return n.cfg.HoldTimeout
}

// awaitReady returns this node's term once it is a ready leader, or
// errForward when another node leads, waiting up to the request's hold
// timeout (holdLeft, and within ctx) while there is no leader.
func (n *Node) awaitReady(ctx context.Context) (uint64, error) {
	var timer *time.Timer
	for {
		n.mu.Lock()
		ready, term, change := n.ready, n.term, n.change
		n.mu.Unlock()
		if ready {
			return term, nil
		}
		if addr, ok := n.leaderClientAddr(); ok {
			return 0, errForward{addr}
		}
		if wire.Forwarded(ctx) && n.raft.State() != raft.Leader {
			// Another node forwarded it here, taking this node for the
			// leader: the request waits there, not here, where it could
			// be applied after that node has answered its client (this
			// node winning the next election): see route.
			return 0, notLeader("")
		}
		if timer == nil {
			timer = time.NewTimer(n.holdLeft(ctx))
			defer timer.Stop()
		}
		select {
		case <-change:
		case <-time.After(20 * time.Millisecond): // raft names a leader without telling us; look again
		case <-timer.C:
			return 0, &fencekv.Error{Code: fencekv.CodeUnavailable, Message: fmt.Sprintf("no leader after %v", n.cfg.HoldTimeout)}
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-n.stop:
			return 0, errClosed
		}
	}
}

// leaderClientAddr is the client address of the node raft says leads, if
// it is another node and gossip knows it.
func (n *Node) leaderClientAddr() (string, bool) {
	_, id := n.raft.LeaderWithID()
	if id == "" || string(id) == n.cfg.Name {
		return "", false
	}
	m, ok := n.mdel.meta(string(id))
	if !ok || m.Client == "" {
		return "", false
	}
	return m.Client, true
}

// apply proposes one command with the given term and waits for its
// result, in an entry shared with the commands proposed at the same time
// (propose.go), which stamps the entry's time. An error that is not a
// *fencekv.Error's refusal says whether the command may have been
// applied.
func (n *Node) apply(c state.Command, term uint64) (state.Result, error) {
	c.Term = term
	return n.props.apply(c)
}

// propose runs c on the leader: here if this node is the ready leader
// (stamping its time and term), else errForward.
func (n *Node) propose(ctx context.Context, c state.Command) (state.Result, error) {
	term, err := n.awaitReady(ctx)
	if err != nil {
		return state.Result{}, err
	}
	return n.apply(c, term)
}

// release proposes a release (c) on the leader. If callers are queued for
// the lock, the first one's acquire goes into the same entry right after
// it, so that the lock is handed over in the round that frees it rather
// than in one more (the FIFO hand-off of a single node, in one
// transaction). If the release is refused and the lock stays taken, the
// waiter goes back to the head of its queue.
func (n *Node) release(ctx context.Context, c state.Command) (state.Result, error) {
	term, err := n.awaitReady(ctx)
	if err != nil {
		return state.Result{}, err
	}
	c.Now, c.Term = n.now(), term
	var w *state.Waiter
	if n.queues.Waiting(c.Lease.Name) > 0 {
		w = n.queues.Pop(c.Lease.Name)
	}
	if w == nil {
		return n.apply(c, term)
	}
	rs, err := n.props.applyGroup(c, state.Command{Op: state.OpAcquire, Now: c.Now, Term: term, Lease: w.Req})
	switch {
	case err != nil:
		w.Finish(state.Grant{}, err)
		return state.Result{}, err
	case errors.Is(rs[1].Err, fencekv.ErrLockHeld):
		n.queues.Requeue(w)
		n.kick(c.Lease.Name) // freed meanwhile, while w was out of its queue: the hand-off loop looks
	default:
		w.Finish(rs[1].Grant, rs[1].Err)
	}
	return rs[0], nil
}

// expiryLoop proposes an expire command for each lock whose lease or
// lock-delay is due by this leader's clock.
func (n *Node) expiryLoop(ctx context.Context, term uint64) {
	for {
		at, ok := n.m.NextDue()
		var t fencekv.Timer
		var fire <-chan time.Time
		if ok {
			d := at - n.now()
			if d <= 0 {
				due := n.m.DueLocks(n.now(), n.opts.MaxBatch)
				if err := n.expire(due, term); err != nil {
					n.log.Warn("expire", "locks", len(due), "first", due[0], "err", err)
					if !n.pause(ctx, 50*time.Millisecond) {
						return
					}
				}
				continue
			}
			t = n.clock.NewTimer(d)
			fire = t.C()
		}
		select {
		case <-fire:
		case <-n.m.Wake():
		case <-ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// expire proposes the expiries of locks in one entry, and waits until
// they are applied: leases that ran out together (a client that held many
// died) are freed in one round of the log, not in one round each.
func (n *Node) expire(locks []string, term uint64) error {
	if len(locks) == 0 {
		return nil
	}
	cmds := make([]state.Command, len(locks))
	for i, name := range locks {
		cmds[i] = state.Command{Op: state.OpExpire, Lease: state.LeaseRequest{Name: name}, Term: term}
	}
	_, err := n.props.applyGroup(cmds...)
	return err
}

// pause waits d unless ctx ends first; it reports whether ctx is live.
func (n *Node) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// freed is called by the FSM when a command frees a lock: on the leader,
// its hand-off loop gives it to the first waiter.
func (n *Node) freed(name string) {
	if n.queues.Waiting(name) == 0 {
		return
	}
	n.kick(name)
}

// kick asks the hand-off loop to look at name.
func (n *Node) kick(name string) {
	n.hmu.Lock()
	if n.kicked == nil {
		n.kicked = map[string]struct{}{}
	}
	n.kicked[name] = struct{}{}
	n.hmu.Unlock()
	select {
	case n.hwake <- struct{}{}:
	default:
	}
}

// handoffLoop grants freed locks to their first waiter, one proposal
// each. If someone else took the lock first, the waiter goes back to the
// head of its queue for the next release or expiry.
func (n *Node) handoffLoop(ctx context.Context, term uint64) {
	for {
		n.hmu.Lock()
		names := n.kicked
		n.kicked = nil
		n.hmu.Unlock()
		for name := range names {
			for {
				in, err := n.m.LockInfo(n.now(), name)
				if err != nil || in.Full() || in.Delay > 0 {
					break // still taken: its release or expiry kicks again
				}
				w := n.queues.Pop(name)
				if w == nil {
					break
				}
				r, err := n.apply(state.Command{Op: state.OpAcquire, Lease: w.Req}, term)
				if err == nil && errors.Is(r.Err, fencekv.ErrLockHeld) {
					n.queues.Requeue(w)
					break
				}
				if err == nil {
					err = r.Err
				}
				w.Finish(r.Grant, err)
				if err == nil && !r.Freed { // a semaphore may have permits left for the next
					break
				}
			}
		}
		select {
		case <-n.hwake:
		case <-ctx.Done():
			return
		}
	}
}

// drainWaiters answers every queued waiter with err (the node lost the
// leadership or is closing: the callers queue again elsewhere).
func (n *Node) drainWaiters(err error) {
	for _, name := range n.queues.QueuedLocks() {
		for w := n.queues.Pop(name); w != nil; w = n.queues.Pop(name) {
			w.Finish(state.Grant{}, err)
		}
	}
}
