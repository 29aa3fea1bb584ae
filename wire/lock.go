package wire

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
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
	// RenewEvery is the renew period; 0 means a third of the TTL less
	// Margin. A renew that fails for want of a connection or a leader
	// (anything but a refusal) is tried again sooner, every quarter of
	// the period.
	RenewEvery time.Duration
	// ReleaseTimeout bounds the final release; 0 means 5s. Within it, a
	// release that fails with the connection (or unavailable) is tried
	// again, so that a lock whose server is back in time is released.
	ReleaseTimeout time.Duration
	// Margin is how long before the lease may run out fn's context is
	// cancelled: time for fn to stop what it does before the server may
	// expire the lease and grant the lock to another. 0: none (the
	// context ends as the lease may run out); it must be shorter than the
	// TTL.
	Margin time.Duration
}

// WithLock acquires name for ttl (waiting up to o.Wait), calls fn with a
// context and the lease, keeps the lease alive while fn runs, and releases
// it when fn returns.
//
// fn's context is cancelled, with cause ErrLeaseLost, as soon as the lease
// may be lost: when a renew is refused (not_holder, lease_expired), or when
// the time since the last successful renew's request was sent (or since the
// acquire was sent) reaches the TTL less o.Margin — measured on this
// machine's clock, so it fires even if the server or the network is stuck.
// Because the server measures the same lease from a later moment, the
// client always gives up first, by at least the margin: give fn the time
// it needs to stop as the margin. fn's context is also cancelled with
// ErrLeaseLost (and ErrClientClosed) when the client is closed, since no
// renew can be sent then. fn should still pass l.Token with every write (fencekv.WriteOptions
// {Token: l.Token}): the fence is what stops a write that was already on
// its way.
//
// A broken connection alone does not lose the lease: the renews go on
// through the client's next connection (to the same server restarted, or
// to another node of a cluster), and fn's context is cancelled only if
// none succeeds within the TTL. Each renew gets one period; a client with
// several addresses leaves a node that did not answer within it, or
// answered unavailable (a paused node, one cut off from the others), for
// the next address. The lease lives on the server, not in the
// connection, and a server restart or a new leader gives it its full TTL
// again.
//
// An acquire whose answer is lost (the connection broke after it was
// sent, a cluster answered unavailable with the outcome unknown, or ctx
// ended) may have been granted all the same. With no o.Holder, WithLock
// acquires under a holder name of its own (host:pid and a random suffix)
// and then looks the lock up: held under that name, the grant is this
// call's, and fn runs with it (renewed at once), or, if ctx has ended, it
// is released rather than left to hold the lock up until it runs out.
// The look-up takes at most o.ReleaseTimeout, also after ctx has ended
// (a server that does not answer). With a holder name of the caller's,
// which others may use too, an unknown outcome is returned as it is. When
// ctx has ended, the error WithLock returns matches ctx's.
//
// The renewing is done by two goroutines of the client, started after the
// acquire: one keeps the lease (ticks, deadline) and one sends the renews,
// one at a time. Both have ended when WithLock returns, and Close waits
// for them.
//
// When fn returns, the lock is released, unless a renew was refused (it
// is not this lease's any more) or the client is closed; after a lost
// lease too, for the server may still hold it (it was back too late for
// the renews, but has given the lease its full TTL again): the release
// of a lease that has ended is refused and changes nothing.
//
// WithLock returns fn's error; if the lease was lost, the error also
// matches ErrLeaseLost (errors.Is), even when fn returned its context's
// error or nil (then it is the cause, wrapping ErrLeaseLost). If the
// client was closed between the acquire and the start of the renewing,
// fn is not called and WithLock returns ErrClientClosed.
func (c *Client) WithLock(ctx context.Context, name string, ttl time.Duration, o *LockOptions,
	fn func(ctx context.Context, l fencekv.Lease) error) error {
	var lo LockOptions
	if o != nil {
		lo = *o
	}
	if lo.Margin < 0 || lo.Margin >= ttl {
		return &fencekv.Error{Code: fencekv.CodeBadRequest, Message: fmt.Sprintf("lock margin %v: want 0 or more, and shorter than the TTL of %v", lo.Margin, ttl)}
	}
	timeout := lo.ReleaseTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ours := lo.Holder == "" // a holder name no one else uses: see findGrant
	if ours {
		lo.Holder = uniqueHolder()
	}
	sent := time.Now()
	l, reached, err := c.acquire(ctx, name, ttl, &lo.AcquireOptions)
	found := false
	if err != nil && ours && reached && unknownOutcome(err) {
		l, err = c.findGrant(ctx, name, ttl, lo.Holder, timeout, err)
		found = err == nil
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			// The connection broke as ctx ended: say both.
			err = fmt.Errorf("%w (%w)", cerr, err)
		}
		return err
	}
	if lo.AcquireOptions.Wait > 0 || found {
		// A queued grant's lease started when it was granted, some time
		// after the request was sent; the client cannot know when (nor
		// when a grant found by findGrant was made). Renew at once so the
		// lease is measured from a send time we know.
		sent = time.Now()
		if _, err := c.Renew(ctx, name, l.Token); err != nil {
			c.release(context.WithoutCancel(ctx), name, l.Token, timeout)
			return err
		}
	}
	every := lo.RenewEvery
	if every <= 0 {
		every = (ttl - lo.Margin) / 3
	}
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	keeperDone := make(chan struct{})
	stop := make(chan struct{})
	if !c.spawn(func() {
		defer close(keeperDone)
		c.keepAlive(lctx, cancel, l, sent, every, lo.Margin, stop)
	}) {
		// Closed since the acquire: the lease can be neither kept nor
		// released, and runs out on the server.
		return ErrClientClosed
	}
	ferr := fn(lctx, l)
	close(stop)
	<-keeperDone
	lost := context.Cause(lctx)
	if !errors.Is(lost, ErrLeaseLost) {
		lost = nil
	}
	refused := errors.Is(lost, fencekv.ErrNotHolder) || errors.Is(lost, fencekv.ErrLeaseExpired)
	if !refused && !errors.Is(lost, ErrClientClosed) {
		err := c.release(context.WithoutCancel(ctx), name, l.Token, timeout)
		if err != nil && ferr == nil && lost == nil &&
			!errors.Is(err, fencekv.ErrNotHolder) && !errors.Is(err, fencekv.ErrLeaseExpired) {
			return fmt.Errorf("wire: release %q: %w", name, err)
		}
	}
	switch {
	case lost == nil:
		return ferr
	case ferr == nil || errors.Is(lost, ferr):
		return lost
	}
	return fmt.Errorf("%w (%w)", ferr, lost)
}

// uniqueHolder is the holder name WithLock acquires with when none is
// given: host:pid and a random suffix, so that a lock held under it is
// known to be this call's.
func uniqueHolder() string {
	host, _ := os.Hostname()
	var b [6]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%x", host, os.Getpid(), b)
}

// unknownOutcome reports whether err leaves the outcome of an acquire that
// was sent unknown: its answer was lost (the connection broke, a cluster
// answered unavailable with outcome unknown, or ctx ended).
func unknownOutcome(err error) bool {
	var ce *ConnError
	var fe *fencekv.Error
	switch {
	case errors.As(err, &ce):
		return ce.Outcome == fencekv.OutcomeUnknown
	case errors.As(err, &fe):
		return fe.Outcome == fencekv.OutcomeUnknown
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// findGrant looks for the grant of an acquire whose outcome is unknown
// (failed with err), made under holder, a name only this call uses. If
// the lock is held under it, the acquire was granted: while ctx lasts the
// grant is the caller's (WithLock renews it at once, having no send time
// to measure it from); once ctx has ended it is released, so
// that it does not hold the lock up until it runs out. Otherwise, or if
// the lock cannot be looked up, err is returned: a grant made after the
// look-up runs out after its TTL, as before.
func (c *Client) findGrant(ctx context.Context, name string, ttl time.Duration, holder string, timeout time.Duration, err error) (fencekv.Lease, error) {
	var in fencekv.LockInfo
	if c.retry(context.WithoutCancel(ctx), timeout, func(ctx context.Context) (ierr error) {
		in, ierr = c.LockInfo(ctx, name)
		return ierr
	}) != nil {
		return fencekv.Lease{}, err
	}
	token, held := heldBy(in, holder) // a semaphore's permits too (semaphore.go)
	if !held {
		return fencekv.Lease{}, err
	}
	if ctx.Err() != nil {
		c.release(context.WithoutCancel(ctx), name, token, timeout)
		return fencekv.Lease{}, err
	}
	return fencekv.Lease{Name: name, Token: token, TTL: ttl}, nil
}

// release releases the lease within timeout, trying again while it fails
// with the connection or as unavailable (the server may be coming back).
func (c *Client) release(ctx context.Context, name string, token fencekv.Token, timeout time.Duration) error {
	return c.retry(ctx, timeout, func(ctx context.Context) error { return c.Release(ctx, name, token) })
}

// retry calls call until it succeeds or fails for good (a refusal, the
// client closed), within timeout. Each try gets a third of the time, and a
// node that does not answer within it, or fails with the connection or as
// unavailable, is left for the next address; after the latter the next
// try waits, 20 ms and doubling up to 500 ms. It returns the last error.
func (c *Client) retry(ctx context.Context, timeout time.Duration, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pause := 20 * time.Millisecond
	for {
		cn := c.cur.Load()
		actx, acancel := context.WithTimeout(ctx, timeout/3)
		err := call(actx)
		silent := err != nil && actx.Err() != nil && ctx.Err() == nil
		acancel()
		if silent {
			c.leave(cn, err)
			continue
		}
		if err == nil || err == ErrClientClosed || !retryable(err) {
			return err
		}
		c.leave(cn, err)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-c.closing:
			t.Stop()
			return err
		case <-t.C:
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// leave makes the client's next call go to its next address, if it has
// several and cn is still its connection: cn's node did not answer a lock
// call in time, or answered that it could not serve it (no leader). The
// calls still waiting on cn fail with it (their outcome unknown, as when a
// connection breaks): that node was not answering them either.
func (c *Client) leave(cn *link, why error) {
	if len(c.addrs) < 2 || why == nil || c.cur.Load() != cn {
		return
	}
	cn.fail(fmt.Errorf("wire: left %s for the next address: %w", cn.addr, why))
}

// retryable reports whether a lock call that failed with err may succeed
// if sent again: the connection failed, or the server had no leader or
// was shutting down. A refusal is final.
func retryable(err error) bool {
	var fe *fencekv.Error
	if errors.As(err, &fe) {
		return fe.Code == fencekv.CodeUnavailable || fe.Code == fencekv.CodeNotLeader
	}
	return errors.Is(err, ErrClientClosed)
}

// keepAlive renews l every period until stop closes, and cancels with
// ErrLeaseLost once the lease may be lost. sent is when the request that
// last gave the lease its full TTL was sent. The renews are sent by one
// goroutine, started here and ended before keepAlive returns.
func (c *Client) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, l fencekv.Lease, sent time.Time, every, margin time.Duration, stop <-chan struct{}) {
	ttl := l.TTL
	// When the lease is taken as lost: margin before it may run out.
	keep := ttl - margin
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
			// A renew gets one period: a node that does not answer
			// within it (paused, cut off from the others, without a
			// leader) is left for the next address, so that the renews
			// after it reach a live leader well within the TTL.
			cn := c.cur.Load()
			actx, acancel := context.WithDeadline(rctx, at.Add(min(ttl, every)))
			_, err := c.Renew(actx, l.Name, l.Token)
			silent := err != nil && actx.Err() != nil && rctx.Err() == nil
			acancel()
			if silent || retryable(err) {
				c.leave(cn, err)
			}
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
	deadline := time.NewTimer(time.Until(sent.Add(keep)))
	defer deadline.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	// After a renew that failed without a refusal, the next is sent
	// sooner than the next tick: the server (or a new leader) may be back.
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var lastErr error
	inflight := false
	send := func() {
		if !inflight {
			inflight = true
			renew <- time.Now()
		}
	}
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
			why := ""
			if lastErr != nil {
				why = fmt.Sprintf(" (last: %v)", lastErr)
			}
			within := fmt.Sprintf("its TTL of %v", ttl)
			if margin > 0 {
				within = fmt.Sprintf("%v of its TTL of %v (a margin of %v)", keep, ttl, margin)
			}
			cancel(fmt.Errorf("%w: no renew of %q (token %d) succeeded within %s%s", ErrLeaseLost, l.Name, l.Token, within, why))
			return
		case <-tick.C:
			send()
		case <-retry.C:
			send()
		case r := <-results:
			inflight = false
			switch {
			case r.err == nil:
				lastErr = nil
				if r.sent.After(sent) {
					sent = r.sent
					deadline.Reset(time.Until(sent.Add(keep)))
				}
			case errors.Is(r.err, fencekv.ErrNotHolder), errors.Is(r.err, fencekv.ErrLeaseExpired):
				cancel(fmt.Errorf("%w: %w", ErrLeaseLost, r.err))
				return
			default:
				// Connection trouble, no leader, a renew that timed
				// out: the deadline decides; until then, try again.
				lastErr = r.err
				retry.Reset(max(every/4, time.Millisecond))
			}
		}
	}
}
