package wire_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

func TestSmoke(t *testing.T) {
	db, err := fencekv.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	srv, _ := wire.NewServer(db, wire.DefaultConfig())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	ctx := context.Background()
	c, err := wire.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, err := c.Ping(ctx); err != nil || v != fencekv.Version {
		t.Fatalf("ping %q %v", v, err)
	}
	l, err := c.Acquire(ctx, "l", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{Token: l.Token, Lock: "l"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{})
	var fe *fencekv.Error
	if !errors.Is(err, fencekv.ErrStaleToken) || !errors.As(err, &fe) || fe.Fence != l.Token {
		t.Fatalf("err %v", err)
	}
	e, err := c.Get(ctx, []byte("k"))
	if err != nil || string(e.Value) != "v" {
		t.Fatalf("%+v %v", e, err)
	}
	_, err = c.Acquire(ctx, "l", time.Second, &fencekv.AcquireOptions{Wait: 50 * time.Millisecond})
	if !errors.Is(err, fencekv.ErrLockHeld) {
		t.Fatalf("err %v", err)
	}
	st, err := c.Status(ctx)
	if err != nil || st.LastToken != l.Token {
		t.Fatalf("%+v %v", st, err)
	}
}
