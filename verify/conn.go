package verify

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// A deployment is one server or the nodes of a cluster (Config.Addr is a
// comma-separated list). While verify runs, a cluster may lose its leader:
// calls are then answered `unavailable` (the command was not applied, or
// with outcome "unknown", it may have been) or their connection breaks.
// conn retries such calls on the next node, and tells its caller when a
// command's outcome is unknown, so that no count or check takes a guess
// for a fact.

// failoverBudget bounds how long a call keeps retrying through a failover.
const failoverBudget = time.Minute

// splitAddrs splits a comma-separated address list.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// conn is a connection to any node of a deployment, moved to the next
// address when its node fails a call. Safe for concurrent use.
type conn struct {
	addrs []string
	o     *wire.DialOptions // TLS and credentials

	mu   sync.Mutex
	next int
	c    *wire.Client
}

func newConn(addr string, o *wire.DialOptions) (*conn, error) {
	addrs := splitAddrs(addr)
	if len(addrs) == 0 {
		return nil, errors.New("verify: no server address")
	}
	return &conn{addrs: addrs, o: o}, nil
}

// client returns the current connection, dialing the next address that
// answers if there is none.
func (c *conn) client(ctx context.Context) (*wire.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		return c.c, nil
	}
	var errs []error
	for range c.addrs {
		addr := c.addrs[c.next%len(c.addrs)]
		c.next++
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		cl, err := wire.DialWith(dctx, addr, c.o)
		cancel()
		if err == nil {
			c.c = cl
			return cl, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// drop closes cl if it is the current connection, so the next call dials
// the next node.
func (c *conn) drop(cl *wire.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == cl {
		c.c.Close()
		c.c = nil
	}
}

// Close closes the connection.
func (c *conn) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
}

// transient reports whether err is a failure of the node or the cluster
// rather than an answer: unavailable, a broken connection, a failed
// dial. unknown says the command may have been applied.
func transient(err error) (retry, unknown bool) {
	var fe *fencekv.Error
	switch {
	case err == nil:
		return false, false
	case errors.As(err, &fe):
		if fe.Code != fencekv.CodeUnavailable {
			return false, false // a refusal: an answer
		}
		return true, fe.Outcome == fencekv.OutcomeUnknown
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false, false
	}
	var ce *wire.ConnError
	if errors.As(err, &ce) {
		// The client knows whether anything of the call was sent.
		return true, ce.Outcome == fencekv.OutcomeUnknown
	}
	return true, true // the connection broke: the request may have arrived
}

// do runs fn until it is answered (or fails for good), moving to another
// node after a transient failure. unknown reports whether a transient
// failure left an earlier attempt's outcome unknown: for a command that
// is not idempotent the caller must not retry it blindly, so with once do
// returns after the first such failure, with its error.
func (c *conn) do(ctx context.Context, once bool, fn func(*wire.Client) error) (unknown bool, err error) {
	deadline := time.Now().Add(failoverBudget)
	backoff := 20 * time.Millisecond
	for {
		cl, derr := c.client(ctx)
		if derr == nil {
			err = fn(cl)
			retry, unk := transient(err)
			if !retry {
				return unknown, err
			}
			c.drop(cl)
			unknown = unknown || unk
			if unk && once {
				return true, err
			}
		} else {
			err = derr
		}
		if time.Now().After(deadline) {
			return unknown, fmt.Errorf("no node answered for %v: %w", failoverBudget, err)
		}
		select {
		case <-ctx.Done():
			return unknown, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// lockInfo looks lock up, through failovers.
func (c *conn) lockInfo(ctx context.Context, lock string) (in fencekv.LockInfo, err error) {
	err = c.call(ctx, func(cl *wire.Client) error {
		in, err = cl.LockInfo(ctx, lock)
		return err
	})
	return in, err
}

// call runs an idempotent call (a read, or a write that may be repeated)
// until it is answered.
func (c *conn) call(ctx context.Context, fn func(*wire.Client) error) error {
	_, err := c.do(ctx, false, fn)
	return err
}

// acquire takes lock for holder (which must name this one caller), through
// failovers: once an acquire's outcome is unknown, the lock may be this
// caller's already, so whenever a later attempt finds it held, or is
// unknown too, it looks whether the lock's holder is o.Holder, and takes
// that grant. The bool reports whether an attempt's outcome was left
// unknown: that attempt may still be granted later, after this grant (a
// node stopped with the request unread serves it when it resumes), so the
// lock may come to be held by a newer token under o.Holder.
func (c *conn) acquire(ctx context.Context, lock string, ttl time.Duration, o fencekv.AcquireOptions) (fencekv.Lease, bool, error) {
	deadline := time.Now().Add(failoverBudget)
	mine := false // an attempt's outcome is unknown: a grant may be ours
	for {
		var l fencekv.Lease
		unknown, err := c.do(ctx, true, func(cl *wire.Client) error {
			var err error
			l, err = cl.Acquire(ctx, lock, ttl, &o)
			return err
		})
		mine = mine || unknown
		if err == nil || !mine || !unknown && !errors.Is(err, fencekv.ErrLockHeld) {
			return l, mine, err
		}
		in, err := c.lockInfo(ctx, lock)
		if err != nil {
			return l, mine, err
		}
		switch {
		case in.Held && in.Holder == o.Holder:
			return fencekv.Lease{Name: lock, Token: in.Token, TTL: ttl}, mine, nil
		case in.Held && !unknown:
			return l, mine, err // held by another caller: a real refusal
		case time.Now().After(deadline):
			return l, mine, fmt.Errorf("acquire %s: no answer for %v", lock, failoverBudget)
		}
	}
}
