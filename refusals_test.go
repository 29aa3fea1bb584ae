package fencekv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

// TestRefusalLog: every refused fenced write is recorded with its code,
// the token presented, what beat it, and whom the token was granted to,
// even after the lock changed hands; the log is bounded.
func TestRefusalLog(t *testing.T) {
	clock := fencekvtest.NewClock()
	o := fencekv.DefaultOptions()
	o.Clock = clock
	o.MaxRefusals = 4
	db, err := fencekv.Open(t.TempDir(), &o)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := fencekv.WithClient(context.Background(), "10.0.0.7:4242")
	a, err := db.Acquire(ctx, "inventory", time.Second, &fencekv.AcquireOptions{Holder: "A"})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second) // A's lease runs out
	b, err := db.Acquire(ctx, "inventory", time.Second, &fencekv.AcquireOptions{Holder: "B"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Put(ctx, []byte("inventory/sku-1"), []byte("34"), fencekv.WriteOptions{Token: b.Token}); err != nil {
		t.Fatal(err)
	}
	// The zombie: A writes with its old token, plain and held; and
	// with B's token after B's lease ran out.
	db.Put(ctx, []byte("inventory/sku-1"), []byte("33"), fencekv.WriteOptions{Token: a.Token})
	db.Put(ctx, []byte("inventory/sku-2"), []byte("33"), fencekv.WriteOptions{Token: a.Token, Lock: "inventory"})
	clock.Advance(2 * time.Second)
	db.Put(ctx, []byte("inventory/sku-3"), []byte("x"), fencekv.WriteOptions{Token: b.Token, Lock: "inventory"})

	rs, last, err := db.Refusals(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || last != 3 {
		t.Fatalf("refusals = %+v, last %d; want 3", rs, last)
	}
	want := []struct {
		code          fencekv.Code
		key           string
		token, fence  fencekv.Token
		holder, owner string
	}{
		{fencekv.CodeStaleToken, "inventory/sku-1", a.Token, b.Token, "", "A"},
		{fencekv.CodeNotHolder, "inventory/sku-2", a.Token, 0, "", "A"},
		{fencekv.CodeLeaseExpired, "inventory/sku-3", b.Token, 0, "", "B"},
	}
	for i, w := range want {
		r := rs[i]
		if r.Code != w.code || string(r.Key) != w.key || r.Token != w.token || r.Fence != w.fence ||
			r.GrantedLock != "inventory" || r.GrantedHolder != w.owner || r.Client != "10.0.0.7:4242" || r.Seq != uint64(i+1) {
			t.Errorf("refusal %d = %+v; want %s on %s with token %d (fence %d), granted to %s", i, r, w.code, w.key, w.token, w.fence, w.owner)
		}
	}
	if rs[1].Holder != b.Token {
		t.Errorf("not_holder while B holds the lock: holder token %d; want B's %d", rs[1].Holder, b.Token)
	}
	// A txn refused for one of its keys' fences names that key.
	ops := []fencekv.TxnOp{{Op: fencekv.OpPut, Key: []byte("inventory/sku-9"), Value: []byte("1")},
		{Op: fencekv.OpPut, Key: []byte("inventory/sku-1"), Value: []byte("1")}}
	if _, _, err := db.Txn(ctx, nil, ops, fencekv.WriteOptions{Token: a.Token}); err == nil {
		t.Fatal("a txn with A's token below sku-1's fence was applied")
	}
	if rs, _, _ := db.Refusals(ctx, 3, 0); len(rs) != 1 || rs[0].Op != "txn" || string(rs[0].Key) != "inventory/sku-1" || rs[0].Fence != b.Token {
		t.Errorf("the txn's refusal = %+v; want op txn on inventory/sku-1, fence %d", rs, b.Token)
	}
	// Paging: after seq 2, only the third (and the txn's).
	if rs, _, _ := db.Refusals(ctx, 2, 1); len(rs) != 1 || rs[0].Seq != 3 {
		t.Errorf("Refusals(since 2, limit 1) = %+v; want seq 3 only", rs)
	}
	// Bounded: the log keeps the latest MaxRefusals.
	for i := range 10 {
		db.Put(ctx, []byte(fmt.Sprint("k", i)), nil, fencekv.WriteOptions{Token: a.Token, Lock: "other"})
	}
	rs, last, _ = db.Refusals(ctx, 0, 0)
	if len(rs) != 4 || last != 14 || rs[0].Seq != 11 {
		t.Fatalf("after 14 refusals with room for 4: %d kept, first %d, last %d; want 4 kept, 11..14", len(rs), rs[0].Seq, last)
	}
	// Refusals that are not fencing's are not logged.
	db.CAS(ctx, []byte("inventory/sku-1"), 99, nil, fencekv.WriteOptions{Token: b.Token})
	if _, l, _ := db.Refusals(ctx, 0, 0); l != 14 {
		t.Errorf("a compare_failed was logged as a fencing refusal")
	}
}
