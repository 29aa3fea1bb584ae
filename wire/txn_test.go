package wire_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wire"
)

// TestTxnOverTheWire: a txn's results, and a refusal naming its key, come
// back through the protocol.
func TestTxnOverTheWire(t *testing.T) {
	addr, _ := fencekvtest.Serve(t, nil)
	ctx := context.Background()
	c, err := wire.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ops := []fencekv.TxnOp{
		{Op: state.OpPut, Key: []byte("a"), Value: []byte("x")},
		{Op: state.OpIncr, Key: []byte("n"), Delta: 5},
		{Op: state.OpDelete, Key: []byte("gone")},
	}
	rev, rs, err := c.Txn(ctx, []fencekv.Compare{{Key: []byte("a")}}, ops, fencekv.WriteOptions{Token: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || rs[1].Int != 5 || rs[0].Fence != 3 || rs[0].Revision != rev || string(rs[2].Key) != "gone" {
		t.Fatalf("txn = %d, %+v", rev, rs)
	}
	_, _, err = c.Txn(ctx, []fencekv.Compare{{Key: []byte("a")}}, ops[:1], fencekv.WriteOptions{Token: 3})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeCompareFailed || fe.Key != "a" || fe.Revision != rev {
		t.Fatalf("failing compare: %v (%+v)", err, fe)
	}
	_, _, err = c.Txn(ctx, nil, ops[:2], fencekv.WriteOptions{Token: 2})
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeStaleToken || fe.Key != "a" || fe.Fence != 3 {
		t.Fatalf("stale txn: %v (%+v)", err, fe)
	}
}
