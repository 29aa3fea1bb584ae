package fencekv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/state"
)

func txnPut(key, value string) fencekv.TxnOp {
	return fencekv.TxnOp{Op: fencekv.OpPut, Key: []byte(key), Value: []byte(value)}
}

// TestTxnAllOrNothing: a transaction's ops are applied together at one
// revision, or not at all: one stale key, one failed compare, one value
// that is not an integer, or a lease that ran out refuses the whole txn
// and changes nothing.
func TestTxnAllOrNothing(t *testing.T) {
	db := openDB(t, "", fencekvtest.NewClock(), nil)
	ctx := context.Background()
	l, err := db.Acquire(ctx, "stock", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := fencekv.WriteOptions{Token: l.Token, Lock: "stock"}
	if _, err := db.Put(ctx, []byte("sku-1"), []byte("10"), w); err != nil {
		t.Fatal(err)
	}
	before, _ := db.Get(ctx, []byte("sku-1"))

	// Move 3 from sku-1 to sku-2, if sku-1 is unchanged.
	rev, res, err := db.Txn(ctx, []fencekv.Compare{{Key: []byte("sku-1"), Revision: before.Revision}, {Key: []byte("sku-2")}},
		[]fencekv.TxnOp{{Op: fencekv.OpIncr, Key: []byte("sku-1"), Delta: -3}, {Op: fencekv.OpIncr, Key: []byte("sku-2"), Delta: 3}, txnPut("log/1", "moved 3")}, w)
	if err != nil {
		t.Fatal(err)
	}
	if rev != before.Revision+1 || len(res) != 3 {
		t.Fatalf("txn at revision %d with %d results; want one revision %d, 3 results", rev, len(res), before.Revision+1)
	}
	for _, r := range res {
		if r.Revision != rev || r.Fence != l.Token {
			t.Errorf("op result %+v; want revision %d, fence %d", r, rev, l.Token)
		}
	}
	if res[0].Int != 7 || res[1].Int != 3 {
		t.Errorf("incr results %d, %d; want 7, 3", res[0].Int, res[1].Int)
	}

	dump := func() string {
		var s string
		for _, k := range []string{"sku-1", "sku-2", "log/1", "other"} {
			e, _ := db.Get(ctx, []byte(k))
			s += k + "=" + string(e.Value) + ";"
		}
		st, _ := db.Status(ctx)
		return s + st.Revision.String()
	}
	after := dump()

	// A newer token fences sku-2; then a txn with the old token touching
	// both keys is refused whole: no half-landed move.
	if _, err := db.Put(ctx, []byte("sku-2"), []byte("3"), fencekv.WriteOptions{Token: l.Token + 100}); err != nil {
		t.Fatal(err)
	}
	after = dump()
	_, _, err = db.Txn(ctx, nil, []fencekv.TxnOp{{Op: fencekv.OpIncr, Key: []byte("sku-1"), Delta: -1}, {Op: fencekv.OpIncr, Key: []byte("sku-2"), Delta: 1}},
		fencekv.WriteOptions{Token: l.Token})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeStaleToken || fe.Key != "sku-2" || fe.Fence != l.Token+100 {
		t.Fatalf("txn with a stale key: %v; want stale_token on sku-2 with fence %d", err, l.Token+100)
	}
	if got := dump(); got != after {
		t.Fatalf("a refused txn changed state: %s; was %s", got, after)
	}

	// A compare that fails names its key and revision.
	_, _, err = db.Txn(ctx, []fencekv.Compare{{Key: []byte("sku-1"), Revision: 1}}, []fencekv.TxnOp{txnPut("other", "x")}, fencekv.WriteOptions{})
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeCompareFailed || fe.Key != "sku-1" || fe.Revision != rev {
		t.Fatalf("txn with a failing compare: %v; want compare_failed on sku-1 at %d", err, rev)
	}
	// An incr of a non-integer, after a put in the same txn.
	_, _, err = db.Txn(ctx, nil, []fencekv.TxnOp{txnPut("other", "x"), {Op: fencekv.OpIncr, Key: []byte("other"), Delta: 1}}, fencekv.WriteOptions{})
	if !errors.Is(err, fencekv.ErrNotInteger) {
		t.Fatalf("txn incr of a value it just put as text: %v; want not_integer", err)
	}
	// A held txn after the lock is released: not_holder.
	if err := db.Release(ctx, "stock", l.Token); err != nil {
		t.Fatal(err)
	}
	_, _, err = db.Txn(ctx, nil, []fencekv.TxnOp{txnPut("sku-1", "0")}, w)
	if !errors.Is(err, fencekv.ErrNotHolder) {
		t.Fatalf("held txn after release: %v; want not_holder", err)
	}
	if got := dump(); got != after {
		t.Fatalf("refused txns changed state: %s; was %s", got, after)
	}
	// Bad input changes nothing.
	for _, ops := range [][]fencekv.TxnOp{nil, {{Op: state.OpAcquire, Key: []byte("k")}}, {{Op: fencekv.OpPut}}} {
		if _, _, err := db.Txn(ctx, nil, ops, fencekv.WriteOptions{}); !errors.Is(err, fencekv.ErrBadRequest) {
			t.Errorf("txn %+v: %v; want bad_request", ops, err)
		}
	}
}
