package fencekv_test

// Restart tests: close a DB and open the same dir again. Tokens continue
// (G1), keys keep values and fences (G2), and leases come back with their
// full TTL and lock-delays with their full delay (G7).

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

// reopen closes db and opens dir again on the same clock.
func reopen(t *testing.T, db *fencekv.DB, dir string, clock *fencekvtest.Clock) *fencekv.DB {
	t.Helper()
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return openDB(t, dir, clock, nil)
}

func TestRestartTokensContinue(t *testing.T) {
	dir, clock := t.TempDir(), fencekvtest.NewClock()
	db := openDB(t, dir, clock, nil)
	ctx := context.Background()
	var history []fencekv.Token
	for round := 0; round < 4; round++ {
		for i := 0; i < 3; i++ {
			name := fmt.Sprintf("r%d-%d", round, i)
			l := acquire(t, db, name, time.Second, nil)
			history = append(history, l.Token)
			switch i {
			case 0:
				db.Release(ctx, name, l.Token)
			case 1:
				clock.Advance(time.Second) // expires
			}
			// i == 2 stays held across the restart.
		}
		last := history[len(history)-1]
		db = reopen(t, db, dir, clock)
		if s := status(t, db); s.LastToken != last {
			t.Fatalf("round %d: last token after reopen = %d; want %d", round, s.LastToken, last)
		}
	}
	for i := 1; i < len(history); i++ {
		if history[i] != history[i-1]+1 {
			t.Fatalf("tokens across restarts = %v; want strictly increasing by one", history)
		}
	}
	l := acquire(t, db, "after", time.Second, nil)
	if l.Token != history[len(history)-1]+1 {
		t.Fatalf("first token after the last reopen = %d; want %d", l.Token, history[len(history)-1]+1)
	}
}

func TestRestartKeysPersist(t *testing.T) {
	dir, clock := t.TempDir(), fencekvtest.NewClock()
	db := openDB(t, dir, clock, nil)
	ctx := context.Background()
	put(t, db, "plain", "p", fencekv.WriteOptions{})
	put(t, db, "fenced", "f", fencekv.WriteOptions{Token: 7})
	put(t, db, "gone", "g", fencekv.WriteOptions{Token: 9})
	if _, _, err := db.Delete(ctx, []byte("gone"), fencekv.WriteOptions{Token: 9}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Delete(ctx, []byte("never"), fencekv.WriteOptions{Token: 4}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Incr(ctx, []byte("n"), 42, fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	keys := []string{"plain", "fenced", "gone", "never", "n"}
	before := snapshot(t, db, keys, nil)
	db = reopen(t, db, dir, clock)
	if after := snapshot(t, db, keys, nil); after != before {
		t.Fatalf("state changed across restart:\nbefore %s\nafter  %s", before, after)
	}
	// Fences still refuse stale writes, deleted keys included.
	for _, tt := range []struct {
		key   string
		token fencekv.Token
		fence fencekv.Token
	}{{"fenced", 6, 7}, {"gone", 8, 9}, {"never", 0, 4}} {
		_, err := db.Put(ctx, []byte(tt.key), []byte("x"), fencekv.WriteOptions{Token: tt.token})
		if e := wantErr(t, err, fencekv.CodeStaleToken); e.Fence != tt.fence {
			t.Errorf("%s: fence in refusal = %d; want %d", tt.key, e.Fence, tt.fence)
		}
	}
	// The revision continues.
	res := put(t, db, "plain", "p2", fencekv.WriteOptions{})
	if want := fencekv.Revision(7); res.Revision != want { // six writes before
		t.Fatalf("revision of the first write after restart = %d; want %d", res.Revision, want)
	}
}

// TestRestartLeaseFullTTL: a live lease comes back held by the same token,
// with its full TTL again (G7: extended by a failure, never shortened).
func TestRestartLeaseFullTTL(t *testing.T) {
	dir, clock := t.TempDir(), fencekvtest.NewClock()
	db := openDB(t, dir, clock, nil)
	ctx := context.Background()
	l := acquire(t, db, "L", 10*time.Second, &fencekv.AcquireOptions{Holder: "me", LockDelay: time.Minute})
	clock.Advance(7 * time.Second)
	if in := lockInfo(t, db, "L"); in.TTL != 3*time.Second {
		t.Fatalf("TTL before restart = %v; want 3s", in.TTL)
	}
	db = reopen(t, db, dir, clock)
	in := lockInfo(t, db, "L")
	if want := (fencekv.LockInfo{Name: "L", Held: true, Holder: "me", Token: l.Token, TTL: 10 * time.Second}); in != want {
		t.Fatalf("lock after restart = %+v; want %+v", in, want)
	}
	if s := status(t, db); s.Locks != 1 {
		t.Fatalf("status locks after restart = %d; want 1", s.Locks)
	}
	_, err := db.Acquire(ctx, "L", time.Second, nil)
	if e := wantErr(t, err, fencekv.CodeLockHeld); e.Token != l.Token || e.RetryAfter != 10*time.Second {
		t.Fatalf("lock_held after restart: token %d, retry %v; want %d, 10s", e.Token, e.RetryAfter, l.Token)
	}
	// The holder carries on: held writes and renewals work.
	clock.Advance(9 * time.Second)
	put(t, db, "k", "v", fencekv.WriteOptions{Token: l.Token, Lock: "L"})
	if ttl, err := db.Renew(ctx, "L", l.Token); err != nil || ttl != 10*time.Second {
		t.Fatalf("renew after restart = %v, %v; want 10s", ttl, err)
	}
	// And the lease still runs out, into its lock-delay.
	clock.Advance(10 * time.Second)
	_, err = db.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{Token: l.Token, Lock: "L"})
	wantErr(t, err, fencekv.CodeLeaseExpired)
	if in := lockInfo(t, db, "L"); in.Held || in.Delay != time.Minute {
		t.Fatalf("lock after expiry = %+v; want free with a 1m delay", in)
	}
}

// TestRestartLockDelay: a lock in lock-delay gets its full delay again.
func TestRestartLockDelay(t *testing.T) {
	dir, clock := t.TempDir(), fencekvtest.NewClock()
	db := openDB(t, dir, clock, nil)
	ctx := context.Background()
	l := acquire(t, db, "L", time.Second, &fencekv.AcquireOptions{LockDelay: 5 * time.Second})
	clock.Advance(time.Second)
	eventually(t, "the expiry to be applied", func() bool { return status(t, db).Locks == 0 })
	clock.Advance(3 * time.Second)
	if in := lockInfo(t, db, "L"); in.Delay != 2*time.Second {
		t.Fatalf("delay before restart = %v; want 2s", in.Delay)
	}
	db = reopen(t, db, dir, clock)
	if in := lockInfo(t, db, "L"); in.Held || in.Delay != 5*time.Second || in.Token != l.Token {
		t.Fatalf("lock after restart = %+v; want free, full 5s delay, token %d", in, l.Token)
	}
	clock.Advance(4999 * time.Millisecond)
	_, err := db.Acquire(ctx, "L", time.Second, nil)
	if e := wantErr(t, err, fencekv.CodeLockHeld); e.RetryAfter != time.Millisecond {
		t.Fatalf("retry = %v; want 1ms", e.RetryAfter)
	}
	// The late holder is told its lease expired, not that someone else has it.
	_, err = db.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{Token: l.Token, Lock: "L"})
	wantErr(t, err, fencekv.CodeLeaseExpired)
	clock.Advance(time.Millisecond)
	if l2 := acquire(t, db, "L", time.Second, nil); l2.Token != l.Token+1 {
		t.Fatalf("token after the delay = %d; want %d", l2.Token, l.Token+1)
	}
}

// TestRestartEndedLeases: expired (no delay) and released locks stay free.
func TestRestartEndedLeases(t *testing.T) {
	dir, clock := t.TempDir(), fencekvtest.NewClock()
	db := openDB(t, dir, clock, nil)
	ctx := context.Background()
	exp := acquire(t, db, "expired", time.Second, nil)
	rel := acquire(t, db, "released", time.Hour, &fencekv.AcquireOptions{LockDelay: time.Hour})
	if err := db.Release(ctx, "released", rel.Token); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	eventually(t, "the expiry to be applied", func() bool { return status(t, db).Locks == 0 })
	db = reopen(t, db, dir, clock)
	if in := lockInfo(t, db, "expired"); in.Held || in.Delay != 0 || in.Token != exp.Token {
		t.Fatalf("expired lock after restart = %+v; want free, token %d", in, exp.Token)
	}
	if in := lockInfo(t, db, "released"); in.Held || in.Delay != 0 {
		t.Fatalf("released lock after restart = %+v; want free", in)
	}
	_, err := db.Renew(ctx, "expired", exp.Token)
	wantErr(t, err, fencekv.CodeLeaseExpired)
	_, err = db.Renew(ctx, "released", rel.Token)
	wantErr(t, err, fencekv.CodeNotHolder)
	acquire(t, db, "expired", time.Second, nil)
	acquire(t, db, "released", time.Second, nil)
}

// TestOpenTwice: only one DB may have a dir open.
func TestOpenTwice(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir, fencekvtest.NewClock(), nil)
	o := fencekv.DefaultOptions()
	o.NoSync = true
	db2, err := fencekv.Open(dir, &o)
	if !errors.Is(err, fencekv.ErrLocked) {
		if db2 != nil {
			db2.Close()
		}
		t.Fatalf("second Open = %v; want ErrLocked", err)
	}
	put(t, db, "k", "still works", fencekv.WriteOptions{})
}

// TestRestartAfterLockInfo: what LockInfo reports over (a lease run out,
// a lock-delay ended) stays over after a crash right after it: a restart
// gives every lease not expired by an applied command its full TTL again
// (G7), so a lease whose deadline passed but whose expiry is not applied
// yet must not be reported free. LockInfo applies it first; a read that
// may not wait (the wire event loop's) reports the lease held with no time
// left instead. The crash is a copy of the files as they are at that
// moment, as a kill -9 leaves them. The expiry loop applies the same
// expiries at moments of its own: the rounds meet it at either side.
func TestRestartAfterLockInfo(t *testing.T) {
	for _, wait := range []bool{true, false} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			ctx := context.Background()
			if !wait {
				ctx = fencekv.WithoutCommitWait(ctx)
			}
			for round := 0; round < 20; round++ {
				dir, clock := t.TempDir(), fencekvtest.NewClock()
				db := openDB(t, dir, clock, nil)
				l := acquire(t, db, "L", time.Second, &fencekv.AcquireOptions{LockDelay: time.Second})
				for _, step := range []string{"lease run out", "lock-delay ended"} {
					clock.Advance(time.Second)
					in, err := db.LockInfo(ctx, "L")
					if err != nil {
						t.Fatal(err)
					}
					crashed := t.TempDir()
					fencekvtest.CopyFiles(t, dir, crashed)
					after := lockInfo(t, openDB(t, crashed, fencekvtest.NewClock(), nil), "L")
					if in.Token != l.Token || after.Token != l.Token {
						t.Fatalf("round %d, %s: tokens %d then %d after a crash; want %d", round, step, in.Token, after.Token, l.Token)
					}
					free := func(in fencekv.LockInfo) bool { return !in.Held && in.Delay == 0 }
					if !in.Held && after.Held || free(in) && !free(after) {
						t.Fatalf("round %d, %s: LockInfo said %+v, and after a crash right after it %+v", round, step, in, after)
					}
					if wait && in.ExpiryPending() {
						t.Fatalf("round %d, %s: LockInfo = %+v; want its expiry applied first", round, step, in)
					}
				}
			}
		})
	}
}
