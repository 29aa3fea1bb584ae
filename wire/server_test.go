package wire_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// logRecorder keeps the messages a test server logs at Error and above.
// The server logs a recovered panic at Error, so a test server whose
// recorder is not empty at the end has hit a bug, unless the test expects
// errors (it provokes a panic on purpose).
type logRecorder struct {
	*fencekvtest.Logs
	allow atomic.Bool
}

func (h *logRecorder) expectErrors() { h.allow.Store(true) }

// testServer is a wire server in this process, listening on 127.0.0.1
// with its store in a temp dir.
type testServer struct {
	Addr string
	DB   *fencekv.DB
	Srv  *wire.Server
	Logs *logRecorder
}

// startServer starts a server on a fresh store and stops it (and closes the
// store) when the test ends. edit, if not nil, changes the engine's options
// and the server's config first. The store skips fsync: durability is the
// engine's tests' business, and fsync only slows this suite.
func startServer(tb testing.TB, edit func(*fencekv.Options, *wire.Config)) *testServer {
	tb.Helper()
	o := fencekv.DefaultOptions()
	o.NoSync = true
	cfg := wire.DefaultConfig()
	// FENCEKV_TEST_EVENT_LOOP=0 (make test's second run) serves each
	// connection from a goroutine, unless the test chooses.
	cfg.EventLoop = os.Getenv("FENCEKV_TEST_EVENT_LOOP") != "0"
	if edit != nil {
		edit(&o, &cfg)
	}
	db, err := fencekv.Open(tb.TempDir(), &o)
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	// Cleanups run last-in first-out: the server stops before the store closes.
	tb.Cleanup(func() {
		if err := db.Close(); err != nil {
			tb.Errorf("close store: %v", err)
		}
	})
	ts := &testServer{DB: db}
	ts.Srv, ts.Addr, ts.Logs = serveEngine(tb, db, cfg)
	return ts
}

// serveEngine serves eng on 127.0.0.1:0 until the test ends, then shuts
// the server down and fails the test if it logged an error it should not
// have.
func serveEngine(tb testing.TB, eng wire.Engine, cfg wire.Config) (*wire.Server, string, *logRecorder) {
	tb.Helper()
	logs := &logRecorder{Logs: fencekvtest.NewLogs(slog.LevelError)}
	cfg.Logger = slog.New(logs)
	// Registered first, so run last: once the server has shut down.
	tb.Cleanup(func() {
		if msgs := logs.Messages(); !logs.allow.Load() && len(msgs) > 0 {
			tb.Errorf("server logged errors:\n%s", strings.Join(msgs, "\n"))
		}
	})
	srv, addr := fencekvtest.ServeEngine(tb, eng, cfg)
	return srv, addr, logs
}

// dial connects a client that is closed when the test ends.
func dial(tb testing.TB, addr string) *wire.Client {
	tb.Helper()
	c, err := wire.Dial(context.Background(), addr)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func ok(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// wantCode fails unless err is a refusal with code, and returns it.
func wantCode(tb testing.TB, err error, code fencekv.Code) *fencekv.Error {
	tb.Helper()
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != code {
		tb.Fatalf("err = %v; want %s", err, code)
	}
	if !errors.Is(err, &fencekv.Error{Code: code}) {
		tb.Fatalf("errors.Is(%v, %s) is false", err, code)
	}
	if fe.Message == "" {
		tb.Errorf("%s refusal has no message", code)
	}
	return fe
}

// eventually polls cond until it holds, failing the test after within.
var eventually = fencekvtest.Eventually

// waiters reports how many callers are queued for lock, read straight from
// the engine.
func waiters(tb testing.TB, db *fencekv.DB, lock string) int {
	tb.Helper()
	in, err := db.LockInfo(context.Background(), lock)
	if err != nil {
		tb.Fatal(err)
	}
	return in.Waiters
}

func b(s string) []byte { return []byte(s) }

// refused and refused2 keep only the error of a call's results.
func refused[T any](_ T, err error) error          { return err }
func refused2[T, U any](_ T, _ U, err error) error { return err }

// TestMethodsRoundTrip calls every method of the protocol through the Go
// client and a real TCP connection, and checks every field of the results.
func TestMethodsRoundTrip(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.Addr)
	ctx := context.Background()

	v, err := c.Ping(ctx)
	if err != nil || v != fencekv.Version {
		t.Fatalf("ping = %q, %v; want %q", v, err, fencekv.Version)
	}

	// put and get, unfenced.
	r1, err := c.Put(ctx, b("a"), b("1"), fencekv.WriteOptions{})
	ok(t, err)
	if r1.Fence != 0 || r1.Revision != 1 {
		t.Fatalf("first put = %+v; want fence 0 revision 1", r1)
	}
	e, err := c.Get(ctx, b("a"))
	ok(t, err)
	if !e.Found || string(e.Value) != "1" || e.Fence != 0 || e.Revision != 1 || string(e.Key) != "a" {
		t.Fatalf("get a = %+v", e)
	}
	e, err = c.Get(ctx, b("missing"))
	ok(t, err)
	if e.Found || e.Value != nil || e.Fence != 0 || e.Revision != 0 {
		t.Fatalf("get missing = %+v; want not found, fence 0, revision 0", e)
	}
	// An empty value is a value: found, and not nil.
	_, err = c.Put(ctx, b("empty"), nil, fencekv.WriteOptions{})
	ok(t, err)
	e, err = c.Get(ctx, b("empty"))
	ok(t, err)
	if !e.Found || e.Value == nil || len(e.Value) != 0 {
		t.Fatalf("get empty = %+v; want found with an empty value", e)
	}
	// Binary keys and values survive byte for byte.
	bk, bv := []byte{0, 0xff, '\n', 0xc1}, bytes.Repeat([]byte{0, 1, 0xfe}, 1000)
	_, err = c.Put(ctx, bk, bv, fencekv.WriteOptions{})
	ok(t, err)
	e, err = c.Get(ctx, bk)
	ok(t, err)
	if !bytes.Equal(e.Value, bv) {
		t.Fatalf("binary value came back as %d bytes", len(e.Value))
	}

	// Fenced puts; strict wants a token above the fence.
	r, err := c.Put(ctx, b("f"), b("x"), fencekv.WriteOptions{Token: 7})
	ok(t, err)
	if r.Fence != 7 {
		t.Fatalf("put token 7: fence %d", r.Fence)
	}
	r, err = c.Put(ctx, b("f"), b("y"), fencekv.WriteOptions{Token: 8, Strict: true})
	ok(t, err)
	if r.Fence != 8 {
		t.Fatalf("strict put token 8: fence %d", r.Fence)
	}
	rev := r.Revision

	// delete keeps the fence; a delete of a missing key with a token raises it.
	deleted, r, err := c.Delete(ctx, b("f"), fencekv.WriteOptions{Token: 8})
	ok(t, err)
	if !deleted || r.Fence != 8 || r.Revision != rev+1 {
		t.Fatalf("delete f = %v %+v; want deleted, fence 8, revision %d", deleted, r, rev+1)
	}
	e, err = c.Get(ctx, b("f"))
	ok(t, err)
	if e.Found || e.Fence != 8 {
		t.Fatalf("get deleted f = %+v; want not found with fence 8", e)
	}
	deleted, r, err = c.Delete(ctx, b("never"), fencekv.WriteOptions{Token: 9})
	ok(t, err)
	if deleted || r.Fence != 9 || r.Revision != rev+2 {
		t.Fatalf("delete missing = %v %+v; want not deleted, fence 9, revision %d", deleted, r, rev+2)
	}

	// cas: revision 0 means absent; then the key's own revision.
	r, err = c.CAS(ctx, b("c"), 0, b("v1"), fencekv.WriteOptions{})
	ok(t, err)
	r2, err := c.CAS(ctx, b("c"), r.Revision, b("v2"), fencekv.WriteOptions{})
	ok(t, err)
	if r2.Revision <= r.Revision {
		t.Fatalf("cas revisions %d then %d", r.Revision, r2.Revision)
	}
	e, err = c.Get(ctx, b("c"))
	ok(t, err)
	if string(e.Value) != "v2" || e.Revision != r2.Revision {
		t.Fatalf("get c = %+v", e)
	}

	// incr counts from 0 and stores decimal text.
	n, _, err := c.Incr(ctx, b("n"), 5, fencekv.WriteOptions{})
	ok(t, err)
	if n != 5 {
		t.Fatalf("incr +5 = %d", n)
	}
	n, r, err = c.Incr(ctx, b("n"), -7, fencekv.WriteOptions{Token: 3})
	ok(t, err)
	if n != -2 || r.Fence != 3 {
		t.Fatalf("incr -7 = %d %+v; want -2 fence 3", n, r)
	}
	e, err = c.Get(ctx, b("n"))
	ok(t, err)
	if string(e.Value) != "-2" {
		t.Fatalf("get n = %q; want decimal text -2", e.Value)
	}

	// scan: prefix, limit, paging with start = last key + "\x00", deleted
	// keys left out.
	var revs []fencekv.Revision
	for _, k := range []string{"s/1", "s/2", "s/3", "s/4", "s/5"} {
		r, err := c.Put(ctx, b(k), b("v"+k), fencekv.WriteOptions{})
		ok(t, err)
		revs = append(revs, r.Revision)
	}
	_, _, err = c.Delete(ctx, b("s/3"), fencekv.WriteOptions{})
	ok(t, err)
	var got []string
	var start []byte
	for page := 0; ; page++ {
		items, more, err := c.Scan(ctx, fencekv.ScanOptions{Prefix: b("s/"), Start: start, Limit: 2})
		ok(t, err)
		if len(items) > 2 {
			t.Fatalf("page %d has %d items; limit 2", page, len(items))
		}
		for _, it := range items {
			got = append(got, string(it.Key))
			if string(it.Value) != "v"+string(it.Key) || !it.Found {
				t.Fatalf("scan item %+v", it)
			}
		}
		if !more {
			break
		}
		start = append(items[len(items)-1].Key, 0)
	}
	if strings.Join(got, " ") != "s/1 s/2 s/4 s/5" {
		t.Fatalf("scan pages = %v; want s/1 s/2 s/4 s/5", got)
	}
	items, more, err := c.Scan(ctx, fencekv.ScanOptions{Prefix: b("s/")})
	ok(t, err)
	if len(items) != 4 || more || items[0].Revision != revs[0] || items[3].Revision != revs[4] {
		t.Fatalf("scan all = %d items, more %v", len(items), more)
	}

	// Locks: acquire, lock_info, renew, a held write, locks, release.
	l, err := c.Acquire(ctx, "jobs/1", 10*time.Second, &fencekv.AcquireOptions{Holder: "alice"})
	ok(t, err)
	if l.Token != 1 || l.TTL != 10*time.Second || l.Name != "jobs/1" {
		t.Fatalf("acquire = %+v; want token 1, ttl 10s", l)
	}
	in, err := c.LockInfo(ctx, "jobs/1")
	ok(t, err)
	if !in.Held || in.Holder != "alice" || in.Token != l.Token || in.TTL <= 9*time.Second || in.TTL > 10*time.Second || in.Waiters != 0 {
		t.Fatalf("lock_info = %+v", in)
	}
	ttl, err := c.Renew(ctx, "jobs/1", l.Token)
	ok(t, err)
	if ttl != 10*time.Second {
		t.Fatalf("renew ttl = %v", ttl)
	}
	l2, err := c.Acquire(ctx, "other", time.Second, nil)
	ok(t, err)
	if l2.Token != l.Token+1 {
		t.Fatalf("second lock's token %d; want %d (one sequence for all locks)", l2.Token, l.Token+1)
	}
	r, err = c.Put(ctx, b("held"), b("v"), fencekv.WriteOptions{Token: l.Token, Lock: "jobs/1"})
	ok(t, err)
	if r.Fence != l.Token {
		t.Fatalf("held put fence %d", r.Fence)
	}
	ls, more, err := c.Locks(ctx, "jobs/", "", 0)
	ok(t, err)
	if len(ls) != 1 || more || ls[0].Name != "jobs/1" || !ls[0].Held || ls[0].Token != l.Token || ls[0].Holder != "alice" {
		t.Fatalf("locks jobs/ = %+v more %v", ls, more)
	}
	ls, more, err = c.Locks(ctx, "", "", 1)
	ok(t, err)
	if len(ls) != 1 || !more || ls[0].Name != "jobs/1" {
		t.Fatalf("locks limit 1 = %+v more %v; want jobs/1 and more", ls, more)
	}
	ls, _, err = c.Locks(ctx, "", "jobs/1\x00", 0)
	ok(t, err)
	if len(ls) != 1 || ls[0].Name != "other" {
		t.Fatalf("locks from jobs/1+0 = %+v; want other", ls)
	}
	ok(t, c.Release(ctx, "jobs/1", l.Token))
	in, err = c.LockInfo(ctx, "jobs/1")
	ok(t, err)
	if in.Held || in.Token != 0 && in.Token != l.Token || in.TTL != 0 {
		t.Fatalf("lock_info after release = %+v", in)
	}

	st, err := c.Status(ctx)
	ok(t, err)
	if st.Version != fencekv.Version || st.LastToken != l2.Token || st.Locks != 1 || st.Waiters != 0 || st.Keys == 0 || st.Commits == 0 || st.DataSize <= 0 {
		t.Fatalf("status = %+v", st)
	}
	last, err := c.Put(ctx, b("last"), b("v"), fencekv.WriteOptions{})
	ok(t, err)
	st, err = c.Status(ctx)
	ok(t, err)
	if st.Revision != last.Revision {
		t.Fatalf("status revision %d; want the last write's %d", st.Revision, last.Revision)
	}
	// Keys alive: a, empty, bk, c, n, s/1, s/2, s/4, s/5, held, last.
	if st.Keys != 11 {
		t.Fatalf("status keys = %d; want 11", st.Keys)
	}
}

// errServer starts a server whose engine runs on a fake clock, so leases
// expire when the test says.
func errServer(t *testing.T, edit func(*fencekv.Options, *wire.Config)) (*testServer, *fencekvtest.Clock, *wire.Client) {
	t.Helper()
	clock := fencekvtest.NewClock()
	ts := startServer(t, func(o *fencekv.Options, c *wire.Config) {
		o.Clock = clock
		if edit != nil {
			edit(o, c)
		}
	})
	return ts, clock, dial(t, ts.Addr)
}

// TestErrorCodes provokes every refusal over the wire and checks its code
// and facts.
func TestErrorCodes(t *testing.T) {
	ctx := context.Background()
	none := fencekv.WriteOptions{}

	t.Run("stale_token", func(t *testing.T) {
		_, _, c := errServer(t, nil)
		_, err := c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: 5})
		ok(t, err)
		for _, tc := range []struct {
			name string
			err  error
		}{
			{"put lower token", refused(c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: 3}))},
			{"put no token", refused(c.Put(ctx, b("k"), b("v"), none))},
			{"put strict same", refused(c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: 5, Strict: true}))},
			{"delete", refused2(c.Delete(ctx, b("k"), fencekv.WriteOptions{Token: 4}))},
			{"cas", refused(c.CAS(ctx, b("k"), 1, b("v"), fencekv.WriteOptions{Token: 4}))},
			{"incr", refused2(c.Incr(ctx, b("k"), 1, fencekv.WriteOptions{Token: 4}))},
		} {
			if fe := wantCode(t, tc.err, fencekv.CodeStaleToken); fe.Fence != 5 {
				t.Errorf("%s: fence %d; want 5", tc.name, fe.Fence)
			}
		}
		// The fence outlives a delete.
		_, _, err = c.Delete(ctx, b("k"), fencekv.WriteOptions{Token: 6})
		ok(t, err)
		_, err = c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: 5})
		if fe := wantCode(t, err, fencekv.CodeStaleToken); fe.Fence != 6 {
			t.Errorf("after delete: fence %d; want 6", fe.Fence)
		}
		e, err := c.Get(ctx, b("k"))
		ok(t, err)
		if e.Found {
			t.Errorf("a refused write changed the key: %+v", e)
		}
	})

	t.Run("not_holder", func(t *testing.T) {
		_, _, c := errServer(t, nil)
		l, err := c.Acquire(ctx, "L", 10*time.Second, nil)
		ok(t, err)
		wrong := l.Token + 100
		for _, tc := range []struct {
			name string
			err  error
		}{
			{"held put", refused(c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: wrong, Lock: "L"}))},
			{"renew", refused(c.Renew(ctx, "L", wrong))},
			{"release", c.Release(ctx, "L", wrong)},
		} {
			if fe := wantCode(t, tc.err, fencekv.CodeNotHolder); fe.Token != l.Token {
				t.Errorf("%s: token %d; want the holder's %d", tc.name, fe.Token, l.Token)
			}
		}
		// A free lock: no current token.
		_, err = c.Renew(ctx, "free", 1)
		if fe := wantCode(t, err, fencekv.CodeNotHolder); fe.Token != 0 {
			t.Errorf("free lock: token %d; want 0", fe.Token)
		}
		ok(t, c.Release(ctx, "L", l.Token))
		_, err = c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: l.Token, Lock: "L"})
		wantCode(t, err, fencekv.CodeNotHolder)
	})

	t.Run("lease_expired", func(t *testing.T) {
		ts, clock, c := errServer(t, nil)
		l, err := c.Acquire(ctx, "L", time.Second, nil)
		ok(t, err)
		clock.Advance(1500 * time.Millisecond)
		for _, tc := range []struct {
			name string
			err  error
		}{
			{"renew", refused(c.Renew(ctx, "L", l.Token))},
			{"held put", refused(c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: l.Token, Lock: "L"}))},
			{"release", c.Release(ctx, "L", l.Token)},
		} {
			if fe := wantCode(t, tc.err, fencekv.CodeLeaseExpired); fe.Token != l.Token {
				t.Errorf("%s: token %d; want %d", tc.name, fe.Token, l.Token)
			}
		}
		if e, _ := ts.DB.Get(ctx, b("k")); e.Found {
			t.Errorf("a held write after expiry was applied")
		}
	})

	t.Run("lock_held", func(t *testing.T) {
		ts, clock, c := errServer(t, nil)
		l, err := c.Acquire(ctx, "L", 10*time.Second, &fencekv.AcquireOptions{Holder: "alice"})
		ok(t, err)
		_, err = c.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Holder: "bob"})
		fe := wantCode(t, err, fencekv.CodeLockHeld)
		if fe.Holder != "alice" || fe.Token != l.Token || fe.RetryAfter != 10*time.Second {
			t.Errorf("lock_held facts %+v; want holder alice, token %d, retry 10s", fe, l.Token)
		}
		clock.Advance(4 * time.Second)
		_, err = c.Acquire(ctx, "L", time.Second, nil)
		if fe := wantCode(t, err, fencekv.CodeLockHeld); fe.RetryAfter != 6*time.Second {
			t.Errorf("retry after 4s: %v; want 6s", fe.RetryAfter)
		}

		// A wait that runs out ends in lock_held too.
		done := make(chan error, 1)
		go func() {
			_, err := c.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: 2 * time.Second})
			done <- err
		}()
		eventually(t, 10*time.Second, "the acquire to queue", func() bool { return waiters(t, ts.DB, "L") == 1 })
		clock.Advance(2 * time.Second)
		err = <-done
		if fe := wantCode(t, err, fencekv.CodeLockHeld); fe.Holder != "alice" || fe.Token != l.Token || fe.RetryAfter != 4*time.Second {
			t.Errorf("after the wait: %+v; want alice, token %d, retry 4s", fe, l.Token)
		}

		// During a lock-delay nobody holds the lock, and retry_ms is the
		// delay left.
		_, err = c.Acquire(ctx, "D", time.Second, &fencekv.AcquireOptions{LockDelay: 5 * time.Second})
		ok(t, err)
		clock.Advance(1500 * time.Millisecond)
		_, err = c.Acquire(ctx, "D", time.Second, nil)
		if fe := wantCode(t, err, fencekv.CodeLockHeld); fe.RetryAfter != 4500*time.Millisecond || fe.Holder != "" {
			t.Errorf("in lock-delay: %+v; want retry 4.5s and no holder", fe)
		}
	})

	t.Run("compare_failed", func(t *testing.T) {
		_, _, c := errServer(t, nil)
		r, err := c.Put(ctx, b("k"), b("v"), none)
		ok(t, err)
		_, err = c.CAS(ctx, b("k"), r.Revision+10, b("w"), none)
		if fe := wantCode(t, err, fencekv.CodeCompareFailed); fe.Revision != r.Revision {
			t.Errorf("revision %d; want %d", fe.Revision, r.Revision)
		}
		_, err = c.CAS(ctx, b("k"), 0, b("w"), none)
		if fe := wantCode(t, err, fencekv.CodeCompareFailed); fe.Revision != r.Revision {
			t.Errorf("cas 0 on a present key: revision %d; want %d", fe.Revision, r.Revision)
		}
		_, err = c.CAS(ctx, b("absent"), 1, b("w"), none)
		if fe := wantCode(t, err, fencekv.CodeCompareFailed); fe.Revision != 0 {
			t.Errorf("cas on a missing key: revision %d; want 0", fe.Revision)
		}
	})

	t.Run("not_integer", func(t *testing.T) {
		_, _, c := errServer(t, nil)
		_, err := c.Put(ctx, b("word"), b("abc"), none)
		ok(t, err)
		_, _, err = c.Incr(ctx, b("word"), 1, none)
		wantCode(t, err, fencekv.CodeNotInteger)
		_, err = c.Put(ctx, b("max"), b("9223372036854775807"), none)
		ok(t, err)
		_, _, err = c.Incr(ctx, b("max"), 1, none)
		wantCode(t, err, fencekv.CodeNotInteger)
	})

	t.Run("too_large", func(t *testing.T) {
		ts, _, c := errServer(t, func(o *fencekv.Options, cfg *wire.Config) {
			o.MaxKeySize = 64
			o.MaxValueSize = 1024
			cfg.MaxMessageSize = 8 << 10
		})
		long := bytes.Repeat(b("k"), 65)
		_, err := c.Put(ctx, long, b("v"), none)
		wantCode(t, err, fencekv.CodeTooLarge)
		_, err = c.Get(ctx, long)
		wantCode(t, err, fencekv.CodeTooLarge)
		_, err = c.Acquire(ctx, string(long), time.Second, nil)
		wantCode(t, err, fencekv.CodeTooLarge)
		_, err = c.Put(ctx, b("k"), make([]byte, 1025), none)
		wantCode(t, err, fencekv.CodeTooLarge)
		_, err = c.Put(ctx, b("k"), make([]byte, 1024), none)
		ok(t, err) // exactly at the limit

		// A whole message over the limit is refused and the connection
		// closed: the rest of the message is never read.
		_, err = c.Put(ctx, b("big"), make([]byte, 10<<10), none)
		if fe := wantCode(t, err, fencekv.CodeTooLarge); !strings.Contains(fe.Message, "message") {
			t.Errorf("message-size refusal says %q", fe.Message)
		}
		if _, err := c.Ping(ctx); !errors.Is(err, wire.ErrClientClosed) {
			t.Errorf("ping after an oversized message: %v; want the connection closed", err)
		}
		c2 := dial(t, ts.Addr)
		if e, err := c2.Get(ctx, b("big")); err != nil || e.Found {
			t.Errorf("get big = %+v, %v; want not found", e, err)
		}
	})

	t.Run("bad_request", func(t *testing.T) {
		ts, _, c := errServer(t, nil)
		for _, tc := range []struct {
			name   string
			method string
			params map[string]any
		}{
			{"put without key", "put", map[string]any{"value": "v"}},
			{"put without value", "put", map[string]any{"key": "k"}},
			{"get without key", "get", nil},
			{"empty key", "get", map[string]any{"key": ""}},
			{"key is a number", "get", map[string]any{"key": 5}},
			{"key is an array", "get", map[string]any{"key": []string{"k"}}},
			{"negative token", "put", map[string]any{"key": "k", "value": "v", "token": -1}},
			{"token is a string", "put", map[string]any{"key": "k", "value": "v", "token": "34"}},
			{"token is a float", "put", map[string]any{"key": "k", "value": "v", "token": 3.5}},
			{"strict without token", "put", map[string]any{"key": "k", "value": "v", "strict": true}},
			{"strict is a number", "put", map[string]any{"key": "k", "value": "v", "token": 3, "strict": 1}},
			{"held write without token", "put", map[string]any{"key": "k", "value": "v", "lock": "L"}},
			{"cas without revision", "cas", map[string]any{"key": "k", "value": "v"}},
			{"incr without delta", "incr", map[string]any{"key": "k"}},
			{"incr delta is a string", "incr", map[string]any{"key": "k", "delta": "1"}},
			{"delta beyond int64", "incr", map[string]any{"key": "k", "delta": uint64(1 << 63)}},
			{"scan negative limit", "scan", map[string]any{"limit": -1}},
			{"scan limit over max", "scan", map[string]any{"limit": 1 << 40}},
			{"acquire without ttl", "acquire", map[string]any{"lock": "L"}},
			{"acquire without lock", "acquire", map[string]any{"ttl_ms": 1000}},
			{"ttl below min", "acquire", map[string]any{"lock": "L", "ttl_ms": 10}},
			{"ttl over max", "acquire", map[string]any{"lock": "L", "ttl_ms": 2 * 3600 * 1000}},
			{"ttl overflows a duration", "acquire", map[string]any{"lock": "L", "ttl_ms": int64(1) << 62}},
			{"negative wait", "acquire", map[string]any{"lock": "L", "ttl_ms": 1000, "wait_ms": -1}},
			{"empty lock name", "acquire", map[string]any{"lock": "", "ttl_ms": 1000}},
			{"renew without token", "renew", map[string]any{"lock": "L"}},
			{"release without lock", "release", map[string]any{"token": 1}},
			{"lock_info without lock", "lock_info", nil},
			{"locks negative limit", "locks", map[string]any{"limit": -5}},
		} {
			err := c.Call(ctx, tc.method, tc.params, nil)
			var fe *fencekv.Error
			if !errors.As(err, &fe) || fe.Code != fencekv.CodeBadRequest {
				t.Errorf("%s: %v; want bad_request", tc.name, err)
			}
		}
		// Nothing was written and no lock taken.
		st, err := ts.DB.Status(ctx)
		ok(t, err)
		if st.Revision != 0 || st.LastToken != 0 {
			t.Errorf("bad requests changed the store: %+v", st)
		}
		// The connection still works.
		if _, err := c.Ping(ctx); err != nil {
			t.Errorf("ping after bad requests: %v", err)
		}
	})

	t.Run("unknown_method", func(t *testing.T) {
		_, _, c := errServer(t, nil)
		err := c.Call(ctx, "frobnicate", map[string]any{"key": "k"}, nil)
		if fe := wantCode(t, err, fencekv.CodeUnknownMethod); !strings.Contains(fe.Message, "frobnicate") {
			t.Errorf("message %q does not name the method", fe.Message)
		}
		err = c.Call(ctx, "PING", nil, nil) // names are case-sensitive
		wantCode(t, err, fencekv.CodeUnknownMethod)
	})

	t.Run("limit_exceeded in flight", func(t *testing.T) {
		// A goroutine connection: it serves a lone write itself (the event
		// loop's limit is TestPipelineInFlightLimitRaw's).
		ts, _, c := errServer(t, func(_ *fencekv.Options, cfg *wire.Config) { cfg.MaxInFlight = 2; cfg.EventLoop = false })
		l, err := c.Acquire(ctx, "L", 10*time.Second, nil)
		ok(t, err)
		blocked := dial(t, ts.Addr)
		grants := make(chan fencekv.Lease, 2)
		for range 2 {
			go func() {
				l, err := blocked.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: time.Hour})
				if err != nil {
					t.Errorf("queued acquire: %v", err)
				}
				grants <- l
			}()
		}
		eventually(t, 10*time.Second, "two queued acquires", func() bool { return waiters(t, ts.DB, "L") == 2 })
		_, err = blocked.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: time.Hour})
		wantCode(t, err, fencekv.CodeLimitExceeded)
		// Reads, and a write with nothing behind it, take no slot.
		_, err = blocked.Ping(ctx)
		ok(t, err)
		_, err = blocked.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{})
		ok(t, err)
		// Other connections are not limited by this one.
		_, err = c.Ping(ctx)
		ok(t, err)
		// Free the slots: each grant is released in turn.
		ok(t, c.Release(ctx, "L", l.Token))
		g := <-grants
		ok(t, c.Release(ctx, "L", g.Token))
		g = <-grants
		ok(t, c.Release(ctx, "L", g.Token))
		_, err = blocked.Ping(ctx)
		ok(t, err)
	})

	t.Run("limit_exceeded connections", func(t *testing.T) {
		ts, _, c := errServer(t, func(_ *fencekv.Options, cfg *wire.Config) { cfg.MaxConns = 1 })
		_, err := c.Ping(ctx) // the server has registered the first connection
		ok(t, err)
		over := dial(t, ts.Addr)
		_, err = over.Ping(ctx)
		if !errors.Is(err, fencekv.ErrLimitExceeded) || !errors.Is(err, wire.ErrClientClosed) {
			t.Fatalf("ping over the connection limit: %v; want limit_exceeded and a closed client", err)
		}
		// The raw refusal is a notification ["error", [{code, message}]].
		raw := dialRaw(t, ts.Addr)
		m := raw.next()
		if len(m) != 3 || num(t, m[0]) != 2 || m[1] != "error" {
			t.Fatalf("refusal = %#v; want [2, \"error\", [...]]", m)
		}
		params := m[2].([]any)
		em := params[0].(map[string]any)
		if em["code"] != "limit_exceeded" || !strings.Contains(em["message"].(string), "connections") {
			t.Fatalf("refusal error = %#v", em)
		}
		raw.expectClosed()
		c.Close()
		eventually(t, 10*time.Second, "the first connection to go", func() bool { return ts.Srv.Conns() == 0 })
		c3 := dial(t, ts.Addr)
		_, err = c3.Ping(ctx)
		ok(t, err)
	})

	t.Run("unavailable on shutdown", func(t *testing.T) {
		ts, _, c := errServer(t, nil)
		_, err := c.Acquire(ctx, "L", 10*time.Second, nil)
		ok(t, err)
		waiter := dial(t, ts.Addr)
		done := make(chan error, 1)
		go func() {
			_, err := waiter.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: time.Hour})
			done <- err
		}()
		eventually(t, 10*time.Second, "the acquire to queue", func() bool { return waiters(t, ts.DB, "L") == 1 })
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ok(t, ts.Srv.Shutdown(sctx))
		wantCode(t, <-done, fencekv.CodeUnavailable)
		if n := waiters(t, ts.DB, "L"); n != 0 {
			t.Errorf("%d waiters left after shutdown", n)
		}
	})

	t.Run("internal and not_leader", func(t *testing.T) {
		db, err := fencekv.Open(t.TempDir(), nil)
		ok(t, err)
		t.Cleanup(func() { db.Close() })
		_, addr, logs := serveEngine(t, faultyEngine{db}, wire.DefaultConfig())
		logs.expectErrors()
		c := dial(t, addr)
		_, err = c.Get(ctx, b("panic"))
		if fe := wantCode(t, err, fencekv.CodeInternal); !strings.Contains(fe.Message, "get") {
			t.Errorf("internal error message %q", fe.Message)
		}
		if msgs := logs.Messages(); len(msgs) != 1 || !strings.Contains(msgs[0], "panic") {
			t.Errorf("logged %q; want the recovered panic", msgs)
		}
		// The connection survives the panic.
		_, err = c.Put(ctx, b("k"), b("v"), none)
		ok(t, err)
		_, err = c.Status(ctx)
		if fe := wantCode(t, err, fencekv.CodeNotLeader); fe.Leader != "10.0.0.2:7420" {
			t.Errorf("not_leader leader %q", fe.Leader)
		}
	})
}

// faultyEngine serves a real store, except that a get of the key "panic"
// panics and status answers not_leader: refusals the real engine cannot
// be made to give.
type faultyEngine struct{ *fencekv.DB }

func (f faultyEngine) Get(ctx context.Context, key []byte) (fencekv.Entry, error) {
	if string(key) == "panic" {
		panic("faultyEngine: get of the key panic")
	}
	return f.DB.Get(ctx, key)
}

func (f faultyEngine) Status(context.Context) (fencekv.Status, error) {
	return fencekv.Status{}, &fencekv.Error{Code: fencekv.CodeNotLeader, Message: "not the leader", Leader: "10.0.0.2:7420"}
}

// TestSequentialAtInFlightLimit is a client that waits for each answer
// before sending the next request, so it never has more than one request in
// flight: with MaxInFlight 1 it must never be refused.
func TestSequentialAtInFlightLimit(t *testing.T) {
	ts := startServer(t, func(_ *fencekv.Options, cfg *wire.Config) { cfg.MaxInFlight = 1 })
	c := dial(t, ts.Addr)
	ctx := context.Background()
	for i := range 2000 {
		if _, err := c.Get(ctx, b("k")); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

// TestShutdownAnswersInFlight checks that Shutdown answers the requests it
// has read, fails the rest with the connection, and closes the listener.
func TestShutdownAnswersInFlight(t *testing.T) {
	ts := startServer(t, nil)
	ctx := context.Background()
	c := dial(t, ts.Addr)
	const n = 50
	errs := make(chan error, n)
	for range n {
		go func() {
			_, _, err := c.Incr(ctx, b("ctr"), 1, fencekv.WriteOptions{})
			errs <- err
		}()
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ok(t, ts.Srv.Shutdown(sctx))
	answered := 0
	for range n {
		// Each call was either answered before the server stopped reading,
		// or failed with the connection; none hangs.
		if err := <-errs; err == nil {
			answered++
		} else if !errors.Is(err, wire.ErrClientClosed) {
			t.Errorf("incr during shutdown: %v", err)
		}
	}
	// Every answered incr was applied; an unanswered one may have been
	// applied too (its answer lost with the connection).
	e, err := ts.DB.Get(ctx, b("ctr"))
	ok(t, err)
	applied := 0
	if e.Found {
		applied, err = strconv.Atoi(string(e.Value))
		ok(t, err)
	}
	if applied < answered || applied > n {
		t.Errorf("counter %d after %d answered incrs of %d", applied, answered, n)
	}
	if c2, err := wire.Dial(ctx, ts.Addr); err == nil {
		c2.Close()
		t.Errorf("dial after shutdown succeeded")
	}
}

// TestAuditLog: with debug logging on, the server logs every grant,
// release and expiry, and the refusals of lock calls, with the client's
// address: an audit trail of the locks.
func TestAuditLog(t *testing.T) {
	ctx := context.Background()
	logs := fencekvtest.NewLogs(slog.LevelDebug)
	log := slog.New(logs)
	clock := fencekvtest.NewClock()
	o := fencekv.DefaultOptions()
	o.NoSync, o.Clock, o.Logger = true, clock, log
	db, err := fencekv.Open(t.TempDir(), &o)
	ok(t, err)
	t.Cleanup(func() { db.Close() })
	cfg := wire.DefaultConfig()
	cfg.Logger = log
	_, addr := fencekvtest.ServeEngine(t, db, cfg)
	c := dial(t, addr)
	l, err := c.Acquire(ctx, "audited", time.Second, &fencekv.AcquireOptions{Holder: "me"})
	ok(t, err)
	_, err = c.Acquire(ctx, "audited", time.Second, nil)
	wantCode(t, err, fencekv.CodeLockHeld)
	ok(t, c.Release(ctx, "audited", l.Token))
	wantCode(t, c.Release(ctx, "audited", l.Token), fencekv.CodeNotHolder)
	l, err = c.Acquire(ctx, "audited", time.Second, nil)
	ok(t, err)
	clock.Advance(2 * time.Second)
	eventually(t, 10*time.Second, "the expiry to be logged", func() bool {
		return slices.ContainsFunc(logs.Messages(), func(m string) bool { return strings.HasPrefix(m, "lock expiry applied lock=audited") })
	})
	wantCode(t, refused(c.Renew(ctx, "audited", l.Token)), fencekv.CodeLeaseExpired)
	var got []string
	for _, m := range logs.Messages() {
		if strings.Contains(m, "lock=audited") {
			got = append(got, m)
		}
	}
	for _, want := range []string{
		"lock granted lock=audited token=1 holder=me ttl=1s client=127.0.0.1:",
		"lock acquire refused lock=audited holder= err=lock_held",
		"lock released lock=audited token=1 client=127.0.0.1:",
		"lock release refused lock=audited token=1 err=not_holder",
		"lock granted lock=audited token=2",
		"lock expiry applied lock=audited freed=true",
		"lock renew refused lock=audited token=2 err=lease_expired",
	} {
		if !slices.ContainsFunc(got, func(m string) bool { return strings.HasPrefix(m, want) }) {
			t.Errorf("no log line starting %q in:\n%s", want, strings.Join(got, "\n"))
		}
	}
}
