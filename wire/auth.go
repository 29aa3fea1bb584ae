package wire

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
)

// Authentication and rights (PROTOCOL.md §5 auth, §6). With
// Config.Auth set, a connection is unauthenticated until it calls auth
// with a principal's name and secret, or its verified TLS client
// certificate's common name is a principal's name. Until then every
// method but ping and auth is refused unauthenticated. After it, every
// request is checked against the principal's rights as the auth file
// states them now: the principal is looked up again by name on each
// request, so a reload (SIGHUP) takes effect on a connection's next
// request, and a principal removed from the file, or whose secret
// changed, is unauthenticated again.

// Authenticator is what the server needs of an auth file (package auth
// implements it, through a small adapter in cmd/fencekv). Its methods
// are called concurrently.
type Authenticator interface {
	// Authenticate returns the principal whose name and secret these are,
	// or nil. It must take as long for an unknown name as for a wrong
	// secret.
	Authenticate(name string, secret []byte) Principal
	// Lookup returns the principal called name as of now, or nil.
	Lookup(name string) Principal
}

// Principal is what one principal may do.
type Principal interface {
	Name() string
	// Credential changes when the principal's secret does: a session
	// authenticated with the old one ends.
	Credential() string
	Admin() bool
	CanRead(key []byte) bool
	CanWrite(key []byte) bool
	CanLock(name string) bool
	// ReadPrefixes and LockPrefixes list the key and lock-name prefixes
	// the principal may read or use, sorted, none a prefix of another.
	ReadPrefixes() []string
	LockPrefixes() []string
}

// session is a connection's authentication: who it is, and its failed
// attempts.
type session struct {
	id       atomic.Pointer[identity] // nil until authenticated
	mu       sync.Mutex               // serialises auth calls, delays included
	failures int                      // failed auth calls in a row; under mu
	// certName is the common name of a verified client certificate
	// that is no principal (set before the first request is read), to
	// say so when the connection is refused unauthenticated.
	certName string
}

type identity struct {
	name       string
	credential string // the principal's Credential when it authenticated
	byCert     bool   // by its TLS client certificate: no secret to change
}

// Failed auth calls are answered after a delay that doubles with each
// failure on the connection, from authDelay up to maxAuthDelay; the
// connection's auth calls wait for each other, so pipelining them does
// not get around it.
const (
	authDelay    = 100 * time.Millisecond
	maxAuthDelay = 5 * time.Second
)

type ctxKey int

const (
	principalKey ctxKey = iota // the request's Principal, for scan and locks
	connKey                    // the request's *conn, for auth
)

// authorize refuses a request the connection may not make, and returns
// the context the method runs with (carrying the principal, or for auth
// the connection).
func (c *conn) authorize(ctx context.Context, method string, a *args) (context.Context, *fencekv.Error) {
	r := rightOf(method) // methods.go
	if r == rightSelf {
		return context.WithValue(ctx, connKey, c), nil
	}
	if c.s.cfg.Auth == nil || r == rightAny {
		return ctx, nil
	}
	p, err := c.permitted(method, a)
	if err != nil {
		return ctx, err
	}
	return context.WithValue(ctx, principalKey, p), nil
}

// permitted looks the connection's principal up again, by name, and
// checks method against its rights (with an auth file only).
func (c *conn) permitted(method string, a *args) (Principal, *fencekv.Error) {
	id := c.sess.id.Load()
	if id == nil {
		msg := "authenticate first (method auth, or a TLS client certificate)"
		if c.sess.certName != "" {
			msg += fmt.Sprintf(": the client certificate's common name %q is not a principal of the auth file", clip(c.sess.certName))
		}
		return nil, &fencekv.Error{Code: fencekv.CodeUnauthenticated, Message: msg}
	}
	p := c.s.cfg.Auth.Lookup(id.name)
	switch {
	case p == nil:
		return nil, &fencekv.Error{Code: fencekv.CodeUnauthenticated, Message: fmt.Sprintf("principal %.64q is no longer in the auth file", id.name)}
	case !id.byCert && p.Credential() != id.credential:
		return nil, &fencekv.Error{Code: fencekv.CodeUnauthenticated, Message: fmt.Sprintf("the secret of principal %.64q has changed; authenticate again", id.name)}
	}
	if err := allowed(p, method, a); err != nil {
		return nil, err
	}
	return p, nil
}

// allowed checks a request against the principal's rights. A missing
// param is left to the method (bad_request); scan and locks are clipped
// to the principal's prefixes by the methods themselves; a watch's prefix
// must lie within the principal's read (and, with locks, lock) prefixes;
// a txn needs write on every key it writes and read on every key it
// compares. A method whose entry (methods.go) states no right needs
// admin: status, members, refusals, backup, and any method added later
// until it says otherwise.
func allowed(p Principal, method string, a *args) *fencekv.Error {
	switch rightOf(method) {
	case rightReadKey:
		if a.has&fKey != 0 && !p.CanRead(a.key) {
			return denied(p, "read key", string(a.key))
		}
	case rightWriteKey:
		if a.has&fKey != 0 && !p.CanWrite(a.key) {
			return denied(p, "write key", string(a.key))
		}
		if a.has&fLock != 0 && !p.CanLock(a.lock) {
			return denied(p, "use lock", a.lock)
		}
	case rightLock:
		if a.has&fLock != 0 && !p.CanLock(a.lock) {
			return denied(p, "use lock", a.lock)
		}
	case rightTxn:
		for _, op := range a.ops {
			if !p.CanWrite(op.Key) {
				return denied(p, "write key", string(op.Key))
			}
		}
		for _, c := range a.compares {
			if !p.CanRead(c.Key) {
				return denied(p, "read key", string(c.Key))
			}
		}
		if a.has&fLock != 0 && !p.CanLock(a.lock) {
			return denied(p, "use lock", a.lock)
		}
	case rightWatch:
		// Everything under the prefix must be readable: the prefix
		// itself lies within one of the principal's read prefixes.
		if !p.CanRead(a.prefix) {
			return denied(p, "watch keys under", string(a.prefix))
		}
		if a.locks && !p.CanLock(string(a.prefix)) {
			return denied(p, "watch locks under", string(a.prefix))
		}
	case rightOwn:
		// The connection's own watch.
	case rightClipped:
	default:
		if !p.Admin() {
			return &fencekv.Error{Code: fencekv.CodePermissionDenied, Message: fmt.Sprintf("principal %.64q may not call %s (needs admin)", p.Name(), method)}
		}
	}
	return nil
}

func denied(p Principal, what, name string) *fencekv.Error {
	return &fencekv.Error{Code: fencekv.CodePermissionDenied, Message: fmt.Sprintf("principal %.64q may not %s %.64q", p.Name(), what, name)}
}

// authenticate is the auth method: {name, secret} → {principal, required}.
func authenticate(ctx context.Context, _ Engine, a *args, e *encoder) error {
	c := ctx.Value(connKey).(*conn)
	if err := need(a, fName, fSecret); err != nil {
		return err
	}
	au := c.s.cfg.Auth
	if au == nil {
		// No auth file: every connection may do everything already.
		e.EncodeMapLen(2)
		e.str("principal", "")
		e.bool("required", false)
		return nil
	}
	s := c.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	p := au.Authenticate(a.name, a.secret)
	if p == nil {
		s.failures++
		delay := min(authDelay<<min(s.failures-1, 10), maxAuthDelay)
		host := remoteHost(c.nc.RemoteAddr())
		if ok, suppressed := c.s.authLog.allow(host, time.Now()); ok {
			c.s.log.Warn("authentication failed", "remote", c.nc.RemoteAddr().String(), "name", clip(a.name),
				"failures_on_connection", s.failures, "earlier_failures_not_logged", suppressed)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-c.waits.Done(): // the connection closed, or shutdown
			t.Stop()
		}
		return &fencekv.Error{Code: fencekv.CodeUnauthenticated, Message: "wrong name or secret"}
	}
	s.failures = 0
	s.id.Store(&identity{name: p.Name(), credential: p.Credential()})
	c.s.log.Debug("authenticated", "remote", c.nc.RemoteAddr().String(), "principal", p.Name())
	e.EncodeMapLen(2)
	e.str("principal", p.Name())
	e.bool("required", true)
	return nil
}

// certPrincipal authenticates a connection as the principal its verified
// TLS client certificate names (common name), if there is one.
func (c *conn) certPrincipal(cn string) {
	if c.s.cfg.Auth == nil || cn == "" {
		return
	}
	if p := c.s.cfg.Auth.Lookup(cn); p != nil {
		c.sess.id.Store(&identity{name: p.Name(), byCert: true})
		c.s.log.Debug("authenticated by certificate", "remote", c.nc.RemoteAddr().String(), "principal", p.Name())
		return
	}
	c.sess.certName = cn
}

// clip shortens a name quoted in a log line.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func remoteHost(a net.Addr) string {
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// logLimiter lets a kind of log line through once per key (a remote
// host) per interval, and counts the ones it held back.
type logLimiter struct {
	mu    sync.Mutex
	seen  map[string]*limited
	swept time.Time
}

type limited struct {
	last       time.Time
	suppressed int
}

// logEvery is how often a remote host's refusals of one kind are logged.
const logEvery = 10 * time.Second

// allow reports whether to log for key now, and how many lines for it
// were held back since the last one logged.
func (l *logLimiter) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]*limited{}
	}
	if now.Sub(l.swept) > logEvery {
		for k, v := range l.seen {
			if now.Sub(v.last) > logEvery {
				delete(l.seen, k)
			}
		}
		l.swept = now
	}
	v := l.seen[key]
	if v == nil {
		if len(l.seen) >= 4096 {
			return false, 0 // a flood from many hosts: the ones seen are logged
		}
		l.seen[key] = &limited{last: now}
		return true, 0
	}
	if now.Sub(v.last) < logEvery {
		v.suppressed++
		return false, 0
	}
	n := v.suppressed
	v.last, v.suppressed = now, 0
	return true, n
}

// A scan or locks of a principal whose rights do not cover the whole
// prefix asked for is clipped: it lists, in order, the principal's
// prefixes that fall under the one asked for, each with a listing of its
// own, until the page is full. So a page holds only what the principal
// may read, paging (start = last + "\x00") goes on where it stopped, and
// more is exact: when the page is full, the prefixes after it are probed
// for one more item. A clipped page is one read per prefix rather than
// one snapshot. Asking for a prefix none of the principal's prefixes
// meets is permission_denied.

// maxPageBytes is the page budget of fencekv.Options.MaxScanBytes: a
// clipped page made of several listings stops there too.
var maxPageBytes = fencekv.DefaultOptions().MaxScanBytes

// defaultPage is a page's size when the request gives no limit.
const defaultPage = 1000

// lister lists one prefix from start, up to limit items.
type lister[T any] func(prefix, start []byte, limit int) ([]T, bool, error)

// clipped lists under prefix from start what the allowed prefixes cover.
// size is what an item counts against the page budget.
func clipped[T any](allowed []string, prefix, start []byte, limit int, list lister[T], size func(T) int) ([]T, bool, error) {
	var ranges [][]byte
	for _, a := range allowed {
		switch {
		case bytes.HasPrefix(prefix, []byte(a)):
			// The whole prefix asked for is allowed.
			return list(prefix, start, limit)
		case bytes.HasPrefix([]byte(a), prefix):
			ranges = append(ranges, []byte(a))
		}
	}
	if len(ranges) == 0 {
		return nil, false, &fencekv.Error{Code: fencekv.CodePermissionDenied, Message: fmt.Sprintf("no right on anything under prefix %.64q", prefix)}
	}
	if limit < 0 {
		return nil, false, badRequest("limit %d is negative", limit)
	}
	if limit == 0 {
		limit = defaultPage
	}
	var out []T
	used := 0
	for _, r := range ranges {
		if bytes.Compare(start, r) > 0 && !bytes.HasPrefix(start, r) {
			continue // every key under r sorts before start
		}
		from := r
		if bytes.Compare(start, r) > 0 {
			from = start
		}
		if len(out) == limit {
			// Full: is there anything further?
			items, _, err := list(r, from, 1)
			if err != nil {
				return nil, false, err
			}
			if len(items) > 0 {
				return out, true, nil
			}
			continue
		}
		items, more, err := list(r, from, limit-len(out))
		if err != nil {
			return nil, false, err
		}
		for _, it := range items {
			n := size(it)
			if len(out) > 0 && used+n > maxPageBytes {
				return out, true, nil
			}
			out = append(out, it)
			used += n
		}
		if more {
			return out, true, nil
		}
	}
	return out, false, nil
}

// scanPage runs a scan, clipped to the principal's read prefixes if the
// server has an auth file.
func scanPage(ctx context.Context, eng Engine, a *args) ([]fencekv.Entry, bool, error) {
	list := func(prefix, start []byte, limit int) ([]fencekv.Entry, bool, error) {
		return eng.Scan(ctx, fencekv.ScanOptions{Prefix: prefix, Start: start, Limit: limit})
	}
	limit := int(clampInt(a.limit))
	if p := principalOf(ctx); p != nil {
		return clipped(p.ReadPrefixes(), a.prefix, a.start, limit, list, func(e fencekv.Entry) int { return len(e.Key) + len(e.Value) + 17 })
	}
	return list(a.prefix, a.start, limit)
}

// locksPage runs a locks listing, clipped to the principal's lock
// prefixes if the server has an auth file.
func locksPage(ctx context.Context, eng Engine, a *args) ([]fencekv.LockInfo, bool, error) {
	list := func(prefix, start []byte, limit int) ([]fencekv.LockInfo, bool, error) {
		return eng.Locks(ctx, string(prefix), string(start), limit)
	}
	limit := int(clampInt(a.limit))
	if p := principalOf(ctx); p != nil {
		return clipped(p.LockPrefixes(), a.prefix, a.start, limit, list, func(in fencekv.LockInfo) int { return len(in.Name) + len(in.Holder) })
	}
	return list(a.prefix, a.start, limit)
}

// principalOf is the request's principal, or nil without an auth file.
func principalOf(ctx context.Context) Principal {
	p, _ := ctx.Value(principalKey).(Principal)
	return p
}
