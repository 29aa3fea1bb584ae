package cluster

import (
	"context"
	"errors"
	"sync"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// forwarder keeps one connection to the leader's client address and sends
// other nodes' requests there: one hop, over the same protocol clients
// speak.
type forwarder struct {
	n      *Node
	mu     sync.Mutex // guards c, addr, leader, closed
	c      *wire.Client
	addr   string
	leader string // the leader's client address raft last named ("" none, or this node)
	closed bool
}

// client returns a connection to addr, dialing one if needed.
func (f *forwarder) client(ctx context.Context, addr string) (*wire.Client, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, errClosed
	}
	if f.c != nil && f.addr == addr {
		return f.c, nil
	}
	if f.c != nil {
		f.c.Close()
		f.c = nil
	}
	c, err := f.n.dial(ctx, addr)
	if err != nil {
		return nil, &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "cannot reach the leader: " + err.Error()}
	}
	f.c, f.addr = c, addr
	return c, nil
}

// dial connects to another node's client address: with TLS and this
// node's certificate, when the client port is TLS (Config.Dial). The
// connection is marked as a forwarder's, so that the node it reaches
// never forwards these requests again (one hop; see route).
func (n *Node) dial(ctx context.Context, addr string) (*wire.Client, error) {
	var c *wire.Client
	var err error
	if n.cfg.Dial != nil {
		c, err = n.cfg.Dial(ctx, addr)
	} else {
		c, err = wire.Dial(ctx, addr)
	}
	if err != nil {
		return nil, err
	}
	if err := c.Forwarding(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// leaderChanged drops the connection to a node that no longer leads:
// requests in flight there fail (a write's outcome is unknown), so that a
// client is never left waiting on an old leader that is paused or cut
// off.
func (f *forwarder) leaderChanged(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leader = addr
	if f.c != nil && f.addr != addr {
		f.c.Close()
		f.c = nil
	}
}

// broken drops c after a connection error, so the next call redials.
func (f *forwarder) broken(c *wire.Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c != nil && f.c == c {
		f.c.Close()
		f.c = nil
	}
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.c != nil {
		f.c.Close()
		f.c = nil
	}
}

// forwardError turns a failure to reach the leader into unavailable;
// write says the request may have been applied before the connection
// broke, unless it was never sent (a *wire.ConnError without an outcome:
// the forwarder could not dial the leader again). A write cut short here
// (its context ended: a shutdown, the client gone, a deadline) while the
// leader had it may still be applied there: its outcome is unknown too.
func (f *forwarder) forwardError(c *wire.Client, err error, write bool) error {
	var fe *fencekv.Error
	if errors.As(err, &fe) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if !write {
			return err
		}
		return &fencekv.Error{Code: fencekv.CodeUnavailable, Outcome: fencekv.OutcomeUnknown,
			Message: "cut short while the leader had the request (" + err.Error() + "): it may still be applied"}
	}
	f.broken(c)
	var ce *wire.ConnError
	if errors.As(err, &ce) && ce.Outcome == "" {
		// The request never went out: the connection to the leader
		// was gone and could not be made again (or TLS refused it).
		return &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "cannot reach the leader (the request was not sent): " + err.Error()}
	}
	e := &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "lost the connection to the leader: " + err.Error()}
	if write {
		e.Outcome = fencekv.OutcomeUnknown
	}
	return e
}
