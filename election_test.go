package fencekv_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

// campaignAsync runs a campaign in a goroutine; its result arrives on the
// channel.
type campaigned struct {
	l   *fencekv.Leadership
	err error
}

func campaignAsync(ctx context.Context, db *fencekv.DB, name, value string, ttl time.Duration, o *fencekv.CampaignOptions) <-chan campaigned {
	ch := make(chan campaigned, 1)
	go func() {
		l, err := db.Campaign(ctx, name, value, ttl, o)
		ch <- campaigned{l, err}
	}()
	return ch
}

func waitersOf(t *testing.T, db *fencekv.DB, name string, n int) {
	t.Helper()
	fencekvtest.Eventually(t, 10*time.Second, "the campaign to queue", func() bool {
		in, err := db.LockInfo(context.Background(), name)
		return err == nil && in.Waiters == n
	})
}

func wantLeader(t *testing.T, db *fencekv.DB, name string, held bool, value string, token fencekv.Token) {
	t.Helper()
	got, err := db.Leader(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Held != held || got.Value != value || (token != 0 && got.Token != token) || got.Name != name {
		t.Fatalf("Leader(%q) = %+v; want held %v, value %q, epoch %d", name, got, held, value, token)
	}
}

// TestElectionCampaignWaitsForResign: a campaign blocks while another
// leads, and wins with a higher epoch when the leader resigns.
func TestElectionCampaignWaitsForResign(t *testing.T) {
	ctx := context.Background()
	db := openTest(t, nil)
	wantLeader(t, db, "e", false, "", 0)
	a, err := db.Campaign(ctx, "e", "a", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != "e" || a.Value != "a" || a.Token == 0 || a.Err() != nil {
		t.Fatalf("leadership %+v, err %v", a.Lease, a.Err())
	}
	wantLeader(t, db, "e", true, "a", a.Token)
	bc := campaignAsync(ctx, db, "e", "b", 10*time.Second, nil)
	waitersOf(t, db, "e", 1)
	select {
	case r := <-bc:
		t.Fatalf("b's campaign returned while a leads: %+v", r)
	default:
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-bc
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.l.Token <= a.Token || r.l.Value != "b" {
		t.Fatalf("b leads with epoch %d value %q; a had %d", r.l.Token, r.l.Value, a.Token)
	}
	<-a.Done()
	if !errors.Is(a.Err(), fencekv.ErrResigned) {
		t.Fatalf("a.Err() = %v; want ErrResigned", a.Err())
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("second resign: %v", err)
	}
	wantLeader(t, db, "e", true, "b", r.l.Token)
	must(t, r.l.Resign(ctx))
	wantLeader(t, db, "e", false, "", 0)
}

// TestElectionExpiryDeposes: a leader that stops renewing (here: the
// clock passes its TTL) is deposed; the queued candidate leads with a
// higher epoch; the deposed leader's context ends with ErrLeadershipLost,
// its fenced writes are refused, and the new leader's are accepted.
func TestElectionExpiryDeposes(t *testing.T) {
	ctx := context.Background()
	clock := fencekvtest.NewClock()
	db := openTest(t, clock)
	o := &fencekv.CampaignOptions{Wait: time.Hour}
	a, err := db.Campaign(ctx, "e", "a", 30*time.Minute, o)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("e/out")
	if _, err := db.Put(ctx, key, []byte("a"), fencekv.WriteOptions{Token: a.Token, Lock: "e"}); err != nil {
		t.Fatalf("a's fenced write while leading: %v", err)
	}
	bc := campaignAsync(ctx, db, "e", "b", 30*time.Minute, o)
	waitersOf(t, db, "e", 1)
	clock.Advance(45 * time.Minute) // a renews nothing in that time: its lease runs out
	r := <-bc
	if r.err != nil {
		t.Fatal(r.err)
	}
	b := r.l
	if b.Token <= a.Token {
		t.Fatalf("b's epoch %d, not above a's %d", b.Token, a.Token)
	}
	select {
	case <-a.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a's leadership did not end")
	}
	if !errors.Is(a.Err(), fencekv.ErrLeadershipLost) {
		t.Fatalf("a.Err() = %v; want ErrLeadershipLost", a.Err())
	}
	wantLeader(t, db, "e", true, "b", b.Token)
	_, err = db.Put(ctx, key, []byte("a2"), fencekv.WriteOptions{Token: a.Token, Lock: "e"})
	if !errors.Is(err, fencekv.ErrNotHolder) {
		t.Fatalf("deposed a's write on the lock = %v; want not_holder", err)
	}
	if _, err := db.Put(ctx, key, []byte("b"), fencekv.WriteOptions{Token: b.Token, Lock: "e"}); err != nil {
		t.Fatalf("b's fenced write: %v", err)
	}
	_, err = db.Put(ctx, key, []byte("a3"), fencekv.WriteOptions{Token: a.Token})
	if !errors.Is(err, fencekv.ErrStaleToken) {
		t.Fatalf("deposed a's token-only write after b wrote = %v; want stale_token", err)
	}
	e, err := db.Get(ctx, key)
	if err != nil || string(e.Value) != "b" || e.Fence != b.Token {
		t.Fatalf("key = %q fence %d, %v; want b's", e.Value, e.Fence, err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("resigning a lost leadership: %v", err)
	}
	wantLeader(t, db, "e", true, "b", b.Token) // a's resign did not free b's lock
}

// TestElectionLossOnRefusedRenew: once a renew is refused, the
// leadership's context ends at once (ErrLeadershipLost wrapping the
// refusal); resigning it then changes nothing.
func TestElectionLossOnRefusedRenew(t *testing.T) {
	ctx := context.Background()
	db := openTest(t, nil)
	a, err := db.Campaign(ctx, "e", "a", 600*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	must(t, db.Release(ctx, "e", a.Token)) // the lease taken away behind a's back
	b, err := db.Campaign(ctx, "e", "b", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a's leadership did not end")
	}
	if !errors.Is(a.Err(), fencekv.ErrLeadershipLost) || !errors.Is(a.Err(), fencekv.ErrNotHolder) {
		t.Fatalf("a.Err() = %v; want ErrLeadershipLost and not_holder", a.Err())
	}
	must(t, a.Resign(ctx))
	wantLeader(t, db, "e", true, "b", b.Token)
	must(t, b.Resign(ctx))
}

// TestElectionKeepsLeading: a leader renews; it still leads after many
// TTLs.
func TestElectionKeepsLeading(t *testing.T) {
	ctx := context.Background()
	db := openTest(t, nil)
	a, err := db.Campaign(ctx, "e", "a", 300*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < 1500*time.Millisecond {
		if a.Err() != nil {
			t.Fatalf("lost after %v: %v", time.Since(start), a.Err())
		}
		wantLeader(t, db, "e", true, "a", a.Token)
		time.Sleep(50 * time.Millisecond) // sampling over time, not synchronising
	}
	must(t, a.Resign(ctx))
}

// TestElectionObserve: observe starts with the current state and sees
// each change (waited for one at a time), then the final one of a burst,
// epochs strictly rising.
func TestElectionObserve(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := openTest(t, nil)
	a, err := db.Campaign(ctx, "e", "a", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Noise under the same prefix that must not be reported.
	x, err := db.Acquire(ctx, "ex", 10*time.Second, nil)
	must(t, err)
	obs, err := db.Observe(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	next := func() fencekv.Leader {
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
	if l := next(); !l.Held || l.Value != "a" || l.Token != a.Token || l.Name != "e" {
		t.Fatalf("first observed %+v; want a (epoch %d)", l, a.Token)
	}
	must(t, db.Release(ctx, "ex", x.Token))
	_, err = db.Put(ctx, []byte("e"), []byte("key noise"), fencekv.WriteOptions{})
	must(t, err)
	bc := campaignAsync(ctx, db, "e", "b", 10*time.Second, nil)
	waitersOf(t, db, "e", 1)
	must(t, a.Resign(ctx))
	b := (<-bc).l
	if l := next(); !l.Held || l.Value != "b" || l.Token != b.Token {
		t.Fatalf("observed %+v; want b (epoch %d)", l, b.Token)
	}
	must(t, b.Resign(ctx))
	if l := next(); l.Held || l.Value != "" {
		t.Fatalf("observed %+v; want no leader", l)
	}
	// A burst: observers may coalesce, but epochs rise and the last is seen.
	var last *fencekv.Leadership
	for i := 0; i < 20; i++ {
		l, err := db.Campaign(ctx, "e", "c"+strings.Repeat("!", i), 10*time.Second, nil)
		must(t, err)
		if i < 19 {
			must(t, l.Resign(ctx))
		}
		last = l
	}
	top := b.Token
	for {
		l := next()
		if l.Held {
			if l.Token <= top {
				t.Fatalf("epoch %d observed after %d", l.Token, top)
			}
			top = l.Token
		}
		if l.Held && l.Token == last.Token {
			if l.Value != last.Value {
				t.Fatalf("final leader observed with value %q; want %q", l.Value, last.Value)
			}
			break
		}
	}
	cancel()
	for range obs { // closed once ctx ends
	}
}

// TestElectionCancelLeavesNoLease: a campaign whose ctx ends while it is
// queued returns ctx's error and leaves neither a waiter nor a lease.
func TestElectionCancelLeavesNoLease(t *testing.T) {
	ctx := context.Background()
	db := openTest(t, nil)
	a, err := db.Campaign(ctx, "e", "a", 10*time.Second, nil)
	must(t, err)
	bctx, bcancel := context.WithCancel(ctx)
	bc := campaignAsync(bctx, db, "e", "b", 10*time.Second, nil)
	waitersOf(t, db, "e", 1)
	bcancel()
	if r := <-bc; !errors.Is(r.err, context.Canceled) || r.l != nil {
		t.Fatalf("cancelled campaign = %+v; want context.Canceled", r)
	}
	waitersOf(t, db, "e", 0)
	must(t, a.Resign(ctx))
	wantLeader(t, db, "e", false, "", 0)

	// A deadline that ends the wait: the same.
	dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer dcancel()
	c, err := db.Campaign(ctx, "e", "c", 10*time.Second, nil)
	must(t, err)
	if _, err := db.Campaign(dctx, "e", "d", 10*time.Second, nil); err == nil || dctx.Err() == nil {
		t.Fatalf("campaign past its deadline = %v", err)
	}
	waitersOf(t, db, "e", 0)
	must(t, c.Resign(ctx))
	wantLeader(t, db, "e", false, "", 0)

	// Already cancelled: nothing is taken.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := db.Campaign(done, "e", "x", 10*time.Second, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("campaign with a cancelled ctx = %v", err)
	}
	wantLeader(t, db, "e", false, "", 0)
}

// TestElectionBadInput: bad arguments are typed errors and change nothing.
func TestElectionBadInput(t *testing.T) {
	ctx := context.Background()
	db := openTest(t, nil)
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
		{"ttl negative", "e", "v", -time.Second, nil, fencekv.CodeBadRequest},
		{"ttl under the minimum", "e", "v", 10 * time.Millisecond, &fencekv.CampaignOptions{Margin: -1}, fencekv.CodeBadRequest},
		{"margin not under the ttl", "e", "v", time.Second, &fencekv.CampaignOptions{Margin: time.Second}, fencekv.CodeBadRequest},
		{"negative wait", "e", "v", time.Second, &fencekv.CampaignOptions{Wait: -1}, fencekv.CodeBadRequest},
		{"name too large", strings.Repeat("n", 70000), "v", time.Second, nil, fencekv.CodeTooLarge},
	}
	for _, c := range cases {
		l, err := db.Campaign(ctx, c.name, c.value, c.ttl, c.o)
		if l != nil || !errors.Is(err, &fencekv.Error{Code: c.code}) {
			t.Errorf("%s: Campaign = %v, %v; want %s", c.what, l, err, c.code)
		}
	}
	if _, err := db.Leader(ctx, ""); !errors.Is(err, &fencekv.Error{Code: fencekv.CodeBadRequest}) {
		t.Errorf("Leader(\"\") = %v; want bad_request", err)
	}
	if _, err := db.Observe(ctx, ""); err == nil {
		t.Errorf("Observe(\"\") = nil; want an error")
	}
	locks, _, err := db.Locks(ctx, "", "", 0)
	if err != nil || len(locks) != 0 {
		t.Fatalf("locks after refused campaigns: %v, %v", locks, err)
	}
	wantLeader(t, db, "e", false, "", 0)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
