package wire_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// semGrant is the outcome of one waiting acquire.
type semGrant struct {
	holder string
	l      fencekv.Lease
	err    error
}

// acquireWaiting starts an acquire of a permit of S (limit 3) that waits,
// and waits until the server has queued it behind the ones before.
func acquireWaiting(t *testing.T, ts *testServer, c *wire.Client, holder string, queued int, out chan<- semGrant) {
	t.Helper()
	go func() {
		l, err := c.Acquire(context.Background(), "S", time.Hour, &fencekv.AcquireOptions{Limit: 3, Wait: 30 * time.Second, Holder: holder})
		out <- semGrant{holder, l, err}
	}()
	eventually(t, 10*time.Second, holder+" to queue", func() bool { return waiters(t, ts.DB, "S") == queued })
}

func nextGrant(t *testing.T, got <-chan semGrant) semGrant {
	t.Helper()
	select {
	case g := <-got:
		if g.err != nil {
			t.Fatalf("%s: %v", g.holder, g.err)
		}
		return g
	case <-time.After(10 * time.Second):
		t.Fatal("no grant within 10s")
	}
	return semGrant{}
}

// holders lists lock_info's holders of S as "holder:token".
func holders(t *testing.T, c *wire.Client) (fencekv.LockInfo, []string) {
	t.Helper()
	in, err := c.LockInfo(context.Background(), "S")
	ok(t, err)
	var out []string
	for _, h := range in.Holders() {
		out = append(out, fmt.Sprintf("%s:%d", h.Holder, h.Token))
	}
	return in, out
}

// TestSemaphoreWire: over the wire, a limit of 3 gives three holders
// distinct rising tokens; the fourth and fifth wait FIFO and each gets the
// next permit released; a held write is accepted with a live permit's
// token and refused after its release; lock_info lists the holders with
// the limit.
func TestSemaphoreWire(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.Addr)
	ctx := context.Background()
	var perm []fencekv.Lease
	for i := 1; i <= 3; i++ {
		l, err := c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: 3, Holder: fmt.Sprintf("h%d", i)})
		ok(t, err)
		if len(perm) > 0 && l.Token <= perm[len(perm)-1].Token {
			t.Fatalf("permit %d: token %d not above %d", i, l.Token, perm[len(perm)-1].Token)
		}
		perm = append(perm, l)
	}
	in, hs := holders(t, c)
	want := []string{fmt.Sprintf("h1:%d", perm[0].Token), fmt.Sprintf("h2:%d", perm[1].Token), fmt.Sprintf("h3:%d", perm[2].Token)}
	if in.Limit() != 3 || !reflect.DeepEqual(hs, want) || !in.Held {
		t.Fatalf("lock_info: limit %d, holders %v; want 3, %v", in.Limit(), hs, want)
	}
	for _, h := range in.Holders() {
		if h.TTL <= 0 || h.TTL > time.Hour {
			t.Fatalf("holder %s: ttl %v", h.Holder, h.TTL)
		}
	}
	wantCode(t, refused(c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: 3})), fencekv.CodeLockHeld)

	got := make(chan semGrant, 2)
	acquireWaiting(t, ts, dial(t, ts.Addr), "w4", 1, got)
	acquireWaiting(t, ts, dial(t, ts.Addr), "w5", 2, got)

	_, err := c.Put(ctx, b("k"), b("by h2"), fencekv.WriteOptions{Token: perm[1].Token, Lock: "S"})
	ok(t, err)
	ok(t, c.Release(ctx, "S", perm[1].Token))
	g4 := nextGrant(t, got)
	if g4.holder != "w4" || g4.l.Token <= perm[2].Token {
		t.Fatalf("first released permit went to %s (token %d); want w4, above %d", g4.holder, g4.l.Token, perm[2].Token)
	}
	wantCode(t, refused(c.Put(ctx, b("k"), b("late h2"), fencekv.WriteOptions{Token: perm[1].Token, Lock: "S"})), fencekv.CodeNotHolder)
	_, err = c.Put(ctx, b("k"), b("by w4"), fencekv.WriteOptions{Token: g4.l.Token, Lock: "S"})
	ok(t, err)
	if in, hs := holders(t, c); in.Waiters != 1 || len(hs) != 3 || hs[2] != fmt.Sprintf("w4:%d", g4.l.Token) {
		t.Fatalf("after the hand-off: holders %v, %d waiting; want h1, h3, w4 and w5 waiting", hs, in.Waiters)
	}
	ok(t, c.Release(ctx, "S", perm[0].Token))
	if g5 := nextGrant(t, got); g5.holder != "w5" || g5.l.Token <= g4.l.Token {
		t.Fatalf("second released permit went to %s (token %d); want w5 above %d", g5.holder, g5.l.Token, g4.l.Token)
	}
	wantCode(t, c.Release(ctx, "S", perm[0].Token), fencekv.CodeNotHolder)
}

// TestSemaphoreWireExpiry: a permit that runs out is lease_expired to its
// holder's writes and renews, and frees its slot for the next waiter.
func TestSemaphoreWireExpiry(t *testing.T) {
	ts, clock, c := errServer(t, nil)
	ctx := context.Background()
	short, err := c.Acquire(ctx, "S", time.Second, &fencekv.AcquireOptions{Limit: 3, Holder: "short"})
	ok(t, err)
	for _, h := range []string{"a", "b"} {
		_, err := c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: 3, Holder: h})
		ok(t, err)
	}
	got := make(chan semGrant, 1)
	acquireWaiting(t, ts, dial(t, ts.Addr), "w", 1, got)
	_, err = c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: short.Token, Lock: "S"})
	ok(t, err)
	clock.Advance(1500 * time.Millisecond)
	if g := nextGrant(t, got); g.holder != "w" || g.l.Token <= short.Token {
		t.Fatalf("expired permit went to %s (token %d)", g.holder, g.l.Token)
	}
	wantCode(t, refused(c.Put(ctx, b("k"), b("late"), fencekv.WriteOptions{Token: short.Token, Lock: "S"})), fencekv.CodeLeaseExpired)
	wantCode(t, refused(c.Renew(ctx, "S", short.Token)), fencekv.CodeLeaseExpired)
	if _, hs := holders(t, c); len(hs) != 3 || hs[0][:2] != "a:" {
		t.Fatalf("holders after the expiry: %v", hs)
	}
}

// TestSemaphoreWireRefusals: a limit other than the live permits', limit
// 0, a limit over MaxPermits and a lock-delay on a semaphore are typed
// refusals (limit_mismatch, bad_request) and change nothing: the holders,
// the waiters and the next token are as before.
func TestSemaphoreWireRefusals(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.Addr)
	raw := dialRaw(t, ts.Addr)
	ctx := context.Background()
	_, err := c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: 3, Holder: "h"})
	ok(t, err)
	plain, err := c.Acquire(ctx, "P", time.Hour, nil)
	ok(t, err)
	before, hs := holders(t, c)
	for _, tc := range []struct {
		name string
		err  error
		code fencekv.Code
	}{
		{"plain acquire", refused(c.Acquire(ctx, "S", time.Hour, nil)), fencekv.CodeLimitMismatch},
		{"limit 1", refused(c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: 1})), fencekv.CodeLimitMismatch},
		{"limit 2", refused(c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: 2, Wait: time.Second})), fencekv.CodeLimitMismatch},
		{"limit over max", refused(c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: fencekv.MaxPermits + 1})), fencekv.CodeBadRequest},
		{"negative limit", refused(c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: -1})), fencekv.CodeBadRequest},
		{"lock delay", refused(c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: 3, LockDelay: time.Second})), fencekv.CodeBadRequest},
		{"semaphore acquire of a plain lock", refused(c.Acquire(ctx, "P", time.Hour, &fencekv.AcquireOptions{Limit: 3})), fencekv.CodeLimitMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) { wantCode(t, tc.err, tc.code) })
	}
	// limit 0 is sent by hand: the client sends no limit for 0.
	for i, lim := range []any{0, fencekv.MaxPermits + 1, "3"} {
		p := raw.call(uint64(i+1), "acquire", map[string]any{"lock": "S", "ttl_ms": 1000, "limit": lim})
		if p.code() != "bad_request" {
			t.Fatalf("raw acquire with limit %v: %s %v; want bad_request", lim, p.code(), p.err)
		}
	}
	after, hs2 := holders(t, c)
	if !reflect.DeepEqual(hs, hs2) || after.Waiters != before.Waiters || after.Limit() != 3 {
		t.Fatalf("refusals changed the semaphore: %v, %d waiting; was %v, %d", hs2, after.Waiters, hs, before.Waiters)
	}
	next, err := c.Acquire(ctx, "S", time.Hour, &fencekv.AcquireOptions{Limit: 3})
	ok(t, err)
	if next.Token != plain.Token+1 {
		t.Fatalf("next grant: token %d; want %d (the refusals took none)", next.Token, plain.Token+1)
	}
	if p, err := c.LockInfo(ctx, "P"); err != nil || p.Sem != nil || p.Limit() != 1 || p.Token != plain.Token {
		t.Fatalf("plain lock P after a refused semaphore acquire: %+v, %v", p, err)
	}
}

// TestWithSemaphore: at most limit WithSemaphore callbacks run at once,
// each with its own permit, renewed while it runs and released after.
func TestWithSemaphore(t *testing.T) {
	ts := startServer(t, nil)
	const limit, workers = 3, 8
	var mu sync.Mutex
	running, most := 0, 0
	tokens := map[fencekv.Token]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := 0; i < workers; i++ {
		c := dial(t, ts.Addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &wire.LockOptions{AcquireOptions: fencekv.AcquireOptions{Wait: 30 * time.Second}}
			errs <- c.WithSemaphore(context.Background(), "S", limit, 600*time.Millisecond, o, func(ctx context.Context, l fencekv.Lease) error {
				mu.Lock()
				running++
				most = max(most, running)
				dup := tokens[l.Token]
				tokens[l.Token] = true
				mu.Unlock()
				if dup {
					return errors.New("a token granted twice")
				}
				// Hold across a renew or two: the permit stays ours.
				select {
				case <-ctx.Done():
					return context.Cause(ctx)
				case <-time.After(300 * time.Millisecond):
				}
				mu.Lock()
				running--
				mu.Unlock()
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		ok(t, err)
	}
	if most > limit || most < 2 || len(tokens) != workers {
		t.Fatalf("at most %d ran at once (limit %d), %d tokens for %d workers", most, limit, len(tokens), workers)
	}
	if in, err := ts.DB.LockInfo(context.Background(), "S"); err != nil || len(in.Holders()) != 0 {
		t.Fatalf("after all returned: %+v, %v; want no holders", in.Holders(), err)
	}
}
