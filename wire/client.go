package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// ErrClientClosed is returned by calls on a closed Client, and by calls in
// flight when the connection breaks (wrapped with the cause).
var ErrClientClosed = errors.New("wire: client connection closed")

// Client speaks the protocol to one server over one TCP connection. It is
// safe for concurrent use: calls from many goroutines are pipelined on the
// connection and matched to their responses by msgid.
//
// Refusals come back as *fencekv.Error with the server's code and facts, so
// errors.Is(err, fencekv.ErrStaleToken) works as with an embedded DB.
type Client struct {
	nc   net.Conn
	addr string

	wmu  sync.Mutex // guards bw, enc, next (the write side)
	bw   *bufio.Writer
	enc  *msgpack.Encoder
	next uint32

	mu      sync.Mutex // guards pending, err
	pending map[uint32]chan response
	err     error // set once the connection is broken or closed

	done chan struct{} // closed when the read loop ends
}

type response struct {
	errRaw, resRaw msgpack.RawMessage
}

// Dial connects to a fencekv server at addr (host:port).
func Dial(ctx context.Context, addr string) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("wire: dial %s: %w", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := &Client{
		nc:      nc,
		addr:    addr,
		bw:      bufio.NewWriter(nc),
		pending: make(map[uint32]chan response),
		done:    make(chan struct{}),
	}
	c.enc = msgpack.NewEncoder(c.bw)
	go c.readLoop()
	return c, nil
}

// Addr is the server address the client dialed.
func (c *Client) Addr() string { return c.addr }

// Close closes the connection; calls in flight fail. It is safe to call
// more than once.
func (c *Client) Close() error {
	c.fail(ErrClientClosed)
	err := c.nc.Close()
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// fail marks the client broken and fails every pending call.
func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	for id, ch := range c.pending {
		delete(c.pending, id)
		close(ch)
	}
}

func (c *Client) readLoop() {
	defer close(c.done)
	dec := msgpack.NewDecoder(bufio.NewReaderSize(c.nc, 64<<10))
	for {
		id, r, err := readResponse(dec)
		if err != nil {
			// %w twice: a refusal the server sent before closing (such as
			// limit_exceeded for too many connections) stays visible to
			// errors.Is alongside ErrClientClosed.
			c.fail(fmt.Errorf("%w: %w", ErrClientClosed, err))
			return
		}
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
}

// readResponse reads the next response, skipping notifications (a server
// sends one, "error", before closing a connection it refuses).
func readResponse(dec *msgpack.Decoder) (uint32, response, error) {
	for {
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return 0, response{}, err
		}
		typ, err := dec.DecodeInt()
		if err != nil {
			return 0, response{}, err
		}
		if typ == typeNotification && n == 3 {
			var method string
			var params []map[string]any
			if err := dec.Decode(&method); err != nil {
				return 0, response{}, err
			}
			if err := dec.Decode(&params); err != nil {
				return 0, response{}, err
			}
			if method == "error" && len(params) == 1 {
				// A refusal with its code, so that errors.Is(err,
				// fencekv.ErrLimitExceeded) works (it was a plain string).
				code, _ := params[0]["code"].(string)
				msg, _ := params[0]["message"].(string)
				return 0, response{}, &fencekv.Error{Code: fencekv.Code(code), Message: "server closed the connection: " + msg}
			}
			continue
		}
		if typ != typeResponse || n != 4 {
			return 0, response{}, fmt.Errorf("unexpected message type %d", typ)
		}
		id, err := dec.DecodeUint32()
		if err != nil {
			return 0, response{}, err
		}
		var r response
		if r.errRaw, err = dec.DecodeRaw(); err != nil {
			return 0, response{}, err
		}
		if r.resRaw, err = dec.DecodeRaw(); err != nil {
			return 0, response{}, err
		}
		return id, r, nil
	}
}

// Call sends a request with the named params and decodes its result into
// out (a pointer, or nil). It is the escape hatch for methods this client
// has no wrapper for; the wrappers below use it.
func (c *Client) Call(ctx context.Context, method string, params map[string]any, out any) error {
	id, ch, err := c.start(method, params)
	if err != nil {
		return err
	}
	select {
	case r, ok := <-ch:
		return c.finish(r, ok, out)
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return ctx.Err()
	}
}

// start sends a request and returns the channel its response will arrive
// on (closed if the connection breaks first).
func (c *Client) start(method string, params map[string]any) (uint32, chan response, error) {
	ch := make(chan response, 1)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.next++
	id := c.next
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, nil, err
	}
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.writeRequest(id, method, params); err != nil {
		err = fmt.Errorf("%w: %v", ErrClientClosed, err)
		c.fail(err)
		c.nc.Close()
		return 0, nil, err
	}
	return id, ch, nil
}

// finish decodes a response received from start's channel.
func (c *Client) finish(r response, ok bool, out any) error {
	if !ok {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	}
	return decodeResponse(r, out)
}

// writeRequest writes [0, id, method, [params]] and flushes. Called with
// wmu held.
func (c *Client) writeRequest(id uint32, method string, params map[string]any) error {
	if err := c.enc.EncodeArrayLen(4); err != nil {
		return err
	}
	c.enc.EncodeUint(typeRequest)
	c.enc.EncodeUint(uint64(id))
	c.enc.EncodeString(method)
	if params == nil {
		c.enc.EncodeArrayLen(0)
	} else {
		c.enc.EncodeArrayLen(1)
		if err := c.enc.Encode(params); err != nil {
			return err
		}
	}
	return c.bw.Flush()
}

// wireError is the error map of a response.
type wireError struct {
	Code     string `msgpack:"code"`
	Message  string `msgpack:"message"`
	Fence    uint64 `msgpack:"fence"`
	Token    uint64 `msgpack:"token"`
	Holder   string `msgpack:"holder"`
	RetryMs  int64  `msgpack:"retry_ms"`
	Revision uint64 `msgpack:"revision"`
	Leader   string `msgpack:"leader"`
}

func decodeResponse(r response, out any) error {
	if len(r.errRaw) > 0 && r.errRaw[0] != 0xc0 {
		var we wireError
		if err := msgpack.Unmarshal(r.errRaw, &we); err != nil {
			var s string
			if msgpack.Unmarshal(r.errRaw, &s) == nil {
				return &fencekv.Error{Code: fencekv.CodeInternal, Message: s}
			}
			return fmt.Errorf("wire: undecodable error from server: %w", err)
		}
		return &fencekv.Error{
			Code:       fencekv.Code(we.Code),
			Message:    we.Message,
			Fence:      fencekv.Token(we.Fence),
			Token:      fencekv.Token(we.Token),
			Holder:     we.Holder,
			RetryAfter: time.Duration(we.RetryMs) * time.Millisecond,
			Revision:   fencekv.Revision(we.Revision),
			Leader:     we.Leader,
		}
	}
	if out == nil {
		return nil
	}
	if err := msgpack.Unmarshal(r.resRaw, out); err != nil {
		return fmt.Errorf("wire: undecodable result: %w", err)
	}
	return nil
}

func writeParams(key []byte, w fencekv.WriteOptions) map[string]any {
	p := map[string]any{"key": key}
	if w.Token != 0 {
		p["token"] = uint64(w.Token)
	}
	if w.Strict {
		p["strict"] = true
	}
	if w.Lock != "" {
		p["lock"] = w.Lock
	}
	return p
}

// nonNil makes a nil value an empty one: msgpack encodes a nil []byte as
// nil, which the server reads as a missing "value" (a Put of nil used to be
// refused with bad_request, unlike fencekv.DB.Put).
func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

type writeResult struct {
	Fence    uint64 `msgpack:"fence"`
	Revision uint64 `msgpack:"revision"`
	Deleted  bool   `msgpack:"deleted"`
	Value    int64  `msgpack:"value"`
}

func (r writeResult) result() fencekv.WriteResult {
	return fencekv.WriteResult{Fence: fencekv.Token(r.Fence), Revision: fencekv.Revision(r.Revision)}
}

// Ping checks the connection and returns the server's version.
func (c *Client) Ping(ctx context.Context) (string, error) {
	var r struct {
		Version string `msgpack:"version"`
	}
	err := c.Call(ctx, "ping", nil, &r)
	return r.Version, err
}

// Get reads key. A missing key is not an error: Found is false.
func (c *Client) Get(ctx context.Context, key []byte) (fencekv.Entry, error) {
	var r struct {
		Found    bool   `msgpack:"found"`
		Value    []byte `msgpack:"value"`
		Fence    uint64 `msgpack:"fence"`
		Revision uint64 `msgpack:"revision"`
	}
	if err := c.Call(ctx, "get", map[string]any{"key": key}, &r); err != nil {
		return fencekv.Entry{}, err
	}
	if r.Found && r.Value == nil {
		r.Value = []byte{}
	}
	return fencekv.Entry{Key: key, Value: r.Value, Found: r.Found, Fence: fencekv.Token(r.Fence), Revision: fencekv.Revision(r.Revision)}, nil
}

// Put writes value to key; see fencekv.DB.Put.
func (c *Client) Put(ctx context.Context, key, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	p := writeParams(key, w)
	p["value"] = nonNil(value)
	var r writeResult
	err := c.Call(ctx, "put", p, &r)
	return r.result(), err
}

// Delete removes key; see fencekv.DB.Delete.
func (c *Client) Delete(ctx context.Context, key []byte, w fencekv.WriteOptions) (bool, fencekv.WriteResult, error) {
	var r writeResult
	err := c.Call(ctx, "delete", writeParams(key, w), &r)
	return r.Deleted, r.result(), err
}

// CAS writes value if key is at revision rev (0: absent); see fencekv.DB.CAS.
func (c *Client) CAS(ctx context.Context, key []byte, rev fencekv.Revision, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	p := writeParams(key, w)
	p["revision"] = uint64(rev)
	p["value"] = nonNil(value)
	var r writeResult
	err := c.Call(ctx, "cas", p, &r)
	return r.result(), err
}

// Incr adds delta to the integer at key; see fencekv.DB.Incr.
func (c *Client) Incr(ctx context.Context, key []byte, delta int64, w fencekv.WriteOptions) (int64, fencekv.WriteResult, error) {
	p := writeParams(key, w)
	p["delta"] = delta
	var r writeResult
	err := c.Call(ctx, "incr", p, &r)
	return r.Value, r.result(), err
}

// Scan lists live keys in byte order; see fencekv.DB.Scan.
func (c *Client) Scan(ctx context.Context, o fencekv.ScanOptions) ([]fencekv.Entry, bool, error) {
	p := map[string]any{}
	if o.Prefix != nil {
		p["prefix"] = o.Prefix
	}
	if o.Start != nil {
		p["start"] = o.Start
	}
	if o.Limit != 0 {
		p["limit"] = o.Limit
	}
	var r struct {
		Items []struct {
			Key      []byte `msgpack:"key"`
			Value    []byte `msgpack:"value"`
			Fence    uint64 `msgpack:"fence"`
			Revision uint64 `msgpack:"revision"`
		} `msgpack:"items"`
		More bool `msgpack:"more"`
	}
	if err := c.Call(ctx, "scan", p, &r); err != nil {
		return nil, false, err
	}
	out := make([]fencekv.Entry, len(r.Items))
	for i, it := range r.Items {
		if it.Value == nil {
			it.Value = []byte{}
		}
		out[i] = fencekv.Entry{Key: it.Key, Value: it.Value, Found: true, Fence: fencekv.Token(it.Fence), Revision: fencekv.Revision(it.Revision)}
	}
	return out, r.More, nil
}

// Acquire takes the lock; see fencekv.DB.Acquire. With o.Wait > 0 the
// call queues on the server (without holding up other calls on this
// client) until granted or the wait ends; the wait is shortened to ctx's
// deadline. If ctx ends first, Acquire returns ctx's error at once, and a
// grant that still arrives later is released, so the lock is not stuck with
// a holder that gave up.
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration, o *fencekv.AcquireOptions) (fencekv.Lease, error) {
	p := map[string]any{"lock": name, "ttl_ms": ttl.Milliseconds()}
	var wait time.Duration
	if o != nil {
		if o.Holder != "" {
			p["holder"] = o.Holder
		}
		wait = o.Wait
		if d, ok := ctx.Deadline(); ok && wait > 0 {
			wait = min(wait, time.Until(d))
		}
		if wait > 0 {
			p["wait_ms"] = max(wait.Milliseconds(), 1)
		}
		if o.LockDelay > 0 {
			p["lock_delay_ms"] = o.LockDelay.Milliseconds()
		}
	}
	type granted struct {
		Token uint64 `msgpack:"token"`
		TTLMs int64  `msgpack:"ttl_ms"`
	}
	_, ch, err := c.start("acquire", p)
	if err != nil {
		return fencekv.Lease{}, err
	}
	var g granted
	select {
	case r, ok := <-ch:
		if err := c.finish(r, ok, &g); err != nil {
			return fencekv.Lease{}, err
		}
		return fencekv.Lease{Name: name, Token: fencekv.Token(g.Token), TTL: time.Duration(g.TTLMs) * time.Millisecond}, nil
	case <-ctx.Done():
		go func() {
			// The response still comes (the channel stays registered);
			// if it is a grant, nobody will use it: release it.
			r, ok := <-ch
			if ok && decodeResponse(r, &g) == nil && g.Token != 0 {
				rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				c.Release(rctx, name, fencekv.Token(g.Token))
			}
		}()
		return fencekv.Lease{}, ctx.Err()
	}
}

// Renew gives the lease its full TTL again; see fencekv.DB.Renew.
func (c *Client) Renew(ctx context.Context, name string, token fencekv.Token) (time.Duration, error) {
	var r struct {
		TTLMs int64 `msgpack:"ttl_ms"`
	}
	err := c.Call(ctx, "renew", map[string]any{"lock": name, "token": uint64(token)}, &r)
	return time.Duration(r.TTLMs) * time.Millisecond, err
}

// Release frees the lock held by token; see fencekv.DB.Release.
func (c *Client) Release(ctx context.Context, name string, token fencekv.Token) error {
	return c.Call(ctx, "release", map[string]any{"lock": name, "token": uint64(token)}, nil)
}

type lockResult struct {
	Lock        []byte `msgpack:"lock"`
	Held        bool   `msgpack:"held"`
	Holder      string `msgpack:"holder"`
	Token       uint64 `msgpack:"token"`
	TTLMs       int64  `msgpack:"ttl_ms"`
	Waiters     int    `msgpack:"waiters"`
	LockDelayMs int64  `msgpack:"lock_delay_ms"`
}

func (l lockResult) info(name string) fencekv.LockInfo {
	if l.Lock != nil {
		name = string(l.Lock)
	}
	return fencekv.LockInfo{
		Name: name, Held: l.Held, Holder: l.Holder, Token: fencekv.Token(l.Token),
		TTL: time.Duration(l.TTLMs) * time.Millisecond, Delay: time.Duration(l.LockDelayMs) * time.Millisecond,
		Waiters: l.Waiters,
	}
}

// LockInfo describes a lock; see fencekv.DB.LockInfo.
func (c *Client) LockInfo(ctx context.Context, name string) (fencekv.LockInfo, error) {
	var r lockResult
	if err := c.Call(ctx, "lock_info", map[string]any{"lock": name}, &r); err != nil {
		return fencekv.LockInfo{}, err
	}
	return r.info(name), nil
}

// Locks lists held locks; see fencekv.DB.Locks.
func (c *Client) Locks(ctx context.Context, prefix, start string, limit int) ([]fencekv.LockInfo, bool, error) {
	p := map[string]any{}
	if prefix != "" {
		p["prefix"] = prefix
	}
	if start != "" {
		p["start"] = start
	}
	if limit != 0 {
		p["limit"] = limit
	}
	var r struct {
		Locks []lockResult `msgpack:"locks"`
		More  bool         `msgpack:"more"`
	}
	if err := c.Call(ctx, "locks", p, &r); err != nil {
		return nil, false, err
	}
	out := make([]fencekv.LockInfo, len(r.Locks))
	for i, l := range r.Locks {
		out[i] = l.info("")
	}
	return out, r.More, nil
}

// Status reads the server's counters.
func (c *Client) Status(ctx context.Context) (fencekv.Status, error) {
	var r struct {
		Version   string `msgpack:"version"`
		LastToken uint64 `msgpack:"last_token"`
		Revision  uint64 `msgpack:"revision"`
		Keys      uint64 `msgpack:"keys"`
		Locks     int    `msgpack:"locks"`
		Waiters   int    `msgpack:"waiters"`
		Commits   uint64 `msgpack:"commits"`
		Commands  uint64 `msgpack:"commands"`
		DataSize  int64  `msgpack:"data_size"`
	}
	if err := c.Call(ctx, "status", nil, &r); err != nil {
		return fencekv.Status{}, err
	}
	return fencekv.Status{
		Version: r.Version, LastToken: fencekv.Token(r.LastToken), Revision: fencekv.Revision(r.Revision),
		Keys: r.Keys, Locks: r.Locks, Waiters: r.Waiters, Commits: r.Commits, Commands: r.Commands, DataSize: r.DataSize,
	}, nil
}

var _ Engine = (*Client)(nil)
