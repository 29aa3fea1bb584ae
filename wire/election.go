package wire

// Leader election over the wire: the composition of PROTOCOL.md §12,
// with WithLock keeping the leadership's lease.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
)

// errResigned ends a leadership's context when it is resigned.
var errResigned = fencekv.ErrResigned

// Campaign blocks until this client leads the election name with value,
// or ctx ends (PROTOCOL.md §12). It acquires the lock name under the
// holder value, queueing (first come, first served) for o.Wait at a time
// and again when that runs out, through reconnects and cluster failovers.
// An acquire whose answer was lost is looked up: held under value, the
// grant is released and the campaign goes on (give each candidate a value
// of its own). ctx bounds the campaign only; the leadership lasts until
// Resign, or until it may be lost: its Context then ends with a cause
// matching both fencekv.ErrLeadershipLost and ErrLeaseLost, o.Margin
// before the lease may run out on the server.
func (c *Client) Campaign(ctx context.Context, name, value string, ttl time.Duration, o *fencekv.CampaignOptions) (*fencekv.Leadership, error) {
	if err := fencekv.CheckCampaign(name, value, ttl, o); err != nil {
		return nil, err
	}
	pause := 20 * time.Millisecond
	for {
		l, err := c.campaignOnce(ctx, name, value, ttl, o)
		if err == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		switch {
		case errors.Is(err, fencekv.ErrLockHeld):
			pause = 20 * time.Millisecond
			continue // the wait ran out: queue again
		case unknownOutcome(err):
			// Granted, perhaps: a lease under our value is ours; free it
			// rather than hold the election up until it runs out.
			c.retry(context.WithoutCancel(ctx), 5*time.Second, func(ctx context.Context) error {
				in, ierr := c.LockInfo(ctx, name)
				if ierr == nil && in.Held && in.Holder == value {
					ierr = c.Release(ctx, name, in.Token)
				}
				return ierr
			})
		case retryable(err):
		default:
			return nil, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (%w)", ctx.Err(), err)
		case <-c.closing:
			t.Stop()
			return nil, ErrClientClosed
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

// campaignOnce is one acquire of a campaign, run by WithLock in a
// goroutine that keeps the leadership once granted.
func (c *Client) campaignOnce(ctx context.Context, name, value string, ttl time.Duration, o *fencekv.CampaignOptions) (*fencekv.Leadership, error) {
	// ctx ends the wait; once granted, only Resign or a loss end lctx.
	wctx, stopWait := context.WithCancelCause(context.WithoutCancel(ctx))
	unhook := context.AfterFunc(ctx, func() { stopWait(context.Cause(ctx)) })
	lo := &LockOptions{
		AcquireOptions: fencekv.AcquireOptions{Holder: value, Wait: fencekv.CampaignWait(ctx, o)},
		Margin:         fencekv.CampaignMargin(o, ttl),
	}
	granted := make(chan *fencekv.Leadership, 1)
	ended := make(chan error, 1)
	resign := make(chan struct{})
	var once sync.Once
	go func() {
		ended <- c.WithLock(wctx, name, ttl, lo, func(lctx context.Context, l fencekv.Lease) error {
			if !unhook() {
				return context.Cause(wctx) // ctx ended as it was granted: release
			}
			// The leadership's context: ends on Resign, or with a cause
			// matching ErrLeadershipLost (and ErrLeaseLost) on a loss.
			// (Not an AfterFunc of lctx: its stop, deferred, could
			// win the race with lctx's end and leave hctx running.)
			hctx, cancel := context.WithCancelCause(context.WithoutCancel(lctx))
			var rerr error
			res := func(rctx context.Context) error {
				once.Do(func() {
					close(resign)
					select {
					case rerr = <-ended:
					case <-rctx.Done():
						rerr = rctx.Err()
					}
				})
				return leftLeadership(rerr)
			}
			granted <- fencekv.NewLeadership(l, value, hctx, res)
			select {
			case <-resign:
				cancel(errResigned)
			case <-lctx.Done():
				// Lost: WithLock releases the lock if the server still
				// holds it for this lease.
				cancel(fmt.Errorf("%w: %w", fencekv.ErrLeadershipLost, context.Cause(lctx)))
			}
			return nil
		})
	}()
	select {
	case l := <-granted:
		return l, nil
	case err := <-ended:
		unhook()
		stopWait(nil)
		return nil, err
	}
}

// leftLeadership is what Resign returns for WithLock's end: nil if the
// lock was released, or was no longer this leadership's.
func leftLeadership(err error) error {
	if err == nil || errors.Is(err, ErrLeaseLost) || errors.Is(err, fencekv.ErrNotHolder) || errors.Is(err, fencekv.ErrLeaseExpired) {
		return nil
	}
	return err
}

// Leader reads the election name once (lock_info): a lease run out whose
// expiry is not applied yet counts as leading, with TTL 0.
func (c *Client) Leader(ctx context.Context, name string) (fencekv.Leader, error) {
	in, err := c.LockInfo(ctx, name)
	if err != nil {
		return fencekv.Leader{}, err
	}
	in.Name = name
	return fencekv.LeaderOf(in), nil
}

// Observe streams the election's state (leader value and epoch, or no
// leader) as it changes, starting with the current one, as PROTOCOL.md
// §12 gives it: a watch of the lock's events on a connection of its own
// (to any of the client's addresses), a lock_info after it started and
// after each event of the lock. Epochs rise strictly; leaders that come
// and go between two reads are coalesced; the latest state is always
// delivered. It goes on through reconnects and failovers until ctx ends,
// when the channel is closed.
func (c *Client) Observe(ctx context.Context, name string) (<-chan fencekv.Leader, error) {
	watch := func(ctx context.Context) (<-chan []fencekv.Event, func(), error) {
		w, err := WatchWith(ctx, c.addrs, fencekv.WatchOptions{Prefix: []byte(name), Locks: true}, &c.opts)
		if err != nil {
			return nil, nil, err
		}
		return w.Events(), func() { w.Close() }, nil
	}
	read := func(ctx context.Context) (l fencekv.Leader, err error) {
		err = c.retry(ctx, 5*time.Second, func(ctx context.Context) (rerr error) {
			l, rerr = c.Leader(ctx, name)
			return rerr
		})
		return l, err
	}
	return fencekv.ObserveElection(ctx, name, watch, read)
}
