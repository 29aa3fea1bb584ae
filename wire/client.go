package wire

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrClientClosed is returned by calls on a closed Client and by calls in
// flight when it is closed. Calls that fail with the connection match it
// too (errors.Is), through a *ConnError: calls in flight when the
// connection broke, and calls made while the client cannot reconnect.
var ErrClientClosed = errors.New("wire: client connection closed")

// ConnError is the error of a call that failed with the client's
// connection rather than being answered: the connection broke while the
// call was in flight (the server closed or reset it, or it failed to
// write), or the client had no connection and could not make one. It
// matches ErrClientClosed and its cause with errors.Is; the cause is the
// server's refusal (a *fencekv.Error such as limit_exceeded) when the
// server said why it closed the connection.
//
// A later call on the same Client dials again (see DialCluster).
type ConnError struct {
	// Addr is the server address the connection was to (or, for a
	// failed dial, the addresses tried).
	Addr string
	// Outcome is fencekv.OutcomeUnknown when the request was sent and
	// changes state (a write or a lock method): it may or may not have
	// been applied; fencekv.Error's Outcome means the same. Empty when
	// nothing was sent, or the request only reads.
	Outcome string
	// Err is the cause.
	Err error
}

func (e *ConnError) Error() string {
	s := "wire: connection to " + e.Addr + " failed"
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	if e.Outcome == fencekv.OutcomeUnknown {
		s += " (the request was sent: it may or may not have been applied)"
	}
	return s
}

// Unwrap returns ErrClientClosed and the cause.
func (e *ConnError) Unwrap() []error { return []error{ErrClientClosed, e.Err} }

// Client speaks the protocol to a server, or to any node of a cluster. It
// is safe for concurrent use: calls from many goroutines are pipelined on
// one connection and matched to their responses by msgid. A lone caller
// reads its own response from the socket: there is no reader goroutine,
// and no goroutine switch between the answer and its caller.
//
// When the connection breaks, the calls in flight on it fail with a
// *ConnError (a write's outcome is then unknown), and the next call dials
// again, trying the client's addresses in turn, starting after the one
// that failed; while none answers, calls fail at once with a *ConnError
// (nothing sent), and dialing is retried with backoff (see DialOptions).
// Before a call goes out on a connection that has been idle, the client
// checks, without blocking, that the server has not closed it meanwhile
// (a restarted server has), so a call after a restart is sent on a new
// connection instead of failing. Leases are not tied to connections: a
// lock stays held across a reconnect, and its holder renews it on the new
// connection (see WithLock).
//
// Refusals come back as *fencekv.Error with the server's code and facts, so
// errors.Is(err, fencekv.ErrStaleToken) works as with an embedded DB.
type Client struct {
	addrs []string
	opts  DialOptions
	cur   atomic.Pointer[link] // the connection calls go to (never nil)

	dmu      sync.Mutex    // guards the fields below, and orders the swap of cur against Close
	closed   bool          // Close has begun
	dialing  chan struct{} // closed when the dial round under way ends; nil if none is
	backoff  time.Duration // the wait after the last failed dial round
	nextDial time.Time     // no dial round before then
	dialErr  error         // why the last round failed
	forward  bool          // Forwarding was called: every new connection says so

	stopDial context.Context // cancelled by Close: ends a dial round under way
	cancel   context.CancelFunc

	// The client's own goroutines (see spawn), which Close waits for.
	bgmu     sync.Mutex     // guards stopping, and orders bg.Go before bg.Wait
	stopping bool           // Close has begun: start no more
	closing  chan struct{}  // closed when Close begins
	bg       sync.WaitGroup // the goroutines spawn started, and the watches' (see link.watch)
	running  atomic.Int32   // how many of them are running (for tests)
	ending   func()         // tests: run by each goroutine of spawn as it ends
}

// DialOptions tune how a Client connects and reconnects. The zero value
// (or nil) means the defaults.
type DialOptions struct {
	// TLS, if set, makes each connection TLS, verified with it (RootCAs,
	// ServerName, and Certificates for mutual TLS). Versions below TLS
	// 1.2 are never used. An empty ServerName is the address's host.
	TLS *tls.Config
	// User and Secret, if User is set, authenticate each connection right
	// after it is made, reconnections included (method auth); a refusal
	// fails the dial.
	User   string
	Secret []byte
	// DialTimeout bounds each attempt to connect to one address, and,
	// with several addresses, then its answer to a ping (a stopped node's
	// kernel still accepts connections); 0 means 2s. The caller's context
	// bounds it too.
	DialTimeout time.Duration
	// MinBackoff and MaxBackoff bound the pause after a round of dials
	// in which no address answered, during which calls fail at once:
	// it starts at MinBackoff and doubles, up to MaxBackoff, until a dial
	// succeeds. 0 means 50ms and 1s.
	MinBackoff, MaxBackoff time.Duration
}

func (o *DialOptions) withDefaults() DialOptions {
	var d DialOptions
	if o != nil {
		d = *o
	}
	if d.DialTimeout <= 0 {
		d.DialTimeout = 2 * time.Second
	}
	if d.MinBackoff <= 0 {
		d.MinBackoff = 50 * time.Millisecond
	}
	if d.MaxBackoff <= 0 {
		d.MaxBackoff = time.Second
	}
	d.MaxBackoff = max(d.MaxBackoff, d.MinBackoff)
	return d
}

// Dial connects to a fencekv server at addr (host:port). The client
// reconnects to addr when its connection breaks (see Client).
func Dial(ctx context.Context, addr string) (*Client, error) {
	return DialCluster(ctx, []string{addr}, nil)
}

// DialCluster connects to the first of addrs (host:port each: a server,
// or the nodes of a cluster, any of which serves every request) that
// answers, trying them in order. When the connection breaks, the client
// reconnects to the next address that answers (see Client). o may be nil.
func DialCluster(ctx context.Context, addrs []string, o *DialOptions) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("wire: no server address given")
	}
	c := &Client{
		addrs:   append([]string(nil), addrs...),
		opts:    o.withDefaults(),
		closing: make(chan struct{}),
	}
	c.stopDial, c.cancel = context.WithCancel(context.Background())
	cn, err := c.dialRound(ctx, 0)
	if err != nil {
		c.cancel()
		return nil, err
	}
	c.cur.Store(cn)
	return c, nil
}

// dialRound tries each address once, from addrs[first] on, and returns a
// connection to the first that answers.
func (c *Client) dialRound(ctx context.Context, first int) (*link, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.stopDial, cancel)
	defer stop()
	c.dmu.Lock()
	user, secret := c.opts.User, c.opts.Secret // Auth may change them
	forward := c.forward
	c.dmu.Unlock()
	var errs []error
	for i := range c.addrs {
		addr := c.addrs[(first+i)%len(c.addrs)]
		nc, raw, err := c.dialOne(ctx, addr)
		if err == nil {
			cn := newLink(c, nc, raw, addr)
			err = c.greet(ctx, cn)
			if err == nil && user != "" {
				if err = cn.auth(ctx, user, secret); refusedCredentials(err) {
					// The server answered: refused credentials are
					// not a dead node, and every node would say the
					// same.
					cn.shut(err)
					return nil, fmt.Errorf("wire: %s: authenticate as %q: %w", addr, user, err)
				}
			}
			if err == nil && forward {
				err = cn.forwarding(ctx)
			}
			if err == nil {
				return cn, nil
			}
			cn.shut(err)
		}
		errs = append(errs, fmt.Errorf("wire: dial %s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// greet pings a new connection, within the dial timeout, when there are
// other addresses to go to. The kernel accepts a connection for a node
// that is stopped (SIGSTOP) or hung, and without an answer to wait for,
// the client would settle on it and every call would wait there until its
// deadline: such a node is left for the next address, as one that refuses
// connections is. (Authentication comes after, under the caller's
// context: with bcrypt, a burst of clients may wait for it longer.)
func (c *Client) greet(ctx context.Context, cn *link) error {
	if len(c.addrs) < 2 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	p := &call{done: make(chan error, 1)}
	id, err := cn.start("ping", nil, p)
	if err != nil {
		return err
	}
	return cn.wait(ctx, id, p, false)
}

// refusedCredentials reports whether err is the server's answer to auth
// refusing the credentials (not a connection that broke or was closed
// with a refusal such as limit_exceeded: another node may take it).
func refusedCredentials(err error) bool {
	var ce *ConnError
	var fe *fencekv.Error
	return !errors.As(err, &ce) && errors.As(err, &fe)
}

// dialOne connects to addr, within the dial timeout, with TLS if the
// options ask for it. raw is the TCP connection under it.
func (c *Client) dialOne(ctx context.Context, addr string) (nc, raw net.Conn, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	if c.opts.TLS == nil {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", addr)
		return nc, nc, err
	}
	cfg := c.opts.TLS.Clone()
	cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, nil, err
		}
		cfg.ServerName = host
	}
	var d net.Dialer
	if raw, err = d.DialContext(ctx, "tcp", addr); err != nil {
		return nil, nil, err
	}
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, nil, handshakeRefusal(err)
	}
	return tc, raw, nil
}

// conn returns the connection to send a call on, dialing a new one if the
// current one is broken.
func (c *Client) conn(ctx context.Context) (*link, error) {
	if cn := c.cur.Load(); cn.usable() {
		return cn, nil
	}
	return c.reconnect(ctx)
}

// reconnect replaces the broken connection with a new one, or fails at
// once if the last round of dials failed less than its backoff ago. One
// caller dials at a time; the others wait for its round (or their
// context).
func (c *Client) reconnect(ctx context.Context) (*link, error) {
	for {
		c.dmu.Lock()
		if c.closed {
			c.dmu.Unlock()
			return nil, ErrClientClosed
		}
		old := c.cur.Load()
		if !old.dead.Load() {
			c.dmu.Unlock()
			return old, nil // replaced meanwhile
		}
		if ch := c.dialing; ch != nil {
			c.dmu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if wait := time.Until(c.nextDial); wait > 0 {
			err := &ConnError{Addr: joinAddrs(c.addrs), Err: fmt.Errorf("%w (next attempt in %v)", c.dialErr, wait.Round(time.Millisecond))}
			c.dmu.Unlock()
			return nil, err
		}
		done := make(chan struct{})
		c.dialing = done
		first := 0
		for i, a := range c.addrs {
			if a == old.addr {
				first = i + 1 // the next address first: the failed one last
			}
		}
		c.dmu.Unlock()
		old.shut(old.failureCause())
		cn, err := c.dialRound(ctx, first)
		c.dmu.Lock()
		c.dialing = nil
		close(done)
		switch {
		case err == nil && c.closed:
			c.dmu.Unlock()
			cn.shut(errClosed)
			return nil, ErrClientClosed
		case err == nil:
			c.backoff, c.nextDial, c.dialErr = 0, time.Time{}, nil
			c.cur.Store(cn)
			c.dmu.Unlock()
			return cn, nil
		case ctx.Err() != nil || c.closed:
			// The round was cut short: it says nothing of the servers.
			c.dmu.Unlock()
			if c.closed {
				return nil, ErrClientClosed
			}
			return nil, ctx.Err()
		}
		c.backoff = min(max(2*c.backoff, c.opts.MinBackoff), c.opts.MaxBackoff)
		// ±20% so that the clients of a restarted server come back spread.
		c.nextDial = time.Now().Add(time.Duration(float64(c.backoff) * (0.8 + 0.4*rand.Float64())))
		c.dialErr = err
		c.dmu.Unlock()
		return nil, &ConnError{Addr: joinAddrs(c.addrs), Err: err}
	}
}

func joinAddrs(addrs []string) string {
	s := addrs[0]
	for _, a := range addrs[1:] {
		s += "," + a
	}
	return s
}

// failureCause is why the connection failed.
func (cn *link) failureCause() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.err == nil {
		return cn.werr // a write failed, and its answers are being read (drain)
	}
	return cn.err
}

// Addr is the address of the server the client is (or was last)
// connected to.
func (c *Client) Addr() string { return c.cur.Load().addr }

// Close closes the connection; calls in flight fail with ErrClientClosed,
// and so does every later call. It returns once the goroutines the client
// started have ended: the release of a grant that came after its caller
// gave up (see Acquire), and the renewing behind WithLock, whose
// callback's context is cancelled with ErrLeaseLost. Close is idempotent:
// it is safe to call more than once, and from several goroutines; every
// call returns after that wait, and calls after the first return nil.
func (c *Client) Close() error {
	c.dmu.Lock()
	first := !c.closed
	c.closed = true
	cn := c.cur.Load()
	c.dmu.Unlock()
	c.cancel() // a dial round under way ends, and its connection is shut
	c.bgmu.Lock()
	if !c.stopping {
		c.stopping = true
		close(c.closing)
	}
	c.bgmu.Unlock()
	err := cn.shut(errClosed)
	// Every call fails now, and fast: the goroutines end soon.
	c.bg.Wait()
	if !first || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// spawn runs f in a goroutine that Close waits for, and reports whether it
// did: once Close has begun it starts nothing. Every goroutine the client
// starts goes through here, so none outlives Close; f must therefore end
// soon after the client is closed (its calls fail then), and must not call
// Close itself.
func (c *Client) spawn(f func()) bool {
	c.bgmu.Lock()
	defer c.bgmu.Unlock()
	if c.stopping {
		return false
	}
	c.running.Add(1)
	c.bg.Go(func() {
		defer c.running.Add(-1)
		f()
		if c.ending != nil {
			c.ending()
		}
	})
	return true
}

// Forwarding tells the server that this client carries requests a
// cluster node forwards for its own clients (for nodes' forwarders; a
// client has no use for it). The server never forwards such a request
// again: a node that does not lead answers it not_leader, and the node
// that sent it looks for the leader itself, so a request makes one hop,
// and one that waited unread in a node that was stopped or cut off is not
// passed on to the leader when that node resumes. Every connection the
// client makes from now on says so too.
func (c *Client) Forwarding(ctx context.Context) error {
	c.dmu.Lock()
	c.forward = true
	c.dmu.Unlock()
	cn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	return cn.forwarding(ctx)
}

// forwarding marks the connection as a forwarder's: method forwarding,
// sent as a notification. There is no answer to wait for (a node must not
// wait on a leader that may be stopped): the server marks the connection
// as it reads the message, before it reads the next one, so every request
// sent after it is marked. A server that does not know the method (an
// older version) ignores it and forwards as it always did.
func (cn *link) forwarding(context.Context) error {
	_, err := cn.start("forwarding", nil, nil)
	return err
}

// send sends a call on the current connection, or on a new one if that one
// is broken, and returns the connection to wait on.
func (c *Client) send(ctx context.Context, method string, write func(params) error, p *call) (*link, uint32, error) {
	p.effect = !safeToResend(method) // methods.go
	for {
		cn, err := c.conn(ctx)
		if err != nil {
			return nil, 0, err
		}
		id, err := cn.start(method, write, p)
		if err != errNotSent {
			return cn, id, err
		}
		// It broke before anything of this call was written: redial.
	}
}

// do runs one call: write sends the params, decode reads the result.
func (c *Client) do(ctx context.Context, method string, write func(params) error, decode func(*msgpack.Decoder) error) error {
	p := &call{decode: decode, done: make(chan error, 1)}
	if err := ctx.Err(); err != nil {
		return err // sent nothing
	}
	cn, id, err := c.send(ctx, method, write, p)
	if err != nil {
		return err
	}
	return cn.wait(ctx, id, p, false)
}

// eachField reads a map, calling fn for each key with the decoder at its
// value; fn must consume the value. A nil map calls nothing.
func eachField(dec *msgpack.Decoder, fn func(dec *msgpack.Decoder, key string) error) error {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		k, err := decodeKey(dec)
		if err != nil {
			return err
		}
		if c, _ := dec.PeekCode(); c == msgpcode.Nil {
			if err := dec.Skip(); err != nil {
				return err
			}
			continue
		}
		if err := fn(dec, k); err != nil {
			return err
		}
	}
	return nil
}

// resultKeys are the keys of the result maps the server sends, so that
// decoding one does not allocate its keys. A key missing here only costs
// an allocation.
var resultKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"found", "key", "value", "fence", "revision", "token", "ttl_ms", "deleted",
		"more", "items", "locks", "lock", "holder", "held", "waiters", "lock_delay_ms", "code", "message"} {
		m[k] = k
	}
	return m
}()

// decodeKey decodes a map key as DecodeString does. A key the server is
// known to send is read in place from the buffered reader and not
// allocated.
func decodeKey(dec *msgpack.Decoder) (string, error) {
	br, ok := dec.Buffered().(*bufio.Reader)
	if !ok {
		return dec.DecodeString()
	}
	c, err := dec.PeekCode()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsFixedString(c) {
		return dec.DecodeString()
	}
	n := int(c & msgpcode.FixedStrMask)
	b, err := br.Peek(1 + n)
	if err != nil {
		return dec.DecodeString()
	}
	k, ok := resultKeys[string(b[1:])]
	if !ok {
		return dec.DecodeString()
	}
	br.Discard(1 + n)
	return k, nil
}

func decodeTo(dec *msgpack.Decoder, v *uint64) (err error) {
	*v, err = dec.DecodeUint64()
	return err
}

// params writes a request's params map; each wrapper knows how many fields
// it writes.
type params struct{ *encoder }

func (p params) bin(k string, v []byte) {
	p.EncodeString(k)
	if v == nil {
		v = []byte{} // nil would encode as msgpack nil, which means "absent"
	}
	p.EncodeBytes(v)
}
func (p params) str(k, v string) {
	p.EncodeString(k)
	p.EncodeString(v)
}
func (p params) uint(k string, v uint64) {
	p.EncodeString(k)
	p.EncodeUint(v)
}
func (p params) int(k string, v int64) {
	p.EncodeString(k)
	p.EncodeInt(v)
}
func (p params) bool(k string, v bool) {
	p.EncodeString(k)
	p.EncodeBool(v)
}

// Call sends a request with the named params and decodes its result into
// out (a pointer, or nil) with msgpack's reflection. It is the escape hatch
// for methods this client has no wrapper for.
func (c *Client) Call(ctx context.Context, method string, ps map[string]any, out any) error {
	var write func(params) error
	if ps != nil {
		write = func(p params) error { return p.Encode(ps) }
	}
	var decode func(*msgpack.Decoder) error
	if out != nil {
		decode = func(dec *msgpack.Decoder) error { return dec.Decode(out) }
	}
	return c.do(ctx, method, write, decode)
}

// writeParams writes key and the fencing options, with extra more fields
// to follow.
func writeParams(p params, key []byte, w fencekv.WriteOptions, extra int) {
	n := 1 + extra
	if w.Token != 0 {
		n++
	}
	if w.Strict {
		n++
	}
	if w.Lock != "" {
		n++
	}
	p.EncodeMapLen(n)
	p.bin("key", key)
	if w.Token != 0 {
		p.uint("token", uint64(w.Token))
	}
	if w.Strict {
		p.bool("strict", true)
	}
	if w.Lock != "" {
		p.str("lock", w.Lock)
	}
}

// writeResult decodes the result of put, delete, cas and incr.
type writeResult struct {
	fencekv.WriteResult
	deleted bool
	value   int64
}

func (r *writeResult) decode(dec *msgpack.Decoder) error {
	return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
		switch k {
		case "fence":
			err = decodeTo(dec, (*uint64)(&r.Fence))
		case "revision":
			err = decodeTo(dec, (*uint64)(&r.Revision))
		case "deleted":
			r.deleted, err = dec.DecodeBool()
		case "value":
			r.value, err = dec.DecodeInt64()
		default:
			err = dec.Skip()
		}
		return err
	})
}

// Ping checks the connection and returns the server's version.
func (c *Client) Ping(ctx context.Context) (string, error) {
	var v string
	err := c.do(ctx, "ping", nil, func(dec *msgpack.Decoder) error {
		return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
			if k == "version" {
				v, err = dec.DecodeString()
				return err
			}
			return dec.Skip()
		})
	})
	return v, err
}

// Get reads key. A missing key is not an error: Found is false.
func (c *Client) Get(ctx context.Context, key []byte) (fencekv.Entry, error) {
	e := fencekv.Entry{Key: key}
	err := c.do(ctx, "get",
		func(p params) error {
			stale := fencekv.StaleReads(ctx)
			p.EncodeMapLen(1 + b2i(stale))
			p.bin("key", key)
			if stale {
				p.str("consistency", "stale")
			}
			return nil
		},
		func(dec *msgpack.Decoder) error { return decodeEntry(dec, &e) })
	if err != nil {
		return fencekv.Entry{}, err
	}
	if e.Found && e.Value == nil {
		e.Value = []byte{}
	}
	return e, nil
}

// decodeEntry reads a get result or a scan item into e.
func decodeEntry(dec *msgpack.Decoder, e *fencekv.Entry) error {
	return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
		switch k {
		case "found":
			e.Found, err = dec.DecodeBool()
		case "key":
			e.Key, err = dec.DecodeBytes()
		case "value":
			e.Value, err = dec.DecodeBytes()
		case "fence":
			err = decodeTo(dec, (*uint64)(&e.Fence))
		case "revision":
			err = decodeTo(dec, (*uint64)(&e.Revision))
		default:
			err = dec.Skip()
		}
		return err
	})
}

// decodePage reads a paged result {list: [...], "more": bool}: alloc is
// called with the list's length, then item for each element.
func decodePage(dec *msgpack.Decoder, list string, more *bool, alloc func(n int), item func(i int, dec *msgpack.Decoder) error) error {
	return eachField(dec, func(dec *msgpack.Decoder, k string) error {
		switch k {
		case "more":
			var err error
			*more, err = dec.DecodeBool()
			return err
		case list:
			n, err := dec.DecodeArrayLen()
			if err != nil {
				return err
			}
			alloc(max(n, 0))
			for i := 0; i < n; i++ {
				if err := item(i, dec); err != nil {
					return err
				}
			}
			return nil
		}
		return dec.Skip()
	})
}

// Put writes value to key; see fencekv.DB.Put.
func (c *Client) Put(ctx context.Context, key, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	var r writeResult
	err := c.do(ctx, "put", func(p params) error {
		writeParams(p, key, w, 1)
		p.bin("value", value)
		return nil
	}, r.decode)
	return r.WriteResult, err
}

// Delete removes key; see fencekv.DB.Delete.
func (c *Client) Delete(ctx context.Context, key []byte, w fencekv.WriteOptions) (bool, fencekv.WriteResult, error) {
	var r writeResult
	err := c.do(ctx, "delete", func(p params) error {
		writeParams(p, key, w, 0)
		return nil
	}, r.decode)
	return r.deleted, r.WriteResult, err
}

// CAS writes value if key is at revision rev (0: absent); see fencekv.DB.CAS.
func (c *Client) CAS(ctx context.Context, key []byte, rev fencekv.Revision, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	var r writeResult
	err := c.do(ctx, "cas", func(p params) error {
		writeParams(p, key, w, 2)
		p.uint("revision", uint64(rev))
		p.bin("value", value)
		return nil
	}, r.decode)
	return r.WriteResult, err
}

// Incr adds delta to the integer at key; see fencekv.DB.Incr.
func (c *Client) Incr(ctx context.Context, key []byte, delta int64, w fencekv.WriteOptions) (int64, fencekv.WriteResult, error) {
	var r writeResult
	err := c.do(ctx, "incr", func(p params) error {
		writeParams(p, key, w, 1)
		p.int("delta", delta)
		return nil
	}, r.decode)
	return r.value, r.WriteResult, err
}

// Scan lists live keys in byte order; see fencekv.DB.Scan.
func (c *Client) Scan(ctx context.Context, o fencekv.ScanOptions) ([]fencekv.Entry, bool, error) {
	var items []fencekv.Entry
	var more bool
	err := c.do(ctx, "scan",
		func(p params) error {
			n := 0
			for _, set := range []bool{o.Prefix != nil, o.Start != nil, o.Limit != 0} {
				if set {
					n++
				}
			}
			p.EncodeMapLen(n)
			if o.Prefix != nil {
				p.bin("prefix", o.Prefix)
			}
			if o.Start != nil {
				p.bin("start", o.Start)
			}
			if o.Limit != 0 {
				p.int("limit", int64(o.Limit))
			}
			return nil
		},
		func(dec *msgpack.Decoder) error {
			return decodePage(dec, "items", &more, func(n int) { items = make([]fencekv.Entry, n) },
				func(i int, dec *msgpack.Decoder) error {
					items[i].Found = true
					if err := decodeEntry(dec, &items[i]); err != nil {
						return err
					}
					if items[i].Value == nil {
						items[i].Value = []byte{}
					}
					return nil
				})
		})
	if err != nil {
		return nil, false, err
	}
	return items, more, nil
}

// Acquire takes the lock; see fencekv.DB.Acquire. With o.Wait > 0 the
// call queues on the server (without holding up other calls on this
// client) until granted or the wait ends; the wait is shortened to ctx's
// deadline; a queued acquire that its leader dropped, unapplied (it lost
// the leadership or shut down), queues again while the wait lasts. If ctx
// ends first, Acquire returns ctx's error at once, and a
// grant that still arrives later is released, so the lock is not stuck with
// a holder that gave up: a goroutine of the client waits for the answer,
// and Close ends that wait (a grant that comes after Close cannot be
// released through this client; its lease runs out).
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration, o *fencekv.AcquireOptions) (fencekv.Lease, error) {
	l, _, err := c.acquire(ctx, name, ttl, o)
	return l, err
}

// acquire is Acquire; it also reports whether the request was sent. A
// queued acquire (o.Wait > 0) that the server answers as not applied
// and worth retrying (unavailable or not_leader without an unknown
// outcome: its leader lost the leadership or shut down, and dropped its
// queue) queues again, on the client's next address if it has several,
// while the wait lasts.
func (c *Client) acquire(ctx context.Context, name string, ttl time.Duration, o *fencekv.AcquireOptions) (fencekv.Lease, bool, error) {
	var ao fencekv.AcquireOptions
	if o != nil {
		ao = *o
	}
	if ao.Wait <= 0 {
		return c.acquireOnce(ctx, name, ttl, ao)
	}
	until := time.Now().Add(ao.Wait)
	pause := 50 * time.Millisecond
	reachedAny := false
	for {
		l, reached, err := c.acquireOnce(ctx, name, ttl, ao)
		reachedAny = reachedAny || reached
		if err == nil || !requeue(err) || !c.serving(ctx) {
			return l, reachedAny, err
		}
		ao.Wait = time.Until(until) - pause
		if ao.Wait <= 0 {
			return l, reachedAny, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return l, reachedAny, err
		case <-c.closing:
			t.Stop()
			return l, reachedAny, err
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

// requeue reports whether a queued acquire that failed with err was not
// applied and may be queued again: its node answered that it could not
// serve it (its leader lost the leadership or shut down), and that
// nothing was done.
func requeue(err error) bool {
	var fe *fencekv.Error
	var ce *ConnError
	return !errors.As(err, &ce) && errors.As(err, &fe) &&
		(fe.Code == fencekv.CodeUnavailable || fe.Code == fencekv.CodeNotLeader) && fe.Outcome == ""
}

// serving reports whether a node still takes requests: the client's own
// (or, if its connection broke, the next address's) answers a ping within
// a second. A node that is itself shutting down does not: its waiter's
// unavailable is then the answer.
func (c *Client) serving(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := c.Ping(ctx)
	return err == nil
}

// acquireOnce sends one acquire.
func (c *Client) acquireOnce(ctx context.Context, name string, ttl time.Duration, ao fencekv.AcquireOptions) (fencekv.Lease, bool, error) {
	if d, ok := ctx.Deadline(); ok && ao.Wait > 0 {
		ao.Wait = max(min(ao.Wait, time.Until(d)), time.Millisecond)
	}
	var token uint64
	var ttlMs int64
	p := &call{done: make(chan error, 1), decode: func(dec *msgpack.Decoder) error {
		return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
			switch k {
			case "token":
				token, err = dec.DecodeUint64()
			case "ttl_ms":
				ttlMs, err = dec.DecodeInt64()
			default:
				err = dec.Skip()
			}
			return err
		})
	}}
	write := func(p params) error {
		n := 2
		for _, set := range []bool{ao.Holder != "", ao.Wait > 0, ao.LockDelay > 0, ao.Limit != 0} {
			if set {
				n++
			}
		}
		p.EncodeMapLen(n)
		p.str("lock", name)
		p.int("ttl_ms", ttl.Milliseconds())
		if ao.Holder != "" {
			p.str("holder", ao.Holder)
		}
		if ao.Wait > 0 {
			p.int("wait_ms", max(ao.Wait.Milliseconds(), 1))
		}
		if ao.LockDelay > 0 {
			p.int("lock_delay_ms", ao.LockDelay.Milliseconds())
		}
		if ao.Limit != 0 {
			p.int("limit", int64(ao.Limit)) // a semaphore (semaphore.go)
		}
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fencekv.Lease{}, false, err // sent nothing
	}
	cn, id, err := c.send(ctx, "acquire", write, p)
	if err != nil {
		return fencekv.Lease{}, false, err
	}
	err = cn.wait(ctx, id, p, true)
	if err != nil && ctx.Err() != nil && err == ctx.Err() {
		// The response still comes (the call stays registered); if it is
		// a grant, nobody will use it: release it. If the connection
		// breaks or Close has begun, the call has failed (the server drops
		// the acquires queued by a connection that closes) and there is
		// nothing to wait for.
		c.spawn(func() {
			if cn.wait(context.Background(), id, p, false) == nil && token != 0 {
				rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				c.Release(rctx, name, fencekv.Token(token))
			}
		})
		return fencekv.Lease{}, true, err
	}
	if err != nil {
		return fencekv.Lease{}, true, err
	}
	return fencekv.Lease{Name: name, Token: fencekv.Token(token), TTL: time.Duration(ttlMs) * time.Millisecond}, true, nil
}

// lockParams writes {lock, token}.
func lockParams(name string, token fencekv.Token) func(params) error {
	return func(p params) error {
		p.EncodeMapLen(2)
		p.str("lock", name)
		p.uint("token", uint64(token))
		return nil
	}
}

// Renew gives the lease its full TTL again; see fencekv.DB.Renew.
func (c *Client) Renew(ctx context.Context, name string, token fencekv.Token) (time.Duration, error) {
	var ttlMs int64
	err := c.do(ctx, "renew", lockParams(name, token), func(dec *msgpack.Decoder) error {
		return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
			if k == "ttl_ms" {
				ttlMs, err = dec.DecodeInt64()
				return err
			}
			return dec.Skip()
		})
	})
	return time.Duration(ttlMs) * time.Millisecond, err
}

// Release frees the lock held by token; see fencekv.DB.Release.
func (c *Client) Release(ctx context.Context, name string, token fencekv.Token) error {
	return c.do(ctx, "release", lockParams(name, token), nil)
}

// decodeLock reads a lock_info map (or an element of locks).
func decodeLock(dec *msgpack.Decoder, in *fencekv.LockInfo) error {
	return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
		var ms int64
		switch k {
		case "lock":
			var b []byte
			b, err = dec.DecodeBytes()
			in.Name = string(b)
		case "held":
			in.Held, err = dec.DecodeBool()
		case "holder":
			in.Holder, err = dec.DecodeString()
		case "token":
			err = decodeTo(dec, (*uint64)(&in.Token))
		case "ttl_ms":
			ms, err = dec.DecodeInt64()
			in.TTL = time.Duration(ms) * time.Millisecond
		case "waiters":
			in.Waiters, err = dec.DecodeInt()
		case "lock_delay_ms":
			ms, err = dec.DecodeInt64()
			in.Delay = time.Duration(ms) * time.Millisecond
		case "limit", "holders":
			err = decodeSem(dec, k, in) // semaphore.go
		default:
			err = dec.Skip()
		}
		return err
	})
}

// LockInfo describes a lock; see fencekv.DB.LockInfo.
func (c *Client) LockInfo(ctx context.Context, name string) (fencekv.LockInfo, error) {
	in := fencekv.LockInfo{Name: name}
	err := c.do(ctx, "lock_info",
		func(p params) error {
			p.EncodeMapLen(1)
			p.str("lock", name)
			return nil
		},
		func(dec *msgpack.Decoder) error { return decodeLock(dec, &in) })
	if err != nil {
		return fencekv.LockInfo{}, err
	}
	return in, nil
}

// Locks lists held locks; see fencekv.DB.Locks.
func (c *Client) Locks(ctx context.Context, prefix, start string, limit int) ([]fencekv.LockInfo, bool, error) {
	var locks []fencekv.LockInfo
	var more bool
	err := c.do(ctx, "locks",
		func(p params) error {
			n := 0
			for _, set := range []bool{prefix != "", start != "", limit != 0} {
				if set {
					n++
				}
			}
			p.EncodeMapLen(n)
			if prefix != "" {
				p.str("prefix", prefix)
			}
			if start != "" {
				p.str("start", start)
			}
			if limit != 0 {
				p.int("limit", int64(limit))
			}
			return nil
		},
		func(dec *msgpack.Decoder) error {
			return decodePage(dec, "locks", &more, func(n int) { locks = make([]fencekv.LockInfo, n) },
				func(i int, dec *msgpack.Decoder) error { return decodeLock(dec, &locks[i]) })
		})
	if err != nil {
		return nil, false, err
	}
	return locks, more, nil
}

// Status reads the server's counters.
func (c *Client) Status(ctx context.Context) (fencekv.Status, error) {
	var st fencekv.Status
	err := c.do(ctx, "status", nil, func(dec *msgpack.Decoder) error {
		return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
			switch k {
			case "version":
				st.Version, err = dec.DecodeString()
			case "last_token":
				err = decodeTo(dec, (*uint64)(&st.LastToken))
			case "revision":
				err = decodeTo(dec, (*uint64)(&st.Revision))
			case "keys":
				st.Keys, err = dec.DecodeUint64()
			case "locks":
				st.Locks, err = dec.DecodeInt()
			case "waiters":
				st.Waiters, err = dec.DecodeInt()
			case "commits":
				st.Commits, err = dec.DecodeUint64()
			case "commands":
				st.Commands, err = dec.DecodeUint64()
			case "data_size":
				st.DataSize, err = dec.DecodeInt64()
			case "sync_us":
				var us int64
				us, err = dec.DecodeInt64()
				st.SyncTime = time.Duration(us) * time.Microsecond
			case "checkpoints":
				st.Checkpoints, err = dec.DecodeUint64()
			case "checkpoint_us":
				var us int64
				us, err = dec.DecodeInt64()
				st.CheckpointTime = time.Duration(us) * time.Microsecond
			default:
				err = decodeNodeStatus(dec, k, &st)
			}
			return err
		})
	})
	if err != nil {
		return fencekv.Status{}, err
	}
	return st, nil
}

var _ Engine = (*Client)(nil)
