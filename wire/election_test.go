package wire_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

type campaignResult struct {
	l   *fencekv.Leadership
	err error
}

func campaignAsync(ctx context.Context, c *wire.Client, name, value string, ttl time.Duration, o *fencekv.CampaignOptions) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		l, err := c.Campaign(ctx, name, value, ttl, o)
		ch <- campaignResult{l, err}
	}()
	return ch
}

func queued(t *testing.T, db *fencekv.DB, name string, n int) {
	t.Helper()
	eventually(t, 10*time.Second, "the campaigns to queue", func() bool {
		in, err := db.LockInfo(context.Background(), name)
		return err == nil && in.Waiters == n
	})
}

func wantLeaderOf(t *testing.T, c *wire.Client, name string, held bool, value string, token fencekv.Token) {
	t.Helper()
	got, err := c.Leader(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Held != held || got.Value != value || (token != 0 && got.Token != token) || got.Name != name {
		t.Fatalf("Leader(%q) = %+v; want held %v, value %q, epoch %d", name, got, held, value, token)
	}
}

func nextLeader(t *testing.T, obs <-chan fencekv.Leader) fencekv.Leader {
	t.Helper()
	select {
	case l, open := <-obs:
		if !open {
			t.Fatal("observe closed")
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no election state observed")
	}
	return fencekv.Leader{}
}

// TestElectionWireResign: over the wire, a campaign blocks while another
// client leads and wins with a higher epoch on resign; Leader reads the
// value and epoch; the leader's fenced writes are accepted.
func TestElectionWireResign(t *testing.T) {
	ctx := context.Background()
	ts := startServer(t, nil)
	ca, cb := dial(t, ts.Addr), dial(t, ts.Addr)
	wantLeaderOf(t, ca, "e", false, "", 0)
	a, err := ca.Campaign(ctx, "e", "a", 10*time.Second, nil)
	ok(t, err)
	if a.Value != "a" || a.Token == 0 || a.Err() != nil {
		t.Fatalf("a: %+v %v", a.Lease, a.Err())
	}
	wantLeaderOf(t, cb, "e", true, "a", a.Token)
	_, err = ca.Put(ctx, b("e/out"), b("a"), fencekv.WriteOptions{Token: a.Token, Lock: "e"})
	ok(t, err)
	bc := campaignAsync(ctx, cb, "e", "b", 10*time.Second, nil)
	queued(t, ts.DB, "e", 1)
	select {
	case r := <-bc:
		t.Fatalf("b's campaign returned while a leads: %+v", r)
	default:
	}
	resignedAt := time.Now()
	ok(t, a.Resign(ctx))
	r := <-bc
	t.Logf("resign -> the queued campaign leads (renewed): %v", time.Since(resignedAt))
	ok(t, r.err)
	if r.l.Token <= a.Token || r.l.Value != "b" {
		t.Fatalf("b leads with epoch %d value %q; a had %d", r.l.Token, r.l.Value, a.Token)
	}
	<-a.Done()
	if !errors.Is(a.Err(), fencekv.ErrResigned) {
		t.Fatalf("a.Err() = %v; want ErrResigned", a.Err())
	}
	ok(t, a.Resign(ctx))
	wantLeaderOf(t, ca, "e", true, "b", r.l.Token)
	_, err = ca.Put(ctx, b("e/out"), b("a2"), fencekv.WriteOptions{Token: a.Token, Lock: "e"})
	wantCode(t, err, fencekv.CodeNotHolder)
	_, err = cb.Put(ctx, b("e/out"), b("b"), fencekv.WriteOptions{Token: r.l.Token, Lock: "e"})
	ok(t, err)
	ok(t, r.l.Resign(ctx))
	wantLeaderOf(t, ca, "e", false, "", 0)
}

// TestElectionWireExpiry: the leader's client is cut off from the server
// (a paused or partitioned leader) past its TTL: its leadership ends on
// its own clock (ErrLeadershipLost) before the server expires the lease;
// the queued candidate then leads with a higher epoch; the deposed
// leader, reconnected, has its fenced writes refused (not_holder on the
// lock, stale_token by the token alone), and the new leader's are
// accepted.
func TestElectionWireExpiry(t *testing.T) {
	ctx := context.Background()
	ts := startServer(t, nil)
	p := startProxy(t, ts.Addr)
	ca, cb := dial(t, p.addr), dial(t, ts.Addr)
	const ttl = 600 * time.Millisecond
	a, err := ca.Campaign(ctx, "e", "a", ttl, nil)
	ok(t, err)
	bc := campaignAsync(ctx, cb, "e", "b", ttl, nil)
	queued(t, ts.DB, "e", 1)
	p.stop()
	select {
	case <-a.Done():
	case <-time.After(10 * time.Second):
		in, _ := ts.DB.LockInfo(ctx, "e")
		var got string
		select {
		case r := <-bc:
			got = fmt.Sprintf("%+v %v", r.l.Lease, r.err)
		default:
		}
		t.Fatalf("a's leadership did not end with its server unreachable; a %+v, lock %+v, b %s, proxy conns %d", a.Lease, in, got, p.connections())
	}
	if !errors.Is(a.Err(), fencekv.ErrLeadershipLost) || !errors.Is(a.Err(), wire.ErrLeaseLost) {
		t.Fatalf("a.Err() = %v; want ErrLeadershipLost (and ErrLeaseLost)", a.Err())
	}
	r := <-bc
	ok(t, r.err)
	if r.l.Token <= a.Token {
		t.Fatalf("b's epoch %d not above a's %d", r.l.Token, a.Token)
	}
	p.start()
	// The deposed leader's client is back once its reconnect pause ends.
	eventually(t, 10*time.Second, "a's client to reconnect", func() bool {
		_, err = ca.Put(ctx, b("e/out"), b("a"), fencekv.WriteOptions{Token: a.Token, Lock: "e"})
		var ce *wire.ConnError
		return !errors.As(err, &ce)
	})
	wantCode(t, err, fencekv.CodeNotHolder)
	_, err = cb.Put(ctx, b("e/out"), b("b"), fencekv.WriteOptions{Token: r.l.Token, Lock: "e"})
	ok(t, err)
	_, err = ca.Put(ctx, b("e/out"), b("a"), fencekv.WriteOptions{Token: a.Token})
	wantCode(t, err, fencekv.CodeStaleToken)
	ok(t, a.Resign(ctx))
	wantLeaderOf(t, ca, "e", true, "b", r.l.Token)
	ok(t, r.l.Resign(ctx))
}

// TestElectionWireObserve: observe starts with the current leader, sees
// each change in order (through a cut connection too), and the final
// leader of a burst, epochs strictly rising; another lock sharing the
// prefix and key writes are not reported.
func TestElectionWireObserve(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ts := startServer(t, nil)
	p := startProxy(t, ts.Addr)
	c, co := dial(t, ts.Addr), dial(t, p.addr)
	a, err := c.Campaign(ctx, "e", "a", 10*time.Second, nil)
	ok(t, err)
	obs, err := co.Observe(ctx, "e")
	ok(t, err)
	if l := nextLeader(t, obs); !l.Held || l.Value != "a" || l.Token != a.Token || l.Name != "e" {
		t.Fatalf("first observed %+v; want a (epoch %d)", l, a.Token)
	}
	x, err := c.Acquire(ctx, "ex", 10*time.Second, nil)
	ok(t, err)
	ok(t, c.Release(ctx, "ex", x.Token))
	_, err = c.Put(ctx, b("e"), b("noise"), fencekv.WriteOptions{})
	ok(t, err)
	bc := campaignAsync(ctx, c, "e", "b", 10*time.Second, nil)
	queued(t, ts.DB, "e", 1)
	ok(t, a.Resign(ctx))
	bl := (<-bc).l
	if l := nextLeader(t, obs); !l.Held || l.Value != "b" || l.Token != bl.Token {
		t.Fatalf("observed %+v; want b (epoch %d)", l, bl.Token)
	}
	// The observer's connection breaks; a change meanwhile is still seen.
	n := p.connections()
	p.stop()
	ok(t, bl.Resign(ctx))
	p.start()
	eventually(t, 10*time.Second, "the observer to reconnect", func() bool { return p.connections() > n })
	if l := nextLeader(t, obs); l.Held {
		t.Fatalf("observed %+v; want no leader", l)
	}
	var last *fencekv.Leadership
	for i := 0; i < 20; i++ {
		l, err := c.Campaign(ctx, "e", "c"+strings.Repeat("!", i), 10*time.Second, nil)
		ok(t, err)
		if i < 19 {
			ok(t, l.Resign(ctx))
		}
		last = l
	}
	top := bl.Token
	for {
		l := nextLeader(t, obs)
		if l.Held {
			if l.Token <= top {
				t.Fatalf("epoch %d observed after %d", l.Token, top)
			}
			top = l.Token
			if l.Token == last.Token {
				if l.Value != last.Value {
					t.Fatalf("final leader observed as %q; want %q", l.Value, last.Value)
				}
				break
			}
		}
	}
	cancel()
	for range obs {
	}
	ok(t, last.Resign(context.Background()))
}

// TestElectionWireCancel: a campaign whose ctx ends while queued returns
// ctx's error and, once the leader resigns, leaves no lease behind (the
// grant its queued acquire may still receive is released).
func TestElectionWireCancel(t *testing.T) {
	ctx := context.Background()
	ts := startServer(t, nil)
	ca, cb := dial(t, ts.Addr), dial(t, ts.Addr)
	a, err := ca.Campaign(ctx, "e", "a", 10*time.Second, nil)
	ok(t, err)
	bctx, bcancel := context.WithCancel(ctx)
	bc := campaignAsync(bctx, cb, "e", "b", 10*time.Second, nil)
	queued(t, ts.DB, "e", 1)
	bcancel()
	if r := <-bc; !errors.Is(r.err, context.Canceled) || r.l != nil {
		t.Fatalf("cancelled campaign = %+v; want context.Canceled", r)
	}
	ok(t, a.Resign(ctx))
	eventually(t, 10*time.Second, "no lease left", func() bool {
		in, err := ts.DB.LockInfo(ctx, "e")
		return err == nil && !in.Held && in.Waiters == 0
	})
	// And with a deadline.
	c, err := ca.Campaign(ctx, "e", "c", 10*time.Second, nil)
	ok(t, err)
	dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer dcancel()
	if _, err := cb.Campaign(dctx, "e", "d", 10*time.Second, nil); err == nil || dctx.Err() == nil {
		t.Fatalf("campaign past its deadline = %v", err)
	}
	ok(t, c.Resign(ctx))
	eventually(t, 10*time.Second, "no lease left", func() bool {
		in, err := ts.DB.LockInfo(ctx, "e")
		return err == nil && !in.Held && in.Waiters == 0
	})
}

// TestElectionWireBadInput: bad arguments are typed errors; nothing is
// taken.
func TestElectionWireBadInput(t *testing.T) {
	ctx := context.Background()
	ts := startServer(t, nil)
	c := dial(t, ts.Addr)
	cases := []struct {
		what, name, value string
		ttl               time.Duration
		o                 *fencekv.CampaignOptions
		code              fencekv.Code
	}{
		{"empty name", "", "v", time.Second, nil, fencekv.CodeBadRequest},
		{"empty value", "e", "", time.Second, nil, fencekv.CodeBadRequest},
		{"value too large", "e", strings.Repeat("v", fencekv.MaxValue+1), time.Second, nil, fencekv.CodeTooLarge},
		{"ttl 0", "e", "v", 0, nil, fencekv.CodeBadRequest},
		{"ttl under the server's minimum", "e", "v", 10 * time.Millisecond, &fencekv.CampaignOptions{Margin: -1}, fencekv.CodeBadRequest},
		{"margin not under the ttl", "e", "v", time.Second, &fencekv.CampaignOptions{Margin: 2 * time.Second}, fencekv.CodeBadRequest},
		{"name too large", strings.Repeat("n", 5000), "v", time.Second, nil, fencekv.CodeTooLarge},
	}
	for _, tc := range cases {
		l, err := c.Campaign(ctx, tc.name, tc.value, tc.ttl, tc.o)
		if l != nil || !errors.Is(err, &fencekv.Error{Code: tc.code}) {
			t.Errorf("%s: Campaign = %v, %v; want %s", tc.what, l, err, tc.code)
		}
	}
	if _, err := c.Leader(ctx, ""); !errors.Is(err, &fencekv.Error{Code: fencekv.CodeBadRequest}) {
		t.Errorf("Leader(\"\") = %v; want bad_request", err)
	}
	if _, err := c.Observe(ctx, ""); !errors.Is(err, &fencekv.Error{Code: fencekv.CodeBadRequest}) {
		t.Errorf("Observe(\"\") = %v; want bad_request", err)
	}
	locks, _, err := ts.DB.Locks(ctx, "", "", 0)
	if err != nil || len(locks) != 0 {
		t.Fatalf("locks after refused campaigns: %v, %v", locks, err)
	}
}
