package wire_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// cutProxy forwards TCP connections to addr until cut closes every
// connection it carries (it keeps accepting new ones).
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T, addr string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestWatcherResumes: the Go watcher's connection is cut twice while a
// writer writes 1..300; it reconnects, resumes from the last revision it
// delivered, and the caller sees every value once, in order.
func TestWatcherResumes(t *testing.T) {
	ts := startServer(t, nil)
	p := newCutProxy(t, ts.Addr)
	ctx := context.Background()
	w, err := wire.Watch(ctx, []string{p.ln.Addr().String()}, fencekv.WatchOptions{Prefix: []byte("w/")})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c, err := wire.Dial(ctx, ts.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 300
	go func() {
		for i := 1; i <= n; i++ {
			c.Put(ctx, []byte("w/k"), []byte(fmt.Sprint(i)), fencekv.WriteOptions{})
			c.Put(ctx, []byte("other"), []byte("x"), fencekv.WriteOptions{})
			if i == 100 || i == 200 {
				p.cut()
			}
		}
	}()
	next := 1
	deadline := time.After(30 * time.Second)
	for next <= n {
		select {
		case b, ok := <-w.Events():
			if !ok {
				t.Fatalf("watcher ended at %d: %v", next, w.Err())
			}
			for _, e := range b {
				if got := string(e.Value); got != fmt.Sprint(next) {
					t.Fatalf("event %q; want %d (a gap or a repeat)", got, next)
				}
				next++
			}
		case <-deadline:
			t.Fatalf("only %d of %d events within 30s", next-1, n)
		}
	}
}

// TestWatcherPassesOverSilentNode: a node that accepts the connection but
// answers nothing (stopped, hung) is passed over after the dial timeout,
// as by DialCluster: the watch used to wait 10 s for its first answer
// there before trying the next address.
func TestWatcherPassesOverSilentNode(t *testing.T) {
	ts := startServer(t, nil)
	silent, err := net.Listen("tcp", "127.0.0.1:0") // never accepts
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ctx := context.Background()
	began := time.Now()
	w, err := wire.WatchWith(ctx, []string{silent.Addr().String(), ts.Addr}, fencekv.WatchOptions{Prefix: []byte("w/")},
		&wire.DialOptions{DialTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("the watch started after %v; want the silent node passed over after its 200ms dial timeout", d)
	}
	if _, err := ts.DB.Put(ctx, []byte("w/k"), []byte("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-w.Events():
		if len(b) != 1 || string(b[0].Key) != "w/k" {
			t.Fatalf("events %+v; want the put of w/k", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no event: %v", w.Err())
	}
}
