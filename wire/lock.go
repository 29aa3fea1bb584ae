package wire

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekv/fencekv"
)

// ErrLeaseLost is the cause of a WithLock callback's context when the lease
// may have been lost: a renew was refused, or no renew succeeded within the
// TTL.
var ErrLeaseLost = errors.New("wire: lease lost")

// LockOptions tune WithLock. The zero value acquires only if the lock is
// free and renews every third of the TTL.
type LockOptions struct {
	fencekv.AcquireOptions
	// RenewEvery is the renew period; 0 means TTL/3.
	RenewEvery time.Duration
	// ReleaseTimeout bounds the final release; 0 means 5s.
	ReleaseTimeout time.Duration
}

// WithLock acquires name for ttl (waiting up to o.Wait), calls fn with a
// context and the lease, keeps the lease alive while fn runs, and releases
// it when fn returns.
//
// fn's context is cancelled, with cause ErrLeaseLost, as soon as the lease
// may be lost: when a renew is refused (not_holder, lease_expired), or when
// the time since the last successful renew's request was sent (or since the
// acquire was sent) reaches the TTL — measured on this machine's clock, so
// it fires even if the server or the network is stuck. Because the server
// measures the same lease from a later moment, the client always gives up
// first. fn's context is also cancelled with ErrLeaseLost (and
// ErrClientClosed) when the client is closed, since no renew can be sent
// then. fn should still pass l.Token with every write (fencekv.WriteOptions
// {Token: l.Token}): the fence is what stops a write that was already on
// its way.
//
// The renewing is done by two goroutines of the client, started after the
// acquire: one keeps the lease (ticks, deadline) and one sends the renews,
// one at a time. Both have ended when WithLock returns, and Close waits
// for them.
//
// WithLock returns fn's error; if fn returned nil but the lease was lost,
// it returns an error wrapping ErrLeaseLost. If the client was closed
// between the acquire and the start of the renewing, fn is not called and
// WithLock returns ErrClientClosed.
func (c *Client) WithLock(ctx context.Context, name string, ttl time.Duration, o *LockOptions,
	fn func(ctx context.Context, l fencekv.Lease) error) error {
	var lo LockOptions
	if o != nil {
		lo = *o
	}
	sent := time.Now()
	l, err := c.Acquire(ctx, name, ttl, &lo.AcquireOptions)
	if err != nil {
		return err
	}
	if lo.AcquireOptions.Wait > 0 {
		// A queued grant's lease started when it was granted, some time
		// after the request was sent; the client cannot know when. Renew
		// at once so the lease is measured from a send time we know.
		sent = time.Now()
		if _, err := c.Renew(ctx, name, l.Token); err != nil {
			c.Release(context.WithoutCancel(ctx), name, l.Token)
			return err
		}
	}
	every := lo.RenewEvery
	if every <= 0 {
		every = ttl / 3
	}
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	keeperDone := make(chan struct{})
	stop := make(chan struct{})
	if !c.spawn(func() {
		defer close(keeperDone)
		c.keepAlive(lctx, cancel, l, sent, every, stop)
	}) {
		// Closed since the acquire: the lease can be neither kept nor
		// released, and runs out on the server.
		return ErrClientClosed
	}
	ferr := fn(lctx, l)
	close(stop)
	<-keeperDone
	lost := context.Cause(lctx)
	timeout := lo.ReleaseTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer rcancel()
	if !errors.Is(lost, ErrLeaseLost) {
		if err := c.Release(rctx, name, l.Token); err != nil && ferr == nil &&
			!errors.Is(err, fencekv.ErrNotHolder) && !errors.Is(err, fencekv.ErrLeaseExpired) {
			return fmt.Errorf("wire: release %q: %w", name, err)
		}
	}
	if ferr != nil {
		return ferr
	}
	if errors.Is(lost, ErrLeaseLost) {
		return lost
	}
	return nil
}

// keepAlive renews l every period until stop closes, and cancels with
// ErrLeaseLost once the lease may be lost. sent is when the request that
// last gave the lease its full TTL was sent. The renews are sent by one
// goroutine, started here and ended before keepAlive returns.
func (c *Client) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, l fencekv.Lease, sent time.Time, every time.Duration, stop <-chan struct{}) {
	ttl := l.TTL
	closed := func() {
		cancel(fmt.Errorf("%w: no renew of %q (token %d) can be sent: %w", ErrLeaseLost, l.Name, l.Token, ErrClientClosed))
	}
	type renewed struct {
		sent time.Time
		err  error
	}
	// At most one renew is in flight: a request is sent on renew only
	// when the last result has come back, so neither channel blocks.
	renew := make(chan time.Time, 1)
	results := make(chan renewed, 1)
	rctx, rcancel := context.WithCancel(ctx)
	renewerDone := make(chan struct{})
	if !c.spawn(func() {
		defer close(renewerDone)
		for at := range renew {
			actx, acancel := context.WithDeadline(rctx, at.Add(ttl))
			_, err := c.Renew(actx, l.Name, l.Token)
			acancel()
			results <- renewed{at, err}
		}
	}) {
		rcancel()
		closed()
		return
	}
	defer func() {
		// A renew in flight is abandoned: what it would tell no longer
		// matters.
		rcancel()
		close(renew)
		<-renewerDone
	}()
	deadline := time.NewTimer(time.Until(sent.Add(ttl)))
	defer deadline.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	inflight := false
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-c.closing:
			closed()
			return
		case <-deadline.C:
			cancel(fmt.Errorf("%w: no renew of %q (token %d) succeeded within its TTL of %v", ErrLeaseLost, l.Name, l.Token, ttl))
			return
		case <-tick.C:
			if inflight {
				continue
			}
			inflight = true
			renew <- time.Now()
		case r := <-results:
			inflight = false
			switch {
			case r.err == nil:
				if r.sent.After(sent) {
					sent = r.sent
					deadline.Reset(time.Until(sent.Add(ttl)))
				}
			case errors.Is(r.err, fencekv.ErrNotHolder), errors.Is(r.err, fencekv.ErrLeaseExpired):
				cancel(fmt.Errorf("%w: %v", ErrLeaseLost, r.err))
				return
			}
			// Other errors (connection trouble) are retried at the next
			// tick; the deadline decides.
		}
	}
}
