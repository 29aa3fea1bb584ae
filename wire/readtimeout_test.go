package wire_test

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// ping is the request [0, 1, "ping", []].
var pingRequest = []byte{0x94, 0x00, 0x01, 0xa4, 'p', 'i', 'n', 'g', 0x90}

// TestReadTimeout: a message whose first bytes arrived and whose rest does
// not within the read timeout closes its connection (a half-sent message
// no longer holds one forever); an idle connection, with no message begun,
// is left open; a message that arrives in pieces within the timeout is
// served. On both server paths, with real sockets.
func TestReadTimeout(t *testing.T) {
	for _, loop := range []bool{true, false} {
		name := "goroutine"
		if loop {
			name = "event-loop"
		}
		t.Run(name, func(t *testing.T) {
			const timeout = 300 * time.Millisecond
			ts := startServer(t, func(_ *fencekv.Options, c *wire.Config) {
				c.ReadTimeout = timeout
				c.EventLoop = loop
			})
			idle := rawDial(t, ts.Addr)
			half := rawDial(t, ts.Addr)
			slow := rawDial(t, ts.Addr)
			start := time.Now()
			if _, err := half.Write(pingRequest[:4]); err != nil {
				t.Fatal(err)
			}
			// The slow client sends its ping in two pieces, a third of
			// the timeout apart.
			slow.Write(pingRequest[:3])
			time.Sleep(timeout / 3)
			slow.Write(pingRequest[3:])
			expectPong(t, slow)

			half.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, err := half.Read(make([]byte, 64))
			if n != 0 || err == nil || strings.Contains(err.Error(), "timeout") {
				t.Fatalf("half-sent message: read %d bytes, %v; want the server to close the connection", n, err)
			}
			if d := time.Since(start); d < timeout {
				t.Errorf("closed after %v, before the read timeout %v", d, timeout)
			}
			// The idle one is still served, well past the timeout.
			if _, err := idle.Write(pingRequest); err != nil {
				t.Fatal(err)
			}
			expectPong(t, idle)
			// And the server counts the closed one gone.
			eventually(t, 5*time.Second, "the half-sent connection to be dropped", func() bool { return ts.Srv.Conns() == 2 })
		})
	}
}

func rawDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// expectPong reads the answer to pingRequest: [1, 1, nil, {version: ...}].
func expectPong(t *testing.T, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 4)
	if _, err := io.ReadFull(nc, b); err != nil {
		t.Fatalf("no answer to ping: %v", err)
	}
	if !bytes.Equal(b, []byte{0x94, 0x01, 0x01, 0xc0}) {
		t.Fatalf("answer to ping begins % x", b)
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest := make([]byte, 256)
	nc.Read(rest) // the result map
}

// TestMaxConnsRefusalsLogged: connections over MaxConns are logged, at
// most one line a second with the count, not one line each.
func TestMaxConnsRefusalsLogged(t *testing.T) {
	logs := &allLogs{}
	ts := startServer(t, func(_ *fencekv.Options, c *wire.Config) { c.MaxConns = 1 })
	_ = ts
	cfg := wire.DefaultConfig()
	cfg.MaxConns = 1
	cfg.Logger = slog.New(logs)
	srv, addr := fencekvtest.ServeEngine(t, ts.DB, cfg)
	_ = srv
	held := rawDial(t, addr)
	held.Write(pingRequest)
	expectPong(t, held)
	for range 20 {
		nc := rawDial(t, addr)
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.ReadAll(nc) // the limit_exceeded notification, then the close
		nc.Close()
	}
	lines := logs.matching("refusing connections over --max-conns")
	if len(lines) == 0 || len(lines) > 2 {
		t.Fatalf("%d log lines for 20 refusals within a second or two, want 1 or 2:\n%s", len(lines), logs)
	}
	wantContains := "refused=1"
	if !strings.Contains(lines[0], wantContains) {
		t.Errorf("first line %q lacks %q", lines[0], wantContains)
	}
}
