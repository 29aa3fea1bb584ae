package fencekvtest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// Serve starts a fencekv server for a test: a fresh store in tb.TempDir()
// (opened with opts; nil means the defaults), served on a free port of
// 127.0.0.1. It returns the address and the store, and shuts both down
// when the test ends, failing it if they do not stop cleanly.
//
//	addr, _ := fencekvtest.Serve(t, nil)
//	c, err := wire.Dial(ctx, addr)
func Serve(tb testing.TB, opts *fencekv.Options) (string, *fencekv.DB) {
	tb.Helper()
	db, err := fencekv.Open(tb.TempDir(), opts)
	if err != nil {
		tb.Fatalf("fencekvtest: open: %v", err)
	}
	srv, err := wire.NewServer(db, wire.DefaultConfig())
	if err != nil {
		db.Close()
		tb.Fatalf("fencekvtest: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		db.Close()
		tb.Fatalf("fencekvtest: listen: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			tb.Errorf("fencekvtest: shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, wire.ErrServerClosed) {
			tb.Errorf("fencekvtest: serve: %v", err)
		}
		if err := db.Close(); err != nil {
			tb.Errorf("fencekvtest: close: %v", err)
		}
	})
	return ln.Addr().String(), db
}
