package wire_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/auth"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wire"
)

// wireAuth adapts auth.Store to wire.Authenticator, as cmd/fencekv does.
type wireAuth struct{ s *auth.Store }

func (w wireAuth) Authenticate(name string, secret []byte) wire.Principal {
	if p := w.s.Authenticate(name, secret); p != nil {
		return p
	}
	return nil
}

func (w wireAuth) Lookup(name string) wire.Principal {
	if p := w.s.Lookup(name); p != nil {
		return p
	}
	return nil
}

// authFile writes an auth file of principals with secret "NAME-secret"
// (bcrypt's lowest cost: tests only) and the rights given, and returns its
// store.
func authFile(t *testing.T, path string, lines map[string]string) *auth.Store {
	t.Helper()
	writeAuthFile(t, path, lines)
	s, err := auth.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writeAuthFile(t *testing.T, path string, lines map[string]string) {
	t.Helper()
	var b strings.Builder
	for name, rights := range lines {
		h := "-"
		if !strings.HasPrefix(rights, "-") {
			var err error
			if h, err = auth.Hash([]byte(name+"-secret"), 4); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(&b, "%s %s %s\n", name, h, strings.TrimPrefix(rights, "-"))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

var principals = map[string]string{
	"root":   "admin read: write: lock:",
	"alice":  "write:a/ read:r/ lock:a",
	"reader": "read:a/",
	"locker": "lock:a",
	"ops":    "admin",
}

// login dials addr and authenticates as name (if not empty).
func login(t *testing.T, addr, name string) *wire.Client {
	t.Helper()
	o := &wire.DialOptions{}
	if name != "" {
		o.User, o.Secret = name, []byte(name+"-secret")
	}
	c, err := wire.DialWith(context.Background(), addr, o)
	if err != nil {
		t.Fatalf("dial as %q: %v", name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A call is one request of the table, on a client.
type call struct {
	name string
	do   func(ctx context.Context, c *wire.Client) error
}

// calls covers every method, on keys and locks inside and outside the
// principals' prefixes. Each must be refused exactly when the rights say.
func calls(held fencekv.Token) []call {
	w := fencekv.WriteOptions{}
	return []call{
		{"get a/1", func(ctx context.Context, c *wire.Client) error { return refused(c.Get(ctx, b("a/1"))) }},
		{"get r/1", func(ctx context.Context, c *wire.Client) error { return refused(c.Get(ctx, b("r/1"))) }},
		{"get b/1", func(ctx context.Context, c *wire.Client) error { return refused(c.Get(ctx, b("b/1"))) }},
		{"put a/1", func(ctx context.Context, c *wire.Client) error { return refused(c.Put(ctx, b("a/1"), b("v"), w)) }},
		{"put r/1", func(ctx context.Context, c *wire.Client) error { return refused(c.Put(ctx, b("r/1"), b("v"), w)) }},
		{"put b/1", func(ctx context.Context, c *wire.Client) error { return refused(c.Put(ctx, b("b/1"), b("v"), w)) }},
		{"put a/1 held by lock a", func(ctx context.Context, c *wire.Client) error {
			return refused(c.Put(ctx, b("a/1"), b("v"), fencekv.WriteOptions{Token: held, Lock: "a"}))
		}},
		{"put a/1 held by lock b", func(ctx context.Context, c *wire.Client) error {
			return refused(c.Put(ctx, b("a/1"), b("v"), fencekv.WriteOptions{Token: held, Lock: "b"}))
		}},
		{"delete a/2", func(ctx context.Context, c *wire.Client) error { return refused2(c.Delete(ctx, b("a/2"), w)) }},
		{"delete b/2", func(ctx context.Context, c *wire.Client) error { return refused2(c.Delete(ctx, b("b/2"), w)) }},
		{"cas a/3", func(ctx context.Context, c *wire.Client) error { return refused(c.CAS(ctx, b("a/3"), 0, b("v"), w)) }},
		{"cas b/3", func(ctx context.Context, c *wire.Client) error { return refused(c.CAS(ctx, b("b/3"), 0, b("v"), w)) }},
		{"incr a/n", func(ctx context.Context, c *wire.Client) error { return refused2(c.Incr(ctx, b("a/n"), 1, w)) }},
		{"incr b/n", func(ctx context.Context, c *wire.Client) error { return refused2(c.Incr(ctx, b("b/n"), 1, w)) }},
		{"scan a/", func(ctx context.Context, c *wire.Client) error {
			return refused2(c.Scan(ctx, fencekv.ScanOptions{Prefix: b("a/")}))
		}},
		{"scan b/", func(ctx context.Context, c *wire.Client) error {
			return refused2(c.Scan(ctx, fencekv.ScanOptions{Prefix: b("b/")}))
		}},
		{"acquire a-x", func(ctx context.Context, c *wire.Client) error {
			l, err := c.Acquire(ctx, "a-x", time.Second, nil)
			if err == nil {
				err = c.Release(ctx, "a-x", l.Token)
			}
			return err
		}},
		{"acquire b-x", func(ctx context.Context, c *wire.Client) error {
			return refused(c.Acquire(ctx, "b-x", time.Second, nil))
		}},
		{"renew a", func(ctx context.Context, c *wire.Client) error { return refused(c.Renew(ctx, "a", held)) }},
		{"renew b", func(ctx context.Context, c *wire.Client) error { return refused(c.Renew(ctx, "b", held)) }},
		{"release b", func(ctx context.Context, c *wire.Client) error { return c.Release(ctx, "b", 99) }},
		{"lock_info a", func(ctx context.Context, c *wire.Client) error { return refused(c.LockInfo(ctx, "a")) }},
		{"lock_info b", func(ctx context.Context, c *wire.Client) error { return refused(c.LockInfo(ctx, "b")) }},
		{"locks a", func(ctx context.Context, c *wire.Client) error { return refused2(c.Locks(ctx, "a", "", 0)) }},
		{"locks b", func(ctx context.Context, c *wire.Client) error { return refused2(c.Locks(ctx, "b", "", 0)) }},
		{"status", func(ctx context.Context, c *wire.Client) error { return refused(c.Status(ctx)) }},
		{"members", func(ctx context.Context, c *wire.Client) error { return refused(c.Members(ctx)) }},
		{"ping", func(ctx context.Context, c *wire.Client) error { return refused(c.Ping(ctx)) }},
		{"txn a/", func(ctx context.Context, c *wire.Client) error {
			_, _, err := c.Txn(ctx, []fencekv.Compare{{Key: b("a/1"), Revision: 999}}, []fencekv.TxnOp{{Op: state.OpPut, Key: b("a/t"), Value: b("v")}}, w)
			if errors.Is(err, fencekv.ErrCompareFailed) {
				return nil // past the rights; the compare keeps it from writing
			}
			return err
		}},
		{"txn b/", func(ctx context.Context, c *wire.Client) error {
			_, _, err := c.Txn(ctx, nil, []fencekv.TxnOp{{Op: state.OpPut, Key: b("a/t"), Value: b("v")}, {Op: state.OpPut, Key: b("b/t"), Value: b("v")}}, w)
			return err
		}},
		{"refusals", func(ctx context.Context, c *wire.Client) error {
			_, _, err := c.Refusals(ctx, 0, 0)
			return err
		}},
	}
}

// denied lists, per principal, the calls refused permission_denied; every
// other call must get past the rights (to its answer or another refusal).
var deniedCalls = map[string][]string{
	"root": nil,
	"alice": {"get b/1", "put r/1", "put b/1", "put a/1 held by lock b", "delete b/2", "cas b/3", "incr b/n",
		"scan b/", "acquire b-x", "renew b", "release b", "lock_info b", "locks b", "status", "members", "txn b/", "refusals"},
	"reader": {"get r/1", "get b/1", "put a/1", "put r/1", "put b/1", "put a/1 held by lock a", "put a/1 held by lock b",
		"delete a/2", "delete b/2", "cas a/3", "cas b/3", "incr a/n", "incr b/n", "scan b/", "acquire a-x", "acquire b-x",
		"renew a", "renew b", "release b", "lock_info a", "lock_info b", "locks a", "locks b", "status", "members",
		"txn a/", "txn b/", "refusals"},
	"locker": {"get a/1", "get r/1", "get b/1", "put a/1", "put r/1", "put b/1", "put a/1 held by lock a",
		"put a/1 held by lock b", "delete a/2", "delete b/2", "cas a/3", "cas b/3", "incr a/n", "incr b/n", "scan a/",
		"scan b/", "acquire b-x", "renew b", "release b", "lock_info b", "locks b", "status", "members",
		"txn a/", "txn b/", "refusals"},
	"ops": {"get a/1", "get r/1", "get b/1", "put a/1", "put r/1", "put b/1", "put a/1 held by lock a",
		"put a/1 held by lock b", "delete a/2", "delete b/2", "cas a/3", "cas b/3", "incr a/n", "incr b/n", "scan a/",
		"scan b/", "acquire a-x", "acquire b-x", "renew a", "renew b", "release b", "lock_info a", "lock_info b",
		"locks a", "locks b", "txn a/", "txn b/"},
}

func authServer(t *testing.T, tlsCfg *tls.Config) (*secureServer, string, *auth.Store) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth")
	store := authFile(t, path, principals)
	return startSecure(t, secureConfig(tlsCfg, wireAuth{store})), path, store
}

// TestAuthRights: every method, for every principal, is refused
// permission_denied exactly when its rights do not cover it; and before
// auth, every method but ping is refused unauthenticated.
func TestAuthRights(t *testing.T) {
	ts, _, _ := authServer(t, nil)
	ctx := context.Background()
	root := login(t, ts.Addr, "root")
	held, err := root.Acquire(ctx, "a", time.Minute, nil)
	ok(t, err)
	_, err = root.Acquire(ctx, "b", time.Minute, nil)
	ok(t, err)

	t.Run("unauthenticated", func(t *testing.T) {
		c := login(t, ts.Addr, "")
		for _, cl := range calls(held.Token) {
			err := cl.do(ctx, c)
			if cl.name == "ping" {
				ok(t, err)
				continue
			}
			if !errors.Is(err, fencekv.ErrUnauthenticated) {
				t.Errorf("%s before auth: %v, want unauthenticated", cl.name, err)
			}
		}
	})
	// root, who may do everything, goes last: until then, the keys outside
	// every other principal's rights must stay unwritten.
	for _, name := range []string{"alice", "reader", "locker", "ops", "root"} {
		if name == "root" {
			for _, k := range []string{"b/1", "r/1", "b/2", "b/3", "b/n"} {
				e, err := ts.DB.Get(ctx, b(k))
				ok(t, err)
				if e.Found || e.Fence != 0 || e.Revision != 0 {
					t.Errorf("key %s was written by a principal without the right", k)
				}
			}
		}
		t.Run(name, func(t *testing.T) {
			c := login(t, ts.Addr, name)
			for _, cl := range calls(held.Token) {
				err := cl.do(ctx, c)
				want := slices.Contains(deniedCalls[name], cl.name)
				got := errors.Is(err, fencekv.ErrPermissionDenied)
				switch {
				case want && !got:
					t.Errorf("%s by %s: %v, want permission_denied", cl.name, name, err)
				case !want && got:
					t.Errorf("%s by %s: refused %v", cl.name, name, err)
				case errors.Is(err, fencekv.ErrUnauthenticated):
					t.Errorf("%s by %s: %v", cl.name, name, err)
				}
			}
		})
	}
}

// TestAuthWrongSecrets: a wrong secret and an unknown name get the same
// answer, are logged once per burst, and slow the connection down, more
// with each failure; the connection stays unauthenticated until a right
// one.
func TestAuthWrongSecrets(t *testing.T) {
	ts, _, _ := authServer(t, nil)
	ctx := context.Background()
	c := login(t, ts.Addr, "")
	var msgs []string
	var took []time.Duration
	for _, try := range []struct{ name, secret string }{
		{"alice", "wrong"}, {"nobody", "alice-secret"}, {"alice", ""}, {"", "x"},
	} {
		start := time.Now()
		_, err := c.Auth(ctx, try.name, []byte(try.secret))
		took = append(took, time.Since(start))
		fe := wantCode(t, err, fencekv.CodeUnauthenticated)
		msgs = append(msgs, fe.Message)
		if _, err := c.Get(ctx, b("a/1")); !errors.Is(err, fencekv.ErrUnauthenticated) {
			t.Errorf("after a failed auth: get %v, want unauthenticated", err)
		}
	}
	for i, m := range msgs {
		if m != msgs[0] {
			t.Errorf("answer %d %q differs from %q: it tells names apart", i, m, msgs[0])
		}
	}
	// The delays: 100, 200, 400, 800 ms.
	for i, d := range took {
		if want := 100 * time.Millisecond << i; d < want {
			t.Errorf("failure %d answered after %v, want at least %v", i+1, d, want)
		}
	}
	if n := len(ts.Logs.matching("authentication failed")); n != 1 {
		t.Errorf("%d log lines for 4 failures within a burst, want 1:\n%s", n, ts.Logs)
	}
	if l := ts.Logs.matching("authentication failed", `name=alice`); len(l) != 1 {
		t.Errorf("the log line does not name the principal tried:\n%s", ts.Logs)
	}
	if p, err := c.Auth(ctx, "alice", []byte("alice-secret")); err != nil || p != "alice" {
		t.Fatalf("auth with the right secret: %q, %v", p, err)
	}
	_, err := c.Put(ctx, b("a/1"), b("v"), fencekv.WriteOptions{})
	ok(t, err)
	// The Go client's DialWith fails on wrong credentials.
	_, err = wire.DialWith(ctx, ts.Addr, &wire.DialOptions{User: "alice", Secret: []byte("nope")})
	wantCode(t, err, fencekv.CodeUnauthenticated)
}

// TestScanAndLocksClipped: a scan or locks listing never returns keys or
// lock names outside the principal's prefixes, pages on where it stopped,
// and says more exactly.
func TestScanAndLocksClipped(t *testing.T) {
	ts, _, _ := authServer(t, nil)
	ctx := context.Background()
	root := login(t, ts.Addr, "root")
	for _, k := range []string{"a", "a/1", "a/2", "a/3", "a/4", "a/5", "b/1", "q", "r/1", "r/2", "r/3", "z"} {
		_, err := root.Put(ctx, b(k), b("v"), fencekv.WriteOptions{})
		ok(t, err)
	}
	alice := login(t, ts.Addr, "alice") // write:a/ read:r/ lock:a
	keys := func(items []fencekv.Entry) []string {
		var out []string
		for _, it := range items {
			out = append(out, string(it.Key))
		}
		return out
	}
	page := func(o fencekv.ScanOptions) ([]string, bool) {
		t.Helper()
		items, more, err := alice.Scan(ctx, o)
		ok(t, err)
		return keys(items), more
	}
	// All keys, three at a time.
	var all []string
	var start []byte
	var pages int
	for {
		got, more := page(fencekv.ScanOptions{Start: start, Limit: 3})
		pages++
		all = append(all, got...)
		if !more {
			break
		}
		start = append([]byte(got[len(got)-1]), 0)
		if pages > 10 {
			t.Fatal("paging does not end")
		}
	}
	want := []string{"a/1", "a/2", "a/3", "a/4", "a/5", "r/1", "r/2", "r/3"}
	if !slices.Equal(all, want) || pages != 3 {
		t.Errorf("paged scan: %q in %d pages, want %q in 3", all, pages, want)
	}
	for _, c := range []struct {
		o        fencekv.ScanOptions
		want     []string
		wantMore bool
	}{
		{fencekv.ScanOptions{Limit: 5}, want[:5], true}, // full at the end of a/: r/ is probed
		{fencekv.ScanOptions{Limit: 8}, want, false},    // full at the very end
		{fencekv.ScanOptions{}, want, false},
		{fencekv.ScanOptions{Start: b("q")}, want[5:], false},
		{fencekv.ScanOptions{Start: b("a/4")}, want[3:], false},
		{fencekv.ScanOptions{Prefix: b("a/3")}, want[2:3], false}, // inside a right: a plain scan
		{fencekv.ScanOptions{Prefix: b("r/"), Limit: 2}, want[5:7], true},
	} {
		got, more := page(c.o)
		if !slices.Equal(got, c.want) || more != c.wantMore {
			t.Errorf("scan %+v = %q more=%v, want %q more=%v", c.o, got, more, c.want, c.wantMore)
		}
	}
	_, _, err := alice.Scan(ctx, fencekv.ScanOptions{Prefix: b("z")})
	wantCode(t, err, fencekv.CodePermissionDenied)
	_, _, err = alice.Scan(ctx, fencekv.ScanOptions{Limit: -1})
	wantCode(t, err, fencekv.CodeBadRequest)

	// Locks: root holds a1, a2, b1, c; alice (lock:a) sees a1 and a2 only.
	for _, l := range []string{"a1", "a2", "b1", "c"} {
		_, err := root.Acquire(ctx, l, time.Minute, nil)
		ok(t, err)
	}
	ls, more, err := alice.Locks(ctx, "", "", 1)
	ok(t, err)
	if len(ls) != 1 || ls[0].Name != "a1" || !more {
		t.Errorf("locks limit 1: %v more=%v, want a1 and more", ls, more)
	}
	ls, more, err = alice.Locks(ctx, "", "a1\x00", 0)
	ok(t, err)
	if len(ls) != 1 || ls[0].Name != "a2" || more {
		t.Errorf("locks page 2: %v more=%v, want a2 and no more", ls, more)
	}
	_, _, err = alice.Locks(ctx, "b", "", 0)
	wantCode(t, err, fencekv.CodePermissionDenied)
}

// TestAuthReload: a reload takes effect on a connection's next request
// without closing it: a right removed is refused, a principal removed or
// whose secret changed is unauthenticated.
func TestAuthReload(t *testing.T) {
	ts, path, store := authServer(t, nil)
	ctx := context.Background()
	alice, reader, locker := login(t, ts.Addr, "alice"), login(t, ts.Addr, "reader"), login(t, ts.Addr, "locker")
	_, err := alice.Put(ctx, b("a/1"), b("v"), fencekv.WriteOptions{})
	ok(t, err)

	// alice keeps her line's hash but loses write:a/; locker's line goes;
	// reader's hash is made again (a new salt: a changed secret).
	f, err := os.ReadFile(path)
	ok(t, err)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(f)), "\n") {
		fs := strings.Fields(l)
		switch fs[0] {
		case "alice":
			l = fs[0] + " " + fs[1] + " read:a/"
		case "locker":
			continue
		case "reader":
			h, err := auth.Hash([]byte("reader-secret"), 4)
			ok(t, err)
			l = fs[0] + " " + h + " read:a/"
		}
		lines = append(lines, l)
	}
	ok(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	_, err = store.Reload()
	ok(t, err)

	_, err = alice.Get(ctx, b("a/1"))
	ok(t, err)
	_, err = alice.Put(ctx, b("a/1"), b("w"), fencekv.WriteOptions{})
	wantCode(t, err, fencekv.CodePermissionDenied)
	_, err = locker.LockInfo(ctx, "a")
	wantCode(t, err, fencekv.CodeUnauthenticated)
	_, err = reader.Get(ctx, b("a/1"))
	wantCode(t, err, fencekv.CodeUnauthenticated)
	// The same connection, authenticated again with the secret of the new
	// hash.
	_, err = reader.Auth(ctx, "reader", []byte("reader-secret"))
	ok(t, err)
	_, err = reader.Get(ctx, b("a/1"))
	ok(t, err)
}

// TestCertificatePrincipal: under mutual TLS, a client certificate whose
// common name is a principal authenticates the connection as it; another
// common name leaves it unauthenticated until auth.
func TestCertificatePrincipal(t *testing.T) {
	ca := fencekvtest.NewCA(t, "test CA")
	srv := tlsServerConfig(ca.Issue(t, "server", nil), ca)
	ts, _, _ := authServer(t, srv)
	ctx := context.Background()
	dialAs := func(cn string) *wire.Client {
		c, err := wire.DialWith(ctx, ts.Addr, &wire.DialOptions{TLS: tlsClient(ca, ca.Issue(t, cn, nil))})
		ok(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	alice := dialAs("alice")
	_, err := alice.Put(ctx, b("a/1"), b("v"), fencekv.WriteOptions{})
	ok(t, err)
	_, err = alice.Put(ctx, b("b/1"), b("v"), fencekv.WriteOptions{})
	wantCode(t, err, fencekv.CodePermissionDenied)
	stranger := dialAs("stranger")
	_, err = stranger.Get(ctx, b("a/1"))
	if fe := wantCode(t, err, fencekv.CodeUnauthenticated); !strings.Contains(fe.Message, `common name "stranger" is not a principal`) {
		t.Errorf("refusal of a certificate that names no principal: %q; want it to say so", fe.Message)
	}
	_, err = stranger.Auth(ctx, "reader", []byte("reader-secret"))
	ok(t, err)
	_, err = stranger.Get(ctx, b("a/1"))
	ok(t, err)
}

// TestAuthWithoutAuthFile: a server without an auth file answers auth
// (required: false) and serves everything, as before.
func TestAuthWithoutAuthFile(t *testing.T) {
	ts := startServer(t, nil)
	c, err := wire.DialWith(context.Background(), ts.Addr, &wire.DialOptions{User: "anyone", Secret: []byte("x")})
	ok(t, err)
	defer c.Close()
	_, err = c.Status(context.Background())
	ok(t, err)
}

// TestWatchRights: a watch's prefix must lie within the principal's read
// prefixes (and, with locks, its lock prefixes); before auth it is refused.
func TestWatchRights(t *testing.T) {
	ts, _, _ := authServer(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		user, prefix string
		locks        bool
		want         error
	}{
		{"reader", "a/", false, nil},
		{"reader", "a/x", false, nil},
		{"reader", "", false, fencekv.ErrPermissionDenied},
		{"reader", "b/", false, fencekv.ErrPermissionDenied},
		{"reader", "a/", true, fencekv.ErrPermissionDenied},
		{"root", "", true, nil},
		{"", "a/", false, fencekv.ErrUnauthenticated},
	} {
		d := &wire.DialOptions{}
		if tc.user != "" {
			d.User, d.Secret = tc.user, []byte(tc.user+"-secret")
		}
		w, err := wire.WatchWith(ctx, []string{ts.Addr}, fencekv.WatchOptions{Prefix: b(tc.prefix), Locks: tc.locks}, d)
		if err == nil {
			w.Close()
		}
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("watch %q (locks %v) as %q: %v; want %v", tc.prefix, tc.locks, tc.user, err, tc.want)
		}
	}
}

// TestAuthReloadCancelsWatches: a watch stops with its principal's rights.
// Once a reload removes the principal, the watch it opened delivers no
// event after that; the server cancels it, and the client's watcher, which
// cannot authenticate to resume, ends with the refusal.
func TestAuthReloadCancelsWatches(t *testing.T) {
	ts, path, store := authServer(t, nil)
	ctx := context.Background()
	root := login(t, ts.Addr, "root")
	w, err := wire.WatchWith(ctx, []string{ts.Addr}, fencekv.WatchOptions{Prefix: b("a/")},
		&wire.DialOptions{User: "reader", Secret: []byte("reader-secret")})
	ok(t, err)
	defer w.Close()
	_, err = root.Put(ctx, b("a/1"), b("before"), fencekv.WriteOptions{})
	ok(t, err)
	select {
	case es := <-w.Events():
		if len(es) != 1 || string(es[0].Value) != "before" {
			t.Fatalf("events = %+v; want the put of a/1", es)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}

	f, err := os.ReadFile(path)
	ok(t, err)
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(string(f)), "\n") {
		if !strings.HasPrefix(l, "reader ") {
			keep = append(keep, l)
		}
	}
	ok(t, os.WriteFile(path, []byte(strings.Join(keep, "\n")+"\n"), 0o600))
	_, err = store.Reload()
	ok(t, err)
	_, err = root.Put(ctx, b("a/1"), b("after the reload"), fencekv.WriteOptions{})
	ok(t, err)
	timeout := time.After(10 * time.Second)
	for {
		select {
		case es, open := <-w.Events():
			if !open {
				wantCode(t, w.Err(), fencekv.CodeUnauthenticated)
				return
			}
			t.Fatalf("a removed principal's watch delivered %+v", es)
		case <-timeout:
			t.Fatal("the removed principal's watch neither ended nor delivered within 10s")
		}
	}
}
