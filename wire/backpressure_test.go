package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// These tests drive one connection through net.Pipe, which buffers
// nothing: a write blocks until the other end reads it. So a client that
// does not read blocks the server's first write to it at once, and the
// state of the connection's answer queue can be checked exactly.

// pipeListener hands out the server ends of net.Pipe connections.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// pipeClient is the client end of a piped connection: requests are sent
// in order by a goroutine (the send may block while the server does not
// read), and sent counts those the server has taken.
type pipeClient struct {
	t    *testing.T
	nc   net.Conn
	reqs chan []byte
	sent atomic.Int32
	dec  *msgpack.Decoder
}

// pipeServer serves a fresh store over piped connections; the store holds
// a 20 KiB value under "k", and the lock "L" is held by the test.
type pipeServer struct {
	srv  *Server
	db   *fencekv.DB
	ln   *pipeListener
	held fencekv.Lease
}

func newPipeServer(t *testing.T, edit func(*Config)) *pipeServer {
	t.Helper()
	return newPipeServerEngine(t, edit, func(db *fencekv.DB) Engine { return db })
}

// newPipeServerEngine is newPipeServer serving wrap(store).
func newPipeServerEngine(t *testing.T, edit func(*Config), wrap func(*fencekv.DB) Engine) *pipeServer {
	t.Helper()
	o := fencekv.DefaultOptions()
	o.NoSync = true
	db, err := fencekv.Open(t.TempDir(), &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg := DefaultConfig()
	edit(&cfg)
	srv, err := NewServer(wrap(db), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})
	ctx := context.Background()
	if _, err := db.Put(ctx, []byte("k"), bytes.Repeat([]byte("v"), 20<<10), fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	held, err := db.Acquire(ctx, "L", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &pipeServer{srv: srv, db: db, ln: ln, held: held}
}

// dial connects a piped client and returns it with the server's conn.
func (ps *pipeServer) dial(t *testing.T) (*pipeClient, *conn) {
	t.Helper()
	cli, srvEnd := net.Pipe()
	ps.ln.conns <- srvEnd
	pc := &pipeClient{t: t, nc: cli, reqs: make(chan []byte, 1000), dec: msgpack.NewDecoder(cli)}
	go func() {
		for r := range pc.reqs {
			if _, err := cli.Write(r); err != nil {
				return
			}
			pc.sent.Add(1)
		}
	}()
	t.Cleanup(func() {
		close(pc.reqs)
		cli.Close()
	})
	var c *conn
	waitUntil(t, "the connection to be accepted", func() bool {
		ps.srv.mu.Lock()
		defer ps.srv.mu.Unlock()
		for c = range ps.srv.conns {
		}
		return c != nil
	})
	return pc, c
}

func (pc *pipeClient) send(msg ...any) { pc.reqs <- marshalT(pc.t, msg) }

func (pc *pipeClient) read() []any {
	pc.t.Helper()
	pc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var msg []any
	if err := pc.dec.Decode(&msg); err != nil {
		pc.t.Fatalf("reading an answer: %v", err)
	}
	return msg
}

// waitUntil polls cond until it holds, failing the test after 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// state reads the connection's queue under its lock.
func (c *conn) state() (pending int64, queued int, flushing, waiting bool) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.pending.Load(), len(c.queue), c.flushing, c.waiting
}

// overBudget brings a connection over its budget with a client that reads
// nothing: an acquire waits for "L"; releasing L grants it, and the
// handler writing the grant blocks on the unread pipe, as the flusher.
// Then gets of the 20 KiB value, served by the read loop, are queued
// behind it until the read loop stops for room. It returns the number of
// gets sent.
func overBudget(t *testing.T, ps *pipeServer, pc *pipeClient, c *conn) int {
	t.Helper()
	pc.send(0, 1, "acquire", []any{map[string]any{"lock": "L", "ttl_ms": 10_000, "wait_ms": 60_000}})
	waitUntil(t, "the acquire to queue", func() bool {
		in, err := ps.db.LockInfo(context.Background(), "L")
		return err == nil && in.Waiters == 1
	})
	if err := ps.db.Release(context.Background(), "L", ps.held.Token); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the grant's writer to block on the unread pipe", func() bool {
		_, _, flushing, _ := c.state()
		return flushing
	})
	const gets = 100
	for i := range gets {
		pc.send(0, 100+i, "get", []any{map[string]any{"key": "k"}})
	}
	waitUntil(t, "the read loop to wait for room", func() bool {
		_, _, _, waiting := c.state()
		return waiting
	})
	return gets
}

// TestBackpressureStopsReading: past its budget of unsent answers a
// connection's requests are no longer read; it holds at most the budget
// and one more answer; once the client reads, everything is answered.
func TestBackpressureStopsReading(t *testing.T) {
	const budget = 64 << 10
	ps := newPipeServer(t, func(c *Config) { c.MaxPendingBytes = budget })
	pc, c := ps.dial(t)
	gets := overBudget(t, ps, pc, c)

	pending, queued, _, _ := c.state()
	// Each get's answer holds about 20 KiB (its encoder's buffer may be
	// up to twice that); the budget is about three of them.
	if pending <= budget || pending > budget+64<<10 {
		t.Fatalf("%d bytes pending in %d answers with a budget of %d; want over it by at most one answer", pending, queued, budget)
	}
	if n := int(pc.sent.Load()); n >= gets {
		t.Fatalf("the server took all %d requests of a client that reads nothing", n)
	}
	t.Logf("stopped reading with %d answers queued, %d bytes pending (budget %d), %d of %d gets sent", queued, pending, budget, pc.sent.Load(), gets)

	// The client reads: the grant and every get are answered.
	seen := map[int64]bool{}
	for range gets + 1 {
		msg := pc.read()
		id := msgNum(msg[1])
		if msg[2] != nil || seen[id] {
			t.Fatalf("answer %v", msg[:3])
		}
		seen[id] = true
	}
	if !seen[1] {
		t.Fatal("the acquire was not answered")
	}
	waitUntil(t, "nothing pending", func() bool {
		pending, queued, flushing, _ := c.state()
		return pending == 0 && queued == 0 && !flushing
	})
}

func msgNum(v any) int64 {
	switch n := v.(type) {
	case int8:
		return int64(n)
	case int16:
		return int64(n)
	case int32:
		return int64(n)
	case int64:
		return n
	case uint8:
		return int64(n)
	case uint16:
		return int64(n)
	case uint32:
		return int64(n)
	case uint64:
		return int64(n)
	}
	return -1
}

// TestBackpressureShutdown: a read loop that waits for room is ended by
// Shutdown, which then closes the connection whose client never reads
// when its deadline passes.
func TestBackpressureShutdown(t *testing.T) {
	ps := newPipeServer(t, func(c *Config) { c.MaxPendingBytes = 64 << 10 })
	pc, c := ps.dial(t)
	overBudget(t, ps, pc, c)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ps.srv.Shutdown(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Shutdown = %v; want its deadline to pass (the client reads nothing)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	if n := ps.srv.Conns(); n != 0 {
		t.Fatalf("%d connections after Shutdown", n)
	}
}

// TestBackpressureWriteTimeout: a client that reads nothing is dropped
// after the write timeout, also when its read loop waits for room.
func TestBackpressureWriteTimeout(t *testing.T) {
	ps := newPipeServer(t, func(c *Config) {
		c.MaxPendingBytes = 64 << 10
		// Long enough to bring the connection over budget first.
		c.WriteTimeout = 2 * time.Second
	})
	pc, c := ps.dial(t)
	overBudget(t, ps, pc, c)
	waitUntil(t, "the connection to be dropped", func() bool { return ps.srv.Conns() == 0 })
	pending, queued, _, _ := c.state()
	if pending != 0 || queued != 0 {
		t.Fatalf("%d bytes in %d answers still held after the connection was dropped", pending, queued)
	}
}

// gatedEngine holds every Put and Txn until gate is closed.
type gatedEngine struct {
	*fencekv.DB
	gate    chan struct{}
	entered atomic.Int32
}

func (g *gatedEngine) Put(ctx context.Context, key, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	g.entered.Add(1)
	<-g.gate
	return g.DB.Put(ctx, key, value, w)
}

func (g *gatedEngine) Txn(ctx context.Context, compares []fencekv.Compare, ops []fencekv.TxnOp, w fencekv.WriteOptions) (fencekv.Revision, []fencekv.TxnResult, error) {
	g.entered.Add(1)
	<-g.gate
	return g.DB.Txn(ctx, compares, ops, w)
}

// TestBackpressureWritesInFlight: writes in flight count their arguments
// against the budget until they are applied, so a client that pipelines
// large puts (or transactions: their ops once counted nothing) faster than
// they commit stops being read once they hold the budget, instead of the
// server holding up to the in-flight limit (1024) of their values.
func TestBackpressureWritesInFlight(t *testing.T) {
	value := bytes.Repeat([]byte("v"), 100<<10)
	for method, params := range map[string]func(i int) map[string]any{
		"put": func(i int) map[string]any { return map[string]any{"key": fmt.Sprint("p/", i), "value": value} },
		"txn": func(i int) map[string]any {
			return map[string]any{"ops": []any{map[string]any{"op": "put", "key": fmt.Sprint("t/", i), "value": value}}}
		},
	} {
		t.Run(method, func(t *testing.T) { testWritesInFlight(t, method, params, len(value)) })
	}
}

func testWritesInFlight(t *testing.T, method string, params func(i int) map[string]any, size int) {
	const budget = 256 << 10
	g := &gatedEngine{gate: make(chan struct{})}
	ps := newPipeServerEngine(t, func(c *Config) { c.MaxPendingBytes = budget }, func(db *fencekv.DB) Engine {
		g.DB = db
		return g
	})
	var once sync.Once
	open := func() { once.Do(func() { close(g.gate) }) }
	t.Cleanup(open)
	pc, c := ps.dial(t)
	// 20 writes of 100 KiB in one write, so that each has bytes behind it
	// when read: all are served concurrently, none by the read loop.
	var all []byte
	for i := range 20 {
		all = append(all, marshalT(t, []any{0, i, method, []any{params(i)}})...)
	}
	pc.reqs <- all
	waitUntil(t, "three writes to reach the engine", func() bool { return g.entered.Load() >= 3 })
	waitUntil(t, "the read loop to wait for room", func() bool {
		_, _, _, waiting := c.state()
		return waiting
	})
	pending, _, _, _ := c.state()
	if n := g.entered.Load(); n != 3 || pending <= budget || pending > budget+int64(size)+1<<10 {
		t.Fatalf("%d %ss of %d bytes in the engine, %d bytes pending; want 3, just over the budget of %d", n, method, size, pending, budget)
	}
	open()
	for range 20 {
		if msg := pc.read(); msg[2] != nil {
			t.Fatalf("%s answered %v", method, msg)
		}
	}
	if n := g.entered.Load(); n != 20 {
		t.Fatalf("%d %ss applied; want 20", n, method)
	}
	waitUntil(t, "nothing pending", func() bool {
		pending, queued, flushing, _ := c.state()
		return pending == 0 && queued == 0 && !flushing
	})
}
