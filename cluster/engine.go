package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wire"
)

// The wire.Engine methods. Each checks its arguments first (bad input
// never reaches the log), then runs on the leader: here if this node is
// the ready leader, else forwarded in one hop.

// route runs local, or remote on the leader's connection when local says
// errForward. write marks requests whose outcome is unknown if the
// connection breaks after they were sent.
//
// A request is forwarded in one hop: one that another node forwarded here
// (wire.Forwarded) is answered not_leader when this node does not lead,
// and that node looks for the leader itself. So a request that waited
// unread in a node that was stopped or cut off while it led is not passed
// on to the new leader when that node resumes, long after the node that
// sent it answered its client.
func route[T any](ctx context.Context, n *Node, write bool, local func(context.Context) (T, error), remote func(*wire.Client) (T, error)) (T, error) {
	var zero T
	// One hold timeout for all of this node's waits for a leader below,
	// counted from here (the time a remote takes counts against it too).
	// It is not sent on: a leader a request is forwarded to holds it for
	// up to its own hold timeout, if it is not ready yet.
	ctx = n.held(ctx)
	var deadline <-chan time.Time
	moved := false // a not_leader was followed at once to the leader raft names now
	for {
		v, err := local(ctx)
		var fw errForward
		if !errors.As(err, &fw) {
			return v, err
		}
		if wire.Forwarded(ctx) {
			return zero, notLeader(fw.addr)
		}
		c, err := n.fwd.client(ctx, fw.addr)
		if err == nil {
			v, err = remote(c)
			var fe *fencekv.Error
			switch {
			case err == nil:
				return v, nil
			case errors.As(err, &fe) && fe.Code == fencekv.CodeNotLeader:
				// The node raft named no longer leads, and did nothing
				// with the request. If raft names another leader
				// already, go there at once (once: the hold timeout may
				// have passed while the remote waited); else wait for
				// raft to name the new leader, and try again, as below.
				if addr, ok := n.leaderClientAddr(); ok && addr != fw.addr && !moved {
					moved = true
					continue
				}
				err = &fencekv.Error{Code: fencekv.CodeUnavailable, Message: fmt.Sprintf("the leader at %s stepped down, and no other took the request within %v", fw.addr, n.cfg.HoldTimeout)}
			default:
				ferr := n.fwd.forwardError(c, err, write)
				if !resendable(err, ferr) {
					return zero, ferr
				}
				// The connection to the leader broke (it may have
				// died) with a read in flight, or before a write left:
				// nothing was applied, so the request is sent again to
				// the leader raft names next, within the hold, as
				// below. A read so does not fail on a leader change
				// that a client would have to retry itself.
				err = ferr
			}
		}
		// The leader raft last named cannot be reached (it may have
		// died), or no longer leads: nothing was applied, so wait for a
		// new leader and try again, as while there is none.
		if deadline == nil {
			t := time.NewTimer(n.holdLeft(ctx))
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-deadline:
			return zero, err
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-n.stop:
			return zero, errClosed
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// resendable reports whether a forwarded request that failed with err
// (made into ferr by forwardError) may be sent again: the connection
// failed (not a refusal from the leader, not the request's own context
// ending) and nothing can have been applied (ferr has no unknown outcome:
// a read, or a write that never left).
func resendable(err, ferr error) bool {
	var fe *fencekv.Error
	if errors.As(err, &fe) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return errors.As(ferr, &fe) && fe.Code == fencekv.CodeUnavailable && fe.Outcome == ""
}

// notLeader answers a forwarded request on a node that does not lead,
// naming the leader at addr if it knows one: it is neither forwarded again
// nor held here (see route).
func notLeader(addr string) error {
	return &fencekv.Error{Code: fencekv.CodeNotLeader, Leader: addr,
		Message: "a forwarded request reached a node that does not lead; it is not forwarded again"}
}

// read runs fn on this node's state once a read may be answered here
// (linearizable, or stale if ctx allows), else forwards. onFollower marks
// reads a follower may answer from its own state after asking the leader
// for a read index (followerread.go).
func read[T any](ctx context.Context, n *Node, onFollower bool, fn func(context.Context) (T, error), remote func(*wire.Client) (T, error)) (T, error) {
	return route(ctx, n, false, func(ctx context.Context) (T, error) {
		if !fencekv.StaleReads(ctx) {
			err := n.readIndex(ctx)
			var fw errForward
			if onFollower && errors.As(err, &fw) && !wire.Forwarded(ctx) {
				err = n.followerRead(ctx, fw.addr)
			}
			if err != nil {
				var zero T
				return zero, err
			}
		}
		return fn(ctx)
	}, remote)
}

func (n *Node) write(ctx context.Context, c state.Command, w fencekv.WriteOptions, remote func(*wire.Client) (state.Result, error)) (state.Result, error) {
	if err := n.opts.CheckWrite(c.Key, c.Value, w); err != nil {
		return state.Result{}, err
	}
	c.Write.Token, c.Write.Strict, c.Lock = w.Token, w.Strict, w.Lock
	r, err := route(ctx, n, true, func(ctx context.Context) (state.Result, error) { return n.propose(ctx, c) }, remote)
	if err == nil {
		err = r.Err
	}
	if err != nil {
		// Refusals are logged on the node the client reached (which
		// knows its address), whichever node applied the write.
		n.refusals.Note(ctx, &c, err, n.m.Grantee)
	}
	return r, err
}

// Refusals returns the fenced writes refused on requests this node took,
// after sequence number since.
func (n *Node) Refusals(ctx context.Context, since uint64, limit int) ([]fencekv.Refusal, uint64, error) {
	limit, err := n.opts.Limit(limit)
	if err != nil {
		return nil, 0, err
	}
	rs, last := n.refusals.Since(since, limit)
	return rs, last, nil
}

func written(r state.Result, err error) (fencekv.WriteResult, error) {
	if err != nil {
		return fencekv.WriteResult{}, err
	}
	return fencekv.WriteResult{Fence: r.Entry.Fence, Revision: r.Entry.Revision}, nil
}

func entry(res fencekv.WriteResult) state.Result {
	var r state.Result
	r.Entry.Fence, r.Entry.Revision = res.Fence, res.Revision
	return r
}

// Put writes value to key once a quorum has it (G6).
func (n *Node) Put(ctx context.Context, key, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	return written(n.write(ctx, state.Command{Op: state.OpPut, Key: key, Value: value}, w, func(c *wire.Client) (state.Result, error) {
		res, err := c.Put(ctx, key, value, w)
		return entry(res), err
	}))
}

// Delete removes key; its fence survives.
func (n *Node) Delete(ctx context.Context, key []byte, w fencekv.WriteOptions) (bool, fencekv.WriteResult, error) {
	r, err := n.write(ctx, state.Command{Op: state.OpDelete, Key: key}, w, func(c *wire.Client) (state.Result, error) {
		deleted, res, err := c.Delete(ctx, key, w)
		r := entry(res)
		r.Deleted = deleted
		return r, err
	})
	res, err := written(r, err)
	return r.Deleted, res, err
}

// CAS writes value if key is at revision rev.
func (n *Node) CAS(ctx context.Context, key []byte, rev fencekv.Revision, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	return written(n.write(ctx, state.Command{Op: state.OpCAS, Key: key, Revision: rev, Value: value}, w, func(c *wire.Client) (state.Result, error) {
		res, err := c.CAS(ctx, key, rev, value, w)
		return entry(res), err
	}))
}

// Incr adds delta to the integer at key.
func (n *Node) Incr(ctx context.Context, key []byte, delta int64, w fencekv.WriteOptions) (int64, fencekv.WriteResult, error) {
	r, err := n.write(ctx, state.Command{Op: state.OpIncr, Key: key, Delta: delta}, w, func(c *wire.Client) (state.Result, error) {
		v, res, err := c.Incr(ctx, key, delta, w)
		r := entry(res)
		r.Int = v
		return r, err
	})
	res, err := written(r, err)
	return r.Int, res, err
}

// Get reads key, linearizably unless ctx allows stale reads.
func (n *Node) Get(ctx context.Context, key []byte) (fencekv.Entry, error) {
	if err := n.opts.CheckKey(key); err != nil {
		return fencekv.Entry{}, err
	}
	return read(ctx, n, true, func(context.Context) (fencekv.Entry, error) { return n.m.Get(key) },
		func(c *wire.Client) (fencekv.Entry, error) { return c.Get(ctx, key) })
}

type page[T any] struct {
	items []T
	more  bool
}

// Scan returns live keys in byte order.
func (n *Node) Scan(ctx context.Context, o fencekv.ScanOptions) ([]fencekv.Entry, bool, error) {
	limit, err := n.opts.Limit(o.Limit)
	if err != nil {
		return nil, false, err
	}
	p, err := read(ctx, n, true, func(context.Context) (page[fencekv.Entry], error) {
		items, more, err := n.m.Scan(o.Prefix, o.Start, limit, n.opts.MaxScanBytes)
		return page[fencekv.Entry]{items, more}, err
	}, func(c *wire.Client) (page[fencekv.Entry], error) {
		items, more, err := c.Scan(ctx, o)
		return page[fencekv.Entry]{items, more}, err
	})
	return p.items, p.more, err
}

// LockInfo describes a lock.
func (n *Node) LockInfo(ctx context.Context, name string) (fencekv.LockInfo, error) {
	if err := n.opts.CheckName(name); err != nil {
		return fencekv.LockInfo{}, err
	}
	return read(ctx, n, false, func(ctx context.Context) (fencekv.LockInfo, error) {
		info := func() (fencekv.LockInfo, error) { return n.m.LockInfo(n.now(), name) }
		if fencekv.StaleReads(ctx) {
			return info()
		}
		return fencekv.AfterExpiries(info, func(in fencekv.LockInfo) []fencekv.LockInfo { return []fencekv.LockInfo{in} },
			func(names []string) error { return n.commitExpiries(ctx, names) })
	}, func(c *wire.Client) (fencekv.LockInfo, error) { return c.LockInfo(ctx, name) })
}

// commitExpiries proposes the expiries of locks that a linearizable read
// found pending (fencekv.AfterExpiries), and waits until they are applied.
// The leader's expiry loop is about to propose them anyway; this only
// spares the reader its latency. A stale read does not wait for them.
func (n *Node) commitExpiries(ctx context.Context, locks []string) error {
	term, err := n.awaitReady(ctx)
	if err != nil {
		return err
	}
	return n.expire(locks, term)
}

// Locks lists held locks.
func (n *Node) Locks(ctx context.Context, prefix, start string, limit int) ([]fencekv.LockInfo, bool, error) {
	limit, err := n.opts.Limit(limit)
	if err != nil {
		return nil, false, err
	}
	p, err := read(ctx, n, false, func(ctx context.Context) (page[fencekv.LockInfo], error) {
		list := func() (page[fencekv.LockInfo], error) {
			items, more, err := n.m.Locks(n.now(), prefix, start, limit, n.opts.MaxScanBytes)
			return page[fencekv.LockInfo]{items, more}, err
		}
		if fencekv.StaleReads(ctx) {
			return list()
		}
		return fencekv.AfterExpiries(list, func(p page[fencekv.LockInfo]) []fencekv.LockInfo { return p.items },
			func(names []string) error { return n.commitExpiries(ctx, names) })
	}, func(c *wire.Client) (page[fencekv.LockInfo], error) {
		items, more, err := c.Locks(ctx, prefix, start, limit)
		return page[fencekv.LockInfo]{items, more}, err
	})
	return p.items, p.more, err
}

// Acquire takes a lock, on the leader; a blocking acquire queues there
// (FIFO within one leader's term; a leader change answers queued callers
// unavailable, and they queue again).
func (n *Node) Acquire(ctx context.Context, name string, ttl time.Duration, o *fencekv.AcquireOptions) (fencekv.Lease, error) {
	var ao fencekv.AcquireOptions
	if o != nil {
		ao = *o
	}
	if err := n.opts.CheckAcquire(name, ttl, ao); err != nil {
		return fencekv.Lease{}, err
	}
	return route(ctx, n, true, func(ctx context.Context) (fencekv.Lease, error) { return n.acquire(ctx, name, ttl, ao) },
		func(c *wire.Client) (fencekv.Lease, error) { return c.Acquire(ctx, name, ttl, &ao) })
}

func (n *Node) acquire(ctx context.Context, name string, ttl time.Duration, ao fencekv.AcquireOptions) (fencekv.Lease, error) {
	term, err := n.awaitReady(ctx)
	if err != nil {
		return fencekv.Lease{}, err
	}
	req := state.LeaseRequest{Name: name, TTL: ttl, Holder: ao.Holder, LockDelay: ao.LockDelay, Limit: ao.Limit}
	switch {
	case n.queues.Waiting(name) == 0:
		r, err := n.apply(state.Command{Op: state.OpAcquire, Lease: req}, term)
		if err != nil {
			return fencekv.Lease{}, err
		}
		if r.Err == nil {
			return fencekv.Lease{Name: name, Token: r.Grant.Token, TTL: r.Grant.TTL}, nil
		}
		if !errors.Is(r.Err, fencekv.ErrLockHeld) || ao.Wait == 0 {
			return fencekv.Lease{}, r.Err
		}
	case ao.Wait == 0:
		// Waiters come first (FIFO): the lock goes to them.
		return fencekv.Lease{}, n.lockHeld(name)
	}
	w := state.NewWaiter(state.LeaseRequest{Name: name, TTL: ttl, Holder: ao.Holder, LockDelay: ao.LockDelay, Limit: ao.Limit})
	if err := n.queues.Enqueue(w, n.opts.MaxWaiters); err != nil {
		return fencekv.Lease{}, err
	}
	n.kick(name) // the lock may have been freed since the refusal
	granted := func() (fencekv.Lease, error) {
		if w.Err != nil {
			return fencekv.Lease{}, w.Err
		}
		return fencekv.Lease{Name: name, Token: w.Grant.Token, TTL: w.Grant.TTL}, nil
	}
	timer := n.clock.NewTimer(ao.Wait)
	defer timer.Stop()
	select {
	case <-w.Done():
		return granted()
	case <-timer.C():
		if !n.queues.Cancel(w) {
			<-w.Done()
			return granted()
		}
		return fencekv.Lease{}, n.lockHeld(name)
	case <-ctx.Done():
		if !n.queues.Cancel(w) {
			// A hand-off took it from the queue: its outcome is the
			// answer's, not "not applied".
			<-w.Done()
			var fe *fencekv.Error
			switch {
			case w.Err == nil:
				// Nobody will use this grant: give the lock to the next.
				_, err := n.propose(context.Background(), state.Command{Op: state.OpRelease,
					Lease: state.LeaseRequest{Name: name}, Token: w.Grant.Token})
				msg := "the wait was cut short as the lock was granted; the grant was released again"
				if err != nil {
					msg = "the wait was cut short as the lock was granted; releasing the grant failed: " + err.Error()
				}
				return fencekv.Lease{}, &fencekv.Error{Code: fencekv.CodeUnavailable, Outcome: fencekv.OutcomeUnknown, Message: msg}
			case errors.As(w.Err, &fe) && fe.Outcome == fencekv.OutcomeUnknown:
				return fencekv.Lease{}, w.Err
			}
		}
		return fencekv.Lease{}, ctx.Err()
	}
}

func (n *Node) lockHeld(name string) error {
	in, err := n.m.LockInfo(n.now(), name)
	if err != nil {
		return err
	}
	return fencekv.LockHeld(in, n.opts.MinTTL)
}

// Renew gives the lease its full TTL again.
func (n *Node) Renew(ctx context.Context, name string, token fencekv.Token) (time.Duration, error) {
	if err := n.opts.CheckName(name); err != nil {
		return 0, err
	}
	c := state.Command{Op: state.OpRenew, Lease: state.LeaseRequest{Name: name}, Token: token}
	return route(ctx, n, true, func(ctx context.Context) (time.Duration, error) {
		r, err := n.propose(ctx, c)
		if err == nil {
			err = r.Err
		}
		return r.TTL, err
	}, func(cl *wire.Client) (time.Duration, error) { return cl.Renew(ctx, name, token) })
}

// Release frees the lock if token holds it.
func (n *Node) Release(ctx context.Context, name string, token fencekv.Token) error {
	if err := n.opts.CheckName(name); err != nil {
		return err
	}
	c := state.Command{Op: state.OpRelease, Lease: state.LeaseRequest{Name: name}, Token: token}
	_, err := route(ctx, n, true, func(ctx context.Context) (struct{}, error) {
		r, err := n.release(ctx, c)
		if err == nil {
			err = r.Err
		}
		return struct{}{}, err
	}, func(cl *wire.Client) (struct{}, error) { return struct{}{}, cl.Release(ctx, name, token) })
	return err
}

// Status describes this node and the store as this node has applied it.
func (n *Node) Status(ctx context.Context) (fencekv.Status, error) {
	s := fencekv.Status{
		Version:      fencekv.Version,
		Node:         n.cfg.Name,
		Role:         role(n.raft.State()),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.raft.AppliedIndex(),
	}
	if _, id := n.raft.LeaderWithID(); id != "" {
		if m, ok := n.mdel.meta(string(id)); ok {
			s.Leader = m.Client
		} else if string(id) == n.cfg.Name {
			s.Leader = n.cfg.ClientAddr
		}
	}
	c, err := n.m.Counters()
	s.Counters = c
	return s, err
}

// Txn applies ops, all or none, as one revision, if every compare holds.
func (n *Node) Txn(ctx context.Context, compares []fencekv.Compare, ops []fencekv.TxnOp, w fencekv.WriteOptions) (fencekv.Revision, []fencekv.TxnResult, error) {
	if err := n.opts.CheckTxn(compares, ops, w); err != nil {
		return 0, nil, err
	}
	c := state.Command{Op: state.OpTxn, Compares: compares, Ops: ops, Lock: w.Lock}
	c.Write.Token, c.Write.Strict = w.Token, w.Strict
	r, err := route(ctx, n, true, func(ctx context.Context) (state.Result, error) { return n.propose(ctx, c) },
		func(cl *wire.Client) (state.Result, error) {
			_, rs, err := cl.Txn(ctx, compares, ops, w)
			return state.Result{Txn: rs}, err
		})
	if err == nil {
		err = r.Err
	}
	if err != nil {
		n.refusals.Note(ctx, &c, err, n.m.Grantee)
		return 0, nil, err
	}
	return state.TxnRevision(r.Txn), r.Txn, nil
}

// Watch serves a watcher from this node's own applied log: any node
// serves watches, and events come once they are committed and applied
// here. A node that installs a snapshot ends its watchers (they resume,
// or are told compacted).
func (n *Node) Watch(ctx context.Context, o fencekv.WatchOptions) (*fencekv.Watcher, error) {
	return n.m.Watch(o)
}
