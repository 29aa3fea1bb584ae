package sqlfencetest

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/sqlfence"
	"github.com/fencekv/fencekv/wire"
)

// TestSeed: A gets the lock (token t), its lease runs out while it is
// stopped; B gets it (t' > t) and writes through the check; A's write with
// t is refused by the database, stale_token with the fence t', and the row
// is B's.
func TestSeed(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.open(t)
			c, clock, _ := lockService(t)
			ctx := context.Background()
			a, err := c.Acquire(ctx, "inventory", 2*time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			expire(t, c, clock, a)
			bl, err := c.Acquire(ctx, "inventory", 2*time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			if bl.Token <= a.Token {
				t.Fatalf("B's token %d is not above A's %d", bl.Token, a.Token)
			}
			if err := write(ctx, b, db, nil, bl.Token, 7, "B"); err != nil {
				t.Fatalf("B's write: %v", err)
			}
			err = write(ctx, b, db, nil, a.Token, 3, "A")
			var fe *fence.Error
			if !errors.Is(err, fencekv.ErrStaleToken) || !errors.As(err, &fe) || fe.Fence != bl.Token || fe.Key != "inventory" {
				t.Fatalf("A's write with %d: %v; want stale_token, fence %d", a.Token, err, bl.Token)
			}
			if qty, w := stock(t, b, db); qty != 7 || w != "B" {
				t.Fatalf("row = %d by %q; want B's 7", qty, w)
			}
			if f := fenceOf(t, b, db, "inventory"); f != int64(bl.Token) {
				t.Fatalf("fence = %d; want %d", f, bl.Token)
			}
			// The same holder checks again (an equal token holds).
			if err := write(ctx, b, db, nil, bl.Token, 6, "B"); err != nil {
				t.Fatalf("B's second write: %v", err)
			}
		})
	}
}

// TestBadInputChangesNothing: bad tokens and resource names are refused
// against a real transaction, and the transaction can still commit.
func TestBadInputChangesNothing(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.open(t)
			ctx := context.Background()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			for _, c := range []struct {
				resource string
				token    fence.Token
			}{{"inventory", 0}, {"inventory", 1 << 63}, {"", 5}, {strings.Repeat("x", 1025), 5}} {
				if err := b.d.Check(ctx, tx, c.resource, c.token); !errors.Is(err, fencekv.ErrBadRequest) {
					t.Errorf("Check(%.8q, %d): %v; want bad_request", c.resource, c.token, err)
				}
			}
			if err := b.d.Check(ctx, nil, "inventory", 5); !errors.Is(err, fencekv.ErrBadRequest) {
				t.Errorf("Check outside a transaction: %v; want bad_request", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("commit after refused checks: %v", err)
			}
			var n int
			if err := db.QueryRow("SELECT count(*) FROM fencekv_fences").Scan(&n); err != nil || n != 0 {
				t.Fatalf("fences after bad input: %d, %v; want none", n, err)
			}
			// The table's own constraints refuse what Check would.
			if _, err := db.Exec(b.q("INSERT INTO fencekv_fences (resource, token) VALUES (?, ?)"), "r", 0); err == nil {
				t.Error("the table took token 0")
			}
		})
	}
}

// TestFenceColumn: the per-row variant, a fence column on the protected
// row: an update with a stale token changes no row.
func TestFenceColumn(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.open(t)
			update := func(token int64, balance int) int64 {
				t.Helper()
				r, err := db.Exec(b.q("UPDATE accounts SET balance = ?, fence = ? WHERE id = 1 AND fence <= ?"), balance, token, token)
				if err != nil {
					t.Fatal(err)
				}
				n, err := r.RowsAffected()
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			if n := update(34, 50); n != 1 {
				t.Fatalf("update with 34: %d rows; want 1", n)
			}
			if n := update(33, 90); n != 0 {
				t.Fatalf("update with stale 33: %d rows; want 0", n)
			}
			var balance int
			var f int64
			if err := db.QueryRow("SELECT balance, fence FROM accounts WHERE id = 1").Scan(&balance, &f); err != nil {
				t.Fatal(err)
			}
			if balance != 50 || f != 34 {
				t.Fatalf("account = %d, fence %d; want 50, 34", balance, f)
			}
		})
	}
}

// TestWithLock: the helper commits under a held lease, and does
// not commit once the lease is lost (here: released behind its back, so
// the next renew is refused).
func TestWithLock(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { withLock(t, b) })
	}
}

func withLock(t *testing.T, b backend) {
	db := b.open(t)
	opts := fencekv.DefaultOptions()
	opts.NoSync = true
	addr, _ := fencekvtest.Serve(t, &opts)
	c, other := dial(t, addr), dial(t, addr)
	ctx := context.Background()
	lo := &sqlfence.LockOptions{LockOptions: wire.LockOptions{RenewEvery: 20 * time.Millisecond}}

	var held fence.Token
	err := b.d.WithLock(ctx, c, db, "inventory", 5*time.Second, lo, func(ctx context.Context, tx *sql.Tx, l fencekv.Lease) error {
		held = l.Token
		_, err := tx.ExecContext(ctx, "UPDATE stock SET qty = 8, writer = 'WithLock' WHERE sku = 'apple'")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if qty, w := stock(t, b, db); qty != 8 || w != "WithLock" {
		t.Fatalf("row = %d by %q; want 8 by WithLock", qty, w)
	}
	if f := fenceOf(t, b, db, "inventory"); f != int64(held) {
		t.Fatalf("fence = %d; want the lease's token %d", f, held)
	}

	err = b.d.WithLock(ctx, c, db, "inventory", 5*time.Second, lo, func(ctx context.Context, tx *sql.Tx, l fencekv.Lease) error {
		if _, err := tx.ExecContext(ctx, "UPDATE stock SET qty = 1, writer = 'lost' WHERE sku = 'apple'"); err != nil {
			return err
		}
		if err := other.Release(ctx, "inventory", l.Token); err != nil {
			return err
		}
		<-ctx.Done() // the next renew is refused
		return nil
	})
	if !errors.Is(err, wire.ErrLeaseLost) {
		t.Fatalf("WithLock whose lease was lost: %v; want ErrLeaseLost", err)
	}
	if qty, w := stock(t, b, db); qty != 8 || w != "WithLock" {
		t.Fatalf("row = %d by %q after a lost lease; want it unchanged", qty, w)
	}
}
