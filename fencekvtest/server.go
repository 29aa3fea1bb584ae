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
	// Cleanups run last-in first-out: the server stops before the store
	// closes.
	tb.Cleanup(func() {
		if err := db.Close(); err != nil {
			tb.Errorf("fencekvtest: close: %v", err)
		}
	})
	_, addr := ServeEngine(tb, db, wire.DefaultConfig())
	return addr, db
}

// ServeEngine serves eng (a store, or a test's stand-in for one) with cfg
// on a free port of 127.0.0.1 until the test ends, then shuts the server
// down, failing the test if it does not stop cleanly. It returns the
// server and its address. Closing eng, if needed, is the caller's: a
// cleanup registered before ServeEngine runs after the server has stopped.
func ServeEngine(tb testing.TB, eng wire.Engine, cfg wire.Config) (*wire.Server, string) {
	tb.Helper()
	srv, err := wire.NewServer(eng, cfg)
	if err != nil {
		tb.Fatalf("fencekvtest: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
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
			tb.Errorf("fencekvtest: Serve returned %v; want ErrServerClosed", err)
		}
	})
	return srv, ln.Addr().String()
}
