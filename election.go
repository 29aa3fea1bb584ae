package fencekv

// Leader election, a composition of the lock calls (wire/PROTOCOL.md §12):
// an election is the lock of the same name, the leader's value is the
// lock's holder, and the epoch is the lock's token.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrLeadershipLost is the cause of a Leadership's context when it may
// have been lost: a renew was refused, or none succeeded in time.
var ErrLeadershipLost = errors.New("fencekv: leadership lost")

// ErrResigned is the cause of a Leadership's context after Resign.
var ErrResigned = errors.New("fencekv: resigned")

// MaxValue is the longest leader value: the lock holder's limit.
const MaxValue = 4096

// Leader is the state of an election as Leader and Observe report it.
type Leader struct {
	Name  string
	Held  bool          // someone leads; false: no leader
	Value string        // the leader's value (the lock's holder); "" when not held
	Token Token         // the epoch when held; when not, the last epoch if still known, else 0
	TTL   time.Duration // lease time left; 0 when held but expiring (still the leader until the expiry is applied)
}

// LeaderOf is the election state shown by a lock's info.
func LeaderOf(in LockInfo) Leader {
	l := Leader{Name: in.Name, Held: in.Held, Token: in.Token, TTL: in.TTL}
	if in.Held {
		l.Value = in.Holder
	}
	return l
}

// Leadership is a won election: the lease of the election's lock, kept
// alive until Resign or until it may be lost (Done, Err).
type Leadership struct {
	Lease        // Name, Token (the epoch) and TTL
	Value string // the leader's value
	ctx   context.Context
	stop  func(ctx context.Context) error
}

// NewLeadership makes the handle of a leadership: ctx ends when it may be
// lost (its cause wrapping ErrLeadershipLost), resign gives it up. For
// packages that campaign over another transport (the wire client).
func NewLeadership(l Lease, value string, ctx context.Context, resign func(ctx context.Context) error) *Leadership {
	return &Leadership{Lease: l, Value: value, ctx: ctx, stop: resign}
}

// Context ends when the leadership may be lost or has been resigned; pass
// it to the leader's work. Its cause (context.Cause) wraps
// ErrLeadershipLost after a loss.
func (l *Leadership) Context() context.Context { return l.ctx }

// Done is closed when the leadership ends (lost or resigned).
func (l *Leadership) Done() <-chan struct{} { return l.ctx.Done() }

// Err is nil while leading, and why it ended after.
func (l *Leadership) Err() error { return context.Cause(l.ctx) }

// Resign gives the leadership up (release): the next candidate in the
// queue leads at once. Resigning a leadership already lost returns nil.
func (l *Leadership) Resign(ctx context.Context) error { return l.stop(ctx) }

// CampaignOptions tune a campaign. The zero value means the defaults.
type CampaignOptions struct {
	// Margin is how long before the lease may run out the leadership is
	// taken as lost, time for the leader to stop; 0 means min(TTL/3, 3s),
	// negative none. It must be shorter than the TTL.
	Margin time.Duration
	// Wait is the wait_ms of each acquire (the campaign sends another
	// when it runs out); 0 means 60s.
	Wait time.Duration
}

// Margin is the loss margin o gives a ttl.
func (o *CampaignOptions) margin(ttl time.Duration) time.Duration {
	switch {
	case o == nil || o.Margin == 0:
		return min(ttl/3, 3*time.Second)
	case o.Margin < 0:
		return 0
	}
	return o.Margin
}

// CampaignMargin is the margin a campaign with o and ttl uses (see
// CampaignOptions.Margin).
func CampaignMargin(o *CampaignOptions, ttl time.Duration) time.Duration { return o.margin(ttl) }

// CampaignWait is the wait of each acquire of a campaign (see
// CampaignOptions.Wait), cut to ctx's deadline.
func CampaignWait(ctx context.Context, o *CampaignOptions) time.Duration {
	w := 60 * time.Second
	if o != nil && o.Wait > 0 {
		w = o.Wait
	}
	if d, ok := ctx.Deadline(); ok {
		w = min(w, max(time.Until(d), time.Millisecond))
	}
	return w
}

// CheckCampaign checks a campaign's arguments before anything is sent:
// the value must be 1 to MaxValue bytes, the margin shorter than the TTL.
func CheckCampaign(name, value string, ttl time.Duration, o *CampaignOptions) error {
	switch {
	case name == "":
		return &Error{Code: CodeBadRequest, Message: "election name: empty"}
	case ttl <= 0:
		return &Error{Code: CodeBadRequest, Message: fmt.Sprintf("election ttl %v: want above 0", ttl)}
	case o != nil && o.Wait < 0:
		return &Error{Code: CodeBadRequest, Message: fmt.Sprintf("election wait %v: want 0 (the default) or more", o.Wait)}
	case value == "":
		return &Error{Code: CodeBadRequest, Message: "election value: empty; each candidate needs a value of its own (its address, say)"}
	case len(value) > MaxValue:
		return &Error{Code: CodeTooLarge, Message: fmt.Sprintf("election value: %d bytes, over %d", len(value), MaxValue)}
	case o.margin(ttl) >= ttl:
		return &Error{Code: CodeBadRequest, Message: fmt.Sprintf("election margin %v: want shorter than the TTL of %v", o.margin(ttl), ttl)}
	}
	return nil
}

// Campaign blocks until the caller leads the election name with value
// (queueing first come, first served), or ctx ends. The leadership is
// renewed every third of ttl less the margin, until Resign or until it
// may be lost: a renew refused, or none succeeded within ttl less the
// margin (see CampaignOptions). Only the leader's context ends then;
// ctx bounds the campaign, not the leadership.
func (db *DB) Campaign(ctx context.Context, name, value string, ttl time.Duration, o *CampaignOptions) (*Leadership, error) {
	if err := CheckCampaign(name, value, ttl, o); err != nil {
		return nil, err
	}
	var l Lease
	for {
		var err error
		l, err = db.Acquire(ctx, name, ttl, &AcquireOptions{Holder: value, Wait: CampaignWait(ctx, o)})
		if err == nil {
			break
		}
		if !errors.Is(err, ErrLockHeld) || ctx.Err() != nil {
			return nil, err
		}
	}
	// A queued grant's lease began at the grant: renew to know from when.
	sent := db.clock.Now()
	if _, err := db.Renew(ctx, name, l.Token); err != nil {
		db.Release(context.WithoutCancel(ctx), name, l.Token)
		return nil, err
	}
	lctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	done := make(chan struct{})
	resigned := make(chan struct{})
	go func() {
		defer close(done)
		db.keepLeading(lctx, cancel, l, sent, ttl-o.margin(ttl), resigned)
	}()
	var once sync.Once
	var rerr error
	resign := func(rctx context.Context) error {
		once.Do(func() { rerr = db.resign(rctx, lctx, cancel, name, l.Token, resigned, done) })
		return rerr
	}
	return NewLeadership(l, value, lctx, resign), nil
}

// keepLeading renews the leadership's lease l every third of keep (the
// TTL less the margin), on the DB's clock, until resigned closes; it
// cancels with ErrLeadershipLost when a renew is refused or keep passes
// after the send time of the last renew that succeeded (sent). The renews
// run one at a time in a goroutine of their own, so that a renew stuck in
// a commit does not hold the deadline up; it has ended when keepLeading
// returns.
func (db *DB) keepLeading(lctx context.Context, cancel context.CancelCauseFunc, l Lease, sent time.Time, keep time.Duration, resigned <-chan struct{}) {
	type renewed struct {
		at  time.Time
		err error
	}
	rctx, stopRenew := context.WithCancel(lctx)
	var inflight chan renewed // nil when no renew is in flight
	defer func() {
		stopRenew()
		if inflight != nil {
			<-inflight
		}
	}()
	every := max(keep/3, time.Millisecond)
	next := db.clock.Now().Add(every) // when the next renew is due
	for {
		now := db.clock.Now()
		left := sent.Add(keep).Sub(now)
		if left <= 0 {
			cancel(fmt.Errorf("%w: no renew of %q (epoch %d) succeeded within %v", ErrLeadershipLost, l.Name, l.Token, keep))
			return
		}
		if inflight == nil && !now.Before(next) {
			inflight = make(chan renewed, 1)
			go func(at time.Time, ch chan<- renewed) {
				_, err := db.Renew(rctx, l.Name, l.Token)
				ch <- renewed{at, err}
			}(now, inflight)
			next = now.Add(every)
		}
		wait := left
		if inflight == nil {
			wait = min(wait, next.Sub(now))
		}
		t := db.clock.NewTimer(wait)
		select {
		case <-resigned:
			t.Stop()
			return
		case <-t.C():
		case r := <-inflight:
			t.Stop()
			inflight = nil
			switch {
			case r.err == nil:
				sent = r.at
			case errors.Is(r.err, ErrNotHolder), errors.Is(r.err, ErrLeaseExpired):
				cancel(fmt.Errorf("%w: %w", ErrLeadershipLost, r.err))
				return
			default:
				// Not a refusal (the store closing, say): try again soon.
				if soon := db.clock.Now().Add(max(every/4, time.Millisecond)); soon.Before(next) {
					next = soon
				}
			}
		}
	}
}

// resign ends a leadership of the engine: stops its renewing, then
// releases the lock.
func (db *DB) resign(rctx, lctx context.Context, cancel context.CancelCauseFunc, name string, token Token, resigned, done chan struct{}) error {
	close(resigned)
	<-done
	lost := lctx.Err() != nil
	cancel(ErrResigned)
	err := db.Release(rctx, name, token)
	if lost || errors.Is(err, ErrNotHolder) || errors.Is(err, ErrLeaseExpired) {
		return nil
	}
	return err
}

// Leader reads the election name once (a lock_info). A lease run out
// whose expiry is not applied yet counts as leading, with TTL 0.
func (db *DB) Leader(ctx context.Context, name string) (Leader, error) {
	in, err := db.LockInfo(ctx, name)
	if err != nil {
		return Leader{}, err
	}
	in.Name = name
	return LeaderOf(in), nil
}

// Observe streams the election's state as it changes, starting with the
// current one (see ObserveElection). The channel is closed when ctx ends.
func (db *DB) Observe(ctx context.Context, name string) (<-chan Leader, error) {
	watch := func(ctx context.Context) (<-chan []Event, func(), error) {
		w, err := db.Watch(ctx, WatchOptions{Prefix: []byte(name), Locks: true})
		if err != nil {
			return nil, nil, err
		}
		return w.Events(), w.Close, nil
	}
	return ObserveElection(ctx, name, watch, func(ctx context.Context) (Leader, error) { return db.Leader(ctx, name) })
}

// ObserveElection is observe as PROTOCOL.md §12 gives it, over any
// transport: watch the lock events under name, then read the state; on
// every batch with an event of the lock name itself, read it again, and
// emit it when it changed. A held state is emitted only with an epoch
// above the last one emitted. When the watch ends, or a read fails, it
// starts again with a new watch (after a pause, 20ms doubling to 1s).
// The first watch and read are made before it returns: their error is
// returned. The channel is closed when ctx ends.
func ObserveElection(ctx context.Context, name string,
	watch func(ctx context.Context) (events <-chan []Event, stop func(), err error),
	read func(ctx context.Context) (Leader, error)) (<-chan Leader, error) {
	if name == "" {
		return nil, &Error{Code: CodeBadRequest, Message: "election name: empty"}
	}
	events, stop, err := watch(ctx)
	if err != nil {
		return nil, err
	}
	first, err := read(ctx)
	if err != nil {
		stop()
		return nil, err
	}
	out := make(chan Leader, 16)
	go func() {
		defer close(out)
		var last Leader
		var top Token // the highest held epoch emitted
		sent := false
		emit := func(l Leader) bool {
			if sent && l.Held == last.Held && l.Value == last.Value && l.Token == last.Token {
				return true
			}
			if l.Held && l.Token <= top && top > 0 {
				return true // a stale answer
			}
			select {
			case out <- l:
			case <-ctx.Done():
				return false
			}
			last, sent = l, true
			if l.Held {
				top = l.Token
			}
			return true
		}
		if !emit(first) {
			stop()
			return
		}
		pause := 20 * time.Millisecond
		for {
			for ok := true; ok; {
				select {
				case <-ctx.Done():
					stop()
					return
				case batch, open := <-events:
					if !open {
						ok = false
						break
					}
					if !touches(batch, name) {
						continue
					}
					l, err := read(ctx)
					if err != nil {
						ok = false
						break
					}
					if !emit(l) {
						stop()
						return
					}
					pause = 20 * time.Millisecond
				}
			}
			stop()
			// Start again: a new watch, then a read (which reflects
			// whatever changed while there was none).
			for {
				t := time.NewTimer(pause)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				pause = min(2*pause, time.Second)
				if events, stop, err = watch(ctx); err != nil {
					continue
				}
				l, err := read(ctx)
				if err != nil {
					stop()
					continue
				}
				if !emit(l) {
					stop()
					return
				}
				break
			}
		}
	}()
	return out, nil
}

// touches reports whether a batch has an event of the lock name itself
// (not of a lock or key that only starts with it).
func touches(batch []Event, name string) bool {
	for i := range batch {
		if batch[i].Lock == name && len(batch[i].Key) == 0 {
			return true
		}
	}
	return false
}
