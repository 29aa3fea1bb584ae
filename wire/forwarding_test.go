package wire_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// forwardSeen records whether each request it serves was marked as
// forwarded (wire.Forwarded), as a cluster node's engine would look.
type forwardSeen struct {
	*fencekv.DB
	mu     sync.Mutex // guards seen, method
	seen   []bool
	method map[string]bool // the last request of each method: marked
}

func (f *forwardSeen) record(ctx context.Context, method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, wire.Forwarded(ctx))
	if f.method == nil {
		f.method = map[string]bool{}
	}
	f.method[method] = wire.Forwarded(ctx)
}

// last is what the last request said, and how many were served.
func (f *forwardSeen) last() (bool, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.seen) == 0 {
		return false, 0
	}
	return f.seen[len(f.seen)-1], len(f.seen)
}

func (f *forwardSeen) Get(ctx context.Context, key []byte) (fencekv.Entry, error) {
	f.record(ctx, "get")
	return f.DB.Get(ctx, key)
}

func (f *forwardSeen) Put(ctx context.Context, key, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	f.record(ctx, "put")
	return f.DB.Put(ctx, key, value, w)
}

// TestForwardingMarksConnection: after Client.Forwarding, every request
// on the client's connection reaches the engine marked as forwarded (the
// mark a cluster node reads to forward a request no further), on a
// connection the client makes after a break too; another client's
// requests are not marked.
func TestForwardingMarksConnection(t *testing.T) {
	eachMode(t, func(t *testing.T, loop bool) {
		eng := &forwardSeen{DB: openDB(t)}
		cfg := wireConfig()
		cfg.EventLoop = loop
		_, addr, _ := serveEngine(t, eng, cfg)
		ctx := context.Background()
		want := func(what string, forwarded bool, n int) {
			t.Helper()
			if f, got := eng.last(); got != n || f != forwarded {
				t.Fatalf("%s: request %d marked forwarded %v; want request %d, %v", what, got, f, n, forwarded)
			}
		}
		plain := dial(t, addr)
		_, err := plain.Get(ctx, b("k"))
		ok(t, err)
		want("a client's get", false, 1)

		p := startProxy(t, addr)
		fw := dial(t, p.addr)
		ok(t, fw.Forwarding(ctx))
		_, err = fw.Get(ctx, b("k"))
		ok(t, err)
		want("a forwarder's get", true, 2)
		_, err = fw.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{})
		ok(t, err)
		want("a forwarder's put", true, 3)

		// The connection breaks: the client's next connection is
		// marked too (the call that met the break reached nothing).
		p.cut()
		n := 3
		for range 3 {
			if _, err = fw.Get(ctx, b("k")); err == nil {
				n++
				break
			}
		}
		ok(t, err)
		want("a forwarder's get after a reconnect", true, n)
		if got := p.connections(); got != 2 {
			t.Fatalf("%d connections through the proxy; want 2", got)
		}

		_, err = plain.Get(ctx, b("k"))
		ok(t, err)
		want("a client's get after a forwarder's", false, n+1)
	})
}

// TestForwardingMarksOnlyLaterRequests: the mark applies to the requests
// read after the forwarding message, not to one read before it, even when
// both arrive in one segment and are served at once.
func TestForwardingMarksOnlyLaterRequests(t *testing.T) {
	eachMode(t, func(t *testing.T, loop bool) {
		eng := &forwardSeen{DB: openDB(t)}
		cfg := wireConfig()
		cfg.EventLoop = loop
		_, addr, _ := serveEngine(t, eng, cfg)
		for i := range 20 {
			raw := dialRaw(t, addr)
			raw.send(
				[]any{0, 1, "put", []any{map[string]any{"key": "k", "value": "v"}}},
				[]any{2, "forwarding", []any{}},
				[]any{0, 2, "get", []any{map[string]any{"key": "k"}}},
			)
			for range 2 {
				if p := raw.reply(); p.err != nil {
					t.Fatalf("answer %+v", p)
				}
			}
			eng.mu.Lock()
			put, get := eng.method["put"], eng.method["get"]
			eng.method = nil
			eng.mu.Unlock()
			if put || !get {
				t.Fatalf("round %d: put marked %v, get marked %v; want the put unmarked and the get marked", i, put, get)
			}
			raw.nc.Close()
		}
	})
}

// TestReadIndexSingleNode: read_index, a cluster follower's ask to its
// leader, is answered not_leader by a single node (it leads no cluster),
// and changes nothing.
func TestReadIndexSingleNode(t *testing.T) {
	db := openDB(t)
	_, addr, _ := serveEngine(t, db, wireConfig())
	cl := dial(t, addr)
	_, err := cl.ReadIndex(context.Background())
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeNotLeader {
		t.Fatalf("read_index on a single node = %v; want not_leader", err)
	}
	if _, err := cl.Ping(context.Background()); err != nil {
		t.Fatalf("the connection after read_index: %v", err)
	}
}

// holdingPuts holds a put of the key "held" until release is closed, and
// reports every put as it reaches the engine.
type holdingPuts struct {
	*fencekv.DB
	arrived chan string
	release chan struct{}
}

func (h *holdingPuts) Put(ctx context.Context, key, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	h.arrived <- string(key)
	if string(key) == "held" {
		<-h.release
	}
	return h.DB.Put(ctx, key, value, w)
}

// TestForwardedWritesNotHeldBehindOne: on another node's forwarding link,
// which carries many clients' requests, a write that waits for its commit
// holds up none read after it. A plain connection's lone write is served
// by its reader (the client waits for its answer), and so was a
// forwarded one: the link's next write then sat unread until the first
// committed, missing the raft batch it could have shared.
func TestForwardedWritesNotHeldBehindOne(t *testing.T) {
	eachMode(t, func(t *testing.T, loop bool) {
		eng := &holdingPuts{DB: openDB(t), arrived: make(chan string, 4), release: make(chan struct{})}
		cfg := wireConfig()
		cfg.EventLoop = loop
		_, addr, _ := serveEngine(t, eng, cfg)
		raw := dialRaw(t, addr)
		raw.send([]any{2, "forwarding", []any{}})
		raw.send([]any{0, 1, "put", []any{map[string]any{"key": "held", "value": "v"}}})
		if k := <-eng.arrived; k != "held" {
			t.Fatalf("the first put to arrive: %q", k)
		}
		raw.send([]any{0, 2, "put", []any{map[string]any{"key": "next", "value": "v"}}})
		select {
		case k := <-eng.arrived:
			if k != "next" {
				t.Fatalf("the second put to arrive: %q", k)
			}
		case <-time.After(10 * time.Second):
			close(eng.release)
			t.Fatal("a forwarded put waited unread behind one waiting for its commit")
		}
		close(eng.release)
		for range 2 {
			if p := raw.reply(); p.err != nil {
				t.Fatalf("answer %+v", p)
			}
		}
	})
}
