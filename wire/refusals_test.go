package wire_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// TestRefusalsOverTheWire: a stale write through the protocol shows in
// the refusals method with the client's address and the grant it used.
func TestRefusalsOverTheWire(t *testing.T) {
	addr, _ := fencekvtest.Serve(t, nil)
	ctx := context.Background()
	c, err := wire.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := c.Acquire(ctx, "L", time.Minute, &fencekv.AcquireOptions{Holder: "worker-a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{Token: a.Token + 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, []byte("k"), []byte("zombie"), fencekv.WriteOptions{Token: a.Token}); !errors.Is(err, fencekv.ErrStaleToken) {
		t.Fatalf("stale put: %v", err)
	}
	rs, last, err := c.Refusals(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || last != 1 {
		t.Fatalf("refusals = %+v, last %d; want one", rs, last)
	}
	r := rs[0]
	if r.Code != fencekv.CodeStaleToken || string(r.Key) != "k" || r.Token != a.Token || r.Fence != a.Token+5 ||
		r.GrantedLock != "L" || r.GrantedHolder != "worker-a" || !strings.HasPrefix(r.Client, "127.0.0.1:") || r.Op != "put" {
		t.Fatalf("refusal = %+v", r)
	}
	if rs, _, _ := c.Refusals(ctx, last, 0); len(rs) != 0 {
		t.Fatalf("refusals after the last = %+v; want none", rs)
	}
}
