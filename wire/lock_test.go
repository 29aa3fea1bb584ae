package wire_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

func TestWithLock(t *testing.T) {
	ctx := context.Background()

	t.Run("runs fn and releases", func(t *testing.T) {
		ts := startServer(t, nil)
		c := dial(t, ts.Addr)
		var token fencekv.Token
		err := c.WithLock(ctx, "job", 5*time.Second, &wire.LockOptions{AcquireOptions: fencekv.AcquireOptions{Holder: "me"}},
			func(lctx context.Context, l fencekv.Lease) error {
				token = l.Token
				in, err := c.LockInfo(lctx, "job")
				if err != nil || !in.Held || in.Token != l.Token || in.Holder != "me" {
					t.Errorf("inside fn: lock_info %+v, %v", in, err)
				}
				_, err = c.Put(lctx, b("out"), b("done"), fencekv.WriteOptions{Token: l.Token, Lock: "job"})
				return err
			})
		ok(t, err)
		in, err := c.LockInfo(ctx, "job")
		ok(t, err)
		if in.Held || token == 0 {
			t.Fatalf("after WithLock: %+v; want released", in)
		}
	})

	t.Run("returns fn's error and releases", func(t *testing.T) {
		ts := startServer(t, nil)
		c := dial(t, ts.Addr)
		boom := errors.New("boom")
		if err := c.WithLock(ctx, "job", 5*time.Second, nil, func(context.Context, fencekv.Lease) error { return boom }); err != boom {
			t.Fatalf("WithLock = %v; want fn's error", err)
		}
		if in, _ := c.LockInfo(ctx, "job"); in.Held {
			t.Fatalf("lock still held after fn failed: %+v", in)
		}
	})

	t.Run("does not call fn when the lock is held", func(t *testing.T) {
		ts := startServer(t, nil)
		c := dial(t, ts.Addr)
		_, err := c.Acquire(ctx, "job", 5*time.Second, &fencekv.AcquireOptions{Holder: "other"})
		ok(t, err)
		err = c.WithLock(ctx, "job", time.Second, nil, func(context.Context, fencekv.Lease) error {
			t.Error("fn called without the lock")
			return nil
		})
		if fe := wantCode(t, err, fencekv.CodeLockHeld); fe.Holder != "other" {
			t.Fatalf("lock_held holder %q", fe.Holder)
		}
	})

	t.Run("waits its turn", func(t *testing.T) {
		ts := startServer(t, nil)
		c := dial(t, ts.Addr)
		other, err := c.Acquire(ctx, "job", 5*time.Second, nil)
		ok(t, err)
		done := make(chan error, 1)
		var got fencekv.Lease
		go func() {
			done <- c.WithLock(ctx, "job", time.Second, &wire.LockOptions{AcquireOptions: fencekv.AcquireOptions{Wait: time.Minute}},
				func(_ context.Context, l fencekv.Lease) error {
					got = l
					return nil
				})
		}()
		eventually(t, 10*time.Second, "WithLock to queue", func() bool { return waiters(t, ts.DB, "job") == 1 })
		ok(t, c.Release(ctx, "job", other.Token))
		ok(t, <-done)
		if got.Token <= other.Token {
			t.Fatalf("queued WithLock ran with token %d; want above %d", got.Token, other.Token)
		}
	})

	t.Run("renews keep the lease past its TTL", func(t *testing.T) {
		// On a fake clock the server's time moves only when told, so the
		// test can move it past the TTL several times over and see the
		// renews keep up, without waiting.
		ts, clock, c := errServer(t, nil)
		err := c.WithLock(ctx, "job", time.Second, &wire.LockOptions{RenewEvery: 10 * time.Millisecond},
			func(lctx context.Context, l fencekv.Lease) error {
				for i := range 6 {
					clock.Advance(600 * time.Millisecond) // 3.6s in all, on a 1s lease
					eventually(t, 10*time.Second, "a renew", func() bool {
						in, err := ts.DB.LockInfo(ctx, "job")
						return err == nil && in.Held && in.TTL == time.Second
					})
					if lctx.Err() != nil {
						t.Fatalf("lease lost after step %d: %v", i, context.Cause(lctx))
					}
				}
				return nil
			})
		ok(t, err)
	})

	t.Run("a renew refused as not_holder cancels fn", func(t *testing.T) {
		ts := startServer(t, nil)
		c := dial(t, ts.Addr)
		other := dial(t, ts.Addr)
		const ttl = 10 * time.Second
		var cause error
		var after time.Duration
		err := c.WithLock(ctx, "job", ttl, &wire.LockOptions{RenewEvery: 20 * time.Millisecond},
			func(lctx context.Context, l fencekv.Lease) error {
				// Someone else ends the lease (an operator with the token).
				ok(t, other.Release(ctx, "job", l.Token))
				start := time.Now()
				select {
				case <-lctx.Done():
				case <-time.After(ttl / 2):
					t.Fatal("fn's context was not cancelled after the lease was released under it")
				}
				after, cause = time.Since(start), context.Cause(lctx)
				return nil
			})
		if !errors.Is(err, wire.ErrLeaseLost) || !errors.Is(cause, wire.ErrLeaseLost) {
			t.Fatalf("WithLock = %v, cause %v; want ErrLeaseLost", err, cause)
		}
		if !strings.Contains(cause.Error(), "not_holder") {
			t.Fatalf("cause %v; want the refused renew", cause)
		}
		t.Logf("cancelled %v after the release", after)
	})

	t.Run("a renew refused as lease_expired cancels fn", func(t *testing.T) {
		// The server's clock jumps past the TTL (as if this client had been
		// paused); the client's own deadline, on the real clock, is far off,
		// so only the refused renew can cancel.
		_, clock, c := errServer(t, nil)
		var cause error
		err := c.WithLock(ctx, "job", 10*time.Second, &wire.LockOptions{RenewEvery: 20 * time.Millisecond},
			func(lctx context.Context, l fencekv.Lease) error {
				clock.Advance(11 * time.Second)
				select {
				case <-lctx.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("fn's context was not cancelled after the lease expired")
				}
				cause = context.Cause(lctx)
				// A write with the old token and the lock is refused now.
				_, err := c.Put(context.Background(), b("k"), b("v"), fencekv.WriteOptions{Token: l.Token, Lock: "job"})
				wantCode(t, err, fencekv.CodeLeaseExpired)
				return nil
			})
		if !errors.Is(err, wire.ErrLeaseLost) || !strings.Contains(cause.Error(), "lease_expired") {
			t.Fatalf("WithLock = %v, cause %v; want ErrLeaseLost from lease_expired", err, cause)
		}
	})

	t.Run("parent context cancelled", func(t *testing.T) {
		ts := startServer(t, nil)
		c := dial(t, ts.Addr)
		pctx, cancel := context.WithCancel(ctx)
		err := c.WithLock(pctx, "job", 5*time.Second, nil, func(lctx context.Context, l fencekv.Lease) error {
			cancel()
			<-lctx.Done()
			return lctx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("WithLock = %v; want context.Canceled", err)
		}
		// The lease is still released, with a context of its own.
		if in, _ := c.LockInfo(ctx, "job"); in.Held {
			t.Fatalf("lock still held after the caller gave up: %+v", in)
		}
	})

	t.Run("closing the client cancels fn, and Close waits for the renewing", func(t *testing.T) {
		ts := startServer(t, nil)
		c := dial(t, ts.Addr)
		closeHeld := holdGoroutines(t, c)
		var cause error
		err := c.WithLock(ctx, "job", 10*time.Second, &wire.LockOptions{RenewEvery: 10 * time.Millisecond},
			func(lctx context.Context, l fencekv.Lease) error {
				// Once the keeper has started the renewer (the count
				// may include a passing interrupt, which comes only
				// after a renew)...
				eventually(t, 10*time.Second, "the renewer to start", func() bool { return wire.Running(c) >= 2 })
				// ... both end when the client is closed (and are held
				// there), fn or no fn.
				closeHeld(t, 2)
				if lctx.Err() == nil {
					t.Fatal("fn's context was not cancelled when the client was closed")
				}
				cause = context.Cause(lctx)
				return nil
			})
		if !errors.Is(err, wire.ErrLeaseLost) || !errors.Is(err, wire.ErrClientClosed) || !errors.Is(cause, wire.ErrLeaseLost) {
			t.Fatalf("WithLock = %v, cause %v; want ErrLeaseLost and ErrClientClosed", err, cause)
		}
		if err := c.WithLock(ctx, "job", time.Second, nil, func(context.Context, fencekv.Lease) error {
			t.Error("fn called on a closed client")
			return nil
		}); !errors.Is(err, wire.ErrClientClosed) {
			t.Fatalf("WithLock on a closed client = %v; want ErrClientClosed", err)
		}
	})

	t.Run("a renew stuck on the server does not hold up WithLock or outlive it", func(t *testing.T) {
		db, err := fencekv.Open(t.TempDir(), nil)
		ok(t, err)
		t.Cleanup(func() { db.Close() })
		eng := &stallRenews{DB: db, stalled: make(chan struct{}, 1), unstall: make(chan struct{})}
		_, addr, _ := serveEngine(t, eng, wire.DefaultConfig())
		t.Cleanup(eng.let) // before the server shuts down
		c := dial(t, addr)
		done := make(chan error, 1)
		go func() {
			done <- c.WithLock(ctx, "job", 10*time.Second, &wire.LockOptions{RenewEvery: 5 * time.Millisecond, ReleaseTimeout: 100 * time.Millisecond},
				func(context.Context, fencekv.Lease) error {
					select {
					case <-eng.stalled:
					case <-time.After(10 * time.Second):
						t.Error("no renew reached the server")
						return nil
					}
					// Ticks keep coming while the renew is stuck: still
					// the keeper and one renewer.
					eventually(t, 10*time.Second, "the keeper and the renewer alone", func() bool { return wire.Running(c) == 2 })
					return nil
				})
		}()
		// The release is sent at once. A server that serves the lone
		// renew on the connection's reading path (as this one does) reads
		// nothing more meanwhile, and the release times out.
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("WithLock = %v; want nil, or the release timed out", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("WithLock did not return while a renew was stuck on the server")
		}
		eventually(t, 10*time.Second, "the client's goroutines to end", func() bool { return wire.Running(c) == 0 })
		// Once the renew is let through, the release the client sent and
		// gave up on is served.
		eng.let()
		eventually(t, 10*time.Second, "the lock to be released", func() bool {
			in, err := db.LockInfo(ctx, "job")
			return err == nil && !in.Held
		})
	})
}

// stallRenews serves a real store, except that a renew waits until unstall
// is closed (saying so on stalled first): a renew that never comes back.
type stallRenews struct {
	*fencekv.DB
	stalled chan struct{}
	unstall chan struct{}
	once    sync.Once
}

// let lets the renews through.
func (s *stallRenews) let() { s.once.Do(func() { close(s.unstall) }) }

func (s *stallRenews) Renew(ctx context.Context, name string, token fencekv.Token) (time.Duration, error) {
	select {
	case s.stalled <- struct{}{}:
	default:
	}
	<-s.unstall
	return s.DB.Renew(ctx, name, token)
}

// TestWithLockAcrossCuts: the connection breaks again and again while fn
// runs; the renews go on through new connections, and the lease is kept.
func TestWithLockAcrossCuts(t *testing.T) {
	ts := startServer(t, nil)
	p := startProxy(t, ts.Addr)
	c := dial(t, p.addr)
	ctx := context.Background()
	const ttl = 2 * time.Second
	err := c.WithLock(ctx, "job", ttl, &wire.LockOptions{RenewEvery: 50 * time.Millisecond},
		func(lctx context.Context, l fencekv.Lease) error {
			for i := range 5 {
				n := p.connections()
				p.cut()
				eventually(t, 10*time.Second, "a renew on a new connection", func() bool { return p.connections() > n })
				if lctx.Err() != nil {
					t.Fatalf("lease lost after cut %d: %v", i, context.Cause(lctx))
				}
			}
			// Still the holder, and a held write with the token works.
			_, err := c.Put(lctx, b("out"), b("done"), fencekv.WriteOptions{Token: l.Token, Lock: "job"})
			return err
		})
	ok(t, err)
	if in, err := ts.DB.LockInfo(ctx, "job"); err != nil || in.Held {
		t.Fatalf("after WithLock: %+v, %v; want released", in, err)
	}
}

// TestWithLockLostThenReleased: the server is unreachable past the TTL,
// so fn's context is cancelled with ErrLeaseLost; the server, whose clock
// has not moved (it has not seen the lease run out, as after a restart),
// is reachable again as fn returns, and WithLock releases the lock.
func TestWithLockLostThenReleased(t *testing.T) {
	ts, _, _ := errServer(t, nil)
	p := startProxy(t, ts.Addr)
	c := dial(t, p.addr)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	var cause error
	err := c.WithLock(ctx, "job", ttl, &wire.LockOptions{ReleaseTimeout: 10 * time.Second},
		func(lctx context.Context, l fencekv.Lease) error {
			p.stop()
			select {
			case <-lctx.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("not cancelled with the server unreachable past the TTL")
			}
			cause = context.Cause(lctx)
			if in, err := ts.DB.LockInfo(ctx, "job"); err != nil || !in.Held || in.Token != l.Token {
				t.Fatalf("server side: %+v, %v; want still held by %d", in, err, l.Token)
			}
			p.start()
			return lctx.Err()
		})
	if !errors.Is(err, wire.ErrLeaseLost) || !errors.Is(cause, wire.ErrLeaseLost) {
		t.Fatalf("WithLock = %v, cause %v; want ErrLeaseLost", err, cause)
	}
	// fn returned its context's error: that still says so, and the
	// lease's loss too.
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("WithLock = %v; want fn's error (context.Canceled) too", err)
	}
	if in, err := ts.DB.LockInfo(ctx, "job"); err != nil || in.Held {
		t.Fatalf("after WithLock gave up: %+v, %v; want released", in, err)
	}
}

// TestWithLockLostFnCtxErr: fn returns its context's error after a renew
// is refused; the caller still sees ErrLeaseLost, and the refusal.
func TestWithLockLostFnCtxErr(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.Addr)
	ctx := context.Background()
	err := c.WithLock(ctx, "job", 10*time.Second, &wire.LockOptions{RenewEvery: 10 * time.Millisecond},
		func(lctx context.Context, l fencekv.Lease) error {
			ok(t, ts.DB.Release(ctx, "job", l.Token))
			<-lctx.Done()
			return lctx.Err()
		})
	if !errors.Is(err, wire.ErrLeaseLost) || !errors.Is(err, fencekv.ErrNotHolder) || !errors.Is(err, context.Canceled) {
		t.Fatalf("WithLock = %v; want ErrLeaseLost, not_holder and context.Canceled", err)
	}
}

// TestWithLockMargin: with a margin, fn's context ends that long before
// the lease may run out (measured from the acquire's send, the renews
// being stuck), so that fn has stopped by the time the server may expire
// the lease; a margin not shorter than the TTL is refused.
func TestWithLockMargin(t *testing.T) {
	ctx := context.Background()
	db, err := fencekv.Open(t.TempDir(), nil)
	ok(t, err)
	t.Cleanup(func() { db.Close() })
	eng := &stallRenews{DB: db, stalled: make(chan struct{}, 1), unstall: make(chan struct{})}
	_, addr, _ := serveEngine(t, eng, wire.DefaultConfig())
	t.Cleanup(eng.let)
	c := dial(t, addr)
	const ttl, margin = 4 * time.Second, 2 * time.Second
	err = c.WithLock(ctx, "m", ttl, &wire.LockOptions{Margin: ttl}, func(context.Context, fencekv.Lease) error { return nil })
	wantCode(t, err, fencekv.CodeBadRequest)

	start := time.Now()
	var lost time.Duration
	err = c.WithLock(ctx, "m", ttl, &wire.LockOptions{Margin: margin, ReleaseTimeout: 100 * time.Millisecond},
		func(lctx context.Context, _ fencekv.Lease) error {
			<-lctx.Done()
			lost = time.Since(start)
			return nil
		})
	if !errors.Is(err, wire.ErrLeaseLost) {
		t.Fatalf("WithLock with every renew stuck = %v; want ErrLeaseLost", err)
	}
	if lost < ttl-margin-50*time.Millisecond || lost >= ttl-margin/4 {
		t.Fatalf("the lease was taken as lost %v after the acquire; want about %v (the TTL of %v less the margin of %v)", lost, ttl-margin, ttl, margin)
	}
}

// TestWithLockFindsLostGrant: the acquire is granted but its answer is
// lost with the connection. WithLock, which acquired under a holder name
// of its own, finds the grant and runs fn with it, rather than failing
// and leaving the lock held until its lease runs out; when its context
// ended meanwhile, it releases the grant.
func TestWithLockFindsLostGrant(t *testing.T) {
	ts := startServer(t, nil)
	p := startProxy(t, ts.Addr)
	c := dial(t, p.addr)
	ctx := context.Background()
	// lose has the acquire's answer lost: it waits for the grant on the
	// server and for its answer to be dropped (p.mute is set, and
	// p.dropped zeroed, before the acquire), then cuts the connection.
	lose := func(then func()) fencekv.LockInfo {
		t.Helper()
		var in fencekv.LockInfo
		eventually(t, 10*time.Second, "the acquire granted on the server", func() bool {
			var err error
			in, err = ts.DB.LockInfo(ctx, "job")
			return err == nil && in.Held
		})
		eventually(t, 10*time.Second, "the grant's answer dropped", func() bool { return p.dropped.Load() > 0 })
		then()
		p.mute.Store(false)
		p.cut()
		return in
	}

	t.Run("taken", func(t *testing.T) {
		p.dropped.Store(0)
		p.mute.Store(true)
		type result struct {
			token fencekv.Token
			err   error
		}
		res := make(chan result, 1)
		go func() {
			var r result
			r.err = c.WithLock(ctx, "job", 5*time.Second, nil, func(lctx context.Context, l fencekv.Lease) error {
				r.token = l.Token
				_, err := c.Put(lctx, b("out"), b("written"), fencekv.WriteOptions{Token: l.Token, Lock: "job"})
				return err
			})
			res <- r
		}()
		in := lose(func() {})
		if !strings.Contains(in.Holder, ":") {
			t.Errorf("holder %q: want WithLock's own (host:pid:suffix)", in.Holder)
		}
		r := <-res
		ok(t, r.err)
		if r.token != in.Token {
			t.Fatalf("fn ran with token %d; the lost grant was %d", r.token, in.Token)
		}
		if after, err := ts.DB.LockInfo(ctx, "job"); err != nil || after.Held {
			t.Fatalf("after WithLock: %+v, %v; want released", after, err)
		}
	})

	// Another holder's lease is never taken (G4: one holder per token):
	// the acquire is refused lock_held, the refusal is lost, and the
	// look-up finds the lock held under another name.
	t.Run("another's", func(t *testing.T) {
		other, err := ts.DB.Acquire(ctx, "job", time.Minute, &fencekv.AcquireOptions{Holder: "someone else"})
		ok(t, err)
		p.dropped.Store(0)
		p.mute.Store(true)
		res := make(chan error, 1)
		called := false
		go func() {
			res <- c.WithLock(ctx, "job", 5*time.Second, nil, func(context.Context, fencekv.Lease) error {
				called = true
				return nil
			})
		}()
		eventually(t, 10*time.Second, "the refusal dropped", func() bool { return p.dropped.Load() > 0 })
		p.mute.Store(false)
		p.cut()
		var ce *wire.ConnError
		if err := <-res; !errors.As(err, &ce) || ce.Outcome != fencekv.OutcomeUnknown {
			t.Fatalf("WithLock: %v; want the acquire's unknown outcome", err)
		}
		if called {
			t.Fatal("fn ran with another holder's lease")
		}
		in, err := ts.DB.LockInfo(ctx, "job")
		if err != nil || !in.Held || in.Token != other.Token {
			t.Fatalf("after WithLock: %+v, %v; want still held by token %d", in, err, other.Token)
		}
		ok(t, ts.DB.Release(ctx, "job", other.Token))
	})

	t.Run("released", func(t *testing.T) {
		p.dropped.Store(0)
		p.mute.Store(true)
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		res := make(chan error, 1)
		called := false
		go func() {
			res <- c.WithLock(cctx, "job", time.Minute, nil, func(context.Context, fencekv.Lease) error {
				called = true
				return nil
			})
		}()
		lose(cancel)
		if err := <-res; !errors.Is(err, context.Canceled) {
			t.Fatalf("WithLock: %v; want the context's end", err)
		}
		if called {
			t.Fatal("fn ran after the context ended")
		}
		if after, err := ts.DB.LockInfo(ctx, "job"); err != nil || after.Held {
			t.Fatalf("after WithLock: %+v, %v; want the lost grant released (its lease is a minute)", after, err)
		}
	})
}
