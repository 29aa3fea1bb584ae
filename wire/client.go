package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrClientClosed is returned by calls on a closed Client, and by calls in
// flight when the connection breaks (wrapped with the cause).
var ErrClientClosed = errors.New("wire: client connection closed")

// Client speaks the protocol to one server over one TCP connection. It is
// safe for concurrent use: calls from many goroutines are pipelined on the
// connection and matched to their responses by msgid.
//
// There is no reader goroutine. A caller waiting for its response reads
// the connection itself, unless another caller already is: that one, the
// reader, completes every response it reads (decoding each into its
// caller's variables) until its own arrives, then hands the reading on to
// a caller still waiting. A lone caller so wakes straight from the socket,
// with no goroutine switch between it and its answer.
//
// Refusals come back as *fencekv.Error with the server's code and facts, so
// errors.Is(err, fencekv.ErrStaleToken) works as with an embedded DB.
type Client struct {
	nc   net.Conn
	addr string

	writers atomic.Int32 // callers waiting for or holding wmu
	wmu     sync.Mutex   // guards bw, enc, next (the write side)
	bw      *bufio.Writer
	enc     *msgpack.Encoder
	next    uint32

	mu      sync.Mutex // guards pending, err, reading, reader
	pending map[uint32]*call
	err     error // set once the connection is broken or closed
	reading bool  // a caller holds the read side (or has been handed it)
	reader  *call // the call the read side was handed to, until it takes it

	// The read side, used by the caller that holds it.
	br      *bufio.Reader
	dec     *msgpack.Decoder
	watched context.Context // the context whose end interrupts the reader (see watch)

	// dlmu orders a context's end against the reader's wait for the next
	// response: a read deadline is set only while the reader waits between
	// responses, never in the middle of one. It also guards unwatch.
	dlmu     sync.Mutex
	idleWait bool        // the reader is waiting for the first byte of a response
	dlSet    bool        // a read deadline was set to interrupt that wait
	unwatch  func() bool // stops the watch on the context in watched
	closed   bool        // Close has dropped the watch: make no more

	// The client's own goroutines (see spawn), which Close waits for.
	bgmu     sync.Mutex     // guards stopping, and orders bg.Go before bg.Wait
	stopping bool           // Close has begun: start no more
	closing  chan struct{}  // closed when Close begins
	bg       sync.WaitGroup // the goroutines spawn started, and the watch's (see watch)
	running  atomic.Int32   // how many of them are running (for tests)
	ending   func()         // tests: run by each goroutine of spawn as it ends
}

// call is a request waiting for its response. The reader decodes the
// result straight from the stream with decode (into the caller's
// variables), then sends the outcome on done.
type call struct {
	decode func(*msgpack.Decoder) error // nil: skip the result
	done   chan error                   // buffered; closed if the connection breaks first
}

// errTakeRead, sent on a waiting call's done, hands it the read side.
var errTakeRead = errors.New("wire: take over reading")

// Dial connects to a fencekv server at addr (host:port) over plain TCP;
// DialWith (tls.go) adds TLS and credentials.
func Dial(ctx context.Context, addr string) (*Client, error) {
	return DialWith(ctx, addr, nil)
}

// newClient makes a client of a connection just dialed.
func newClient(nc net.Conn, addr string) *Client {
	tcp := nc
	if tc, ok := nc.(interface{ NetConn() net.Conn }); ok {
		tcp = tc.NetConn() // under TLS
	}
	if tc, ok := tcp.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := &Client{
		nc:      nc,
		addr:    addr,
		bw:      bufio.NewWriter(nc),
		br:      bufio.NewReaderSize(nc, 64<<10),
		pending: make(map[uint32]*call),
		closing: make(chan struct{}),
	}
	c.enc = msgpack.NewEncoder(c.bw)
	c.dec = msgpack.NewDecoder(c.br)
	return c
}

// Addr is the server address the client dialed.
func (c *Client) Addr() string { return c.addr }

// Close closes the connection; calls in flight fail. It returns once the
// goroutines the client started have ended: the release of a grant that
// came after its caller gave up (see Acquire), and the renewing behind
// WithLock, whose callback's context is cancelled with ErrLeaseLost. Close
// is idempotent: it is safe to call more than once, and from several
// goroutines; every call returns after that wait, and calls after the
// first return nil.
func (c *Client) Close() error {
	c.fail(ErrClientClosed)
	c.bgmu.Lock()
	if !c.stopping {
		c.stopping = true
		close(c.closing)
	}
	c.bgmu.Unlock()
	c.dlmu.Lock()
	c.closed = true
	if c.unwatch != nil {
		// Or a long-lived context would keep the client reachable.
		c.unwatch()
		c.unwatch = nil
	}
	c.dlmu.Unlock()
	err := c.nc.Close()
	// Every call fails now, and fast: the goroutines end soon.
	c.bg.Wait()
	if errors.Is(err, net.ErrClosed) {
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

// fail marks the client broken and fails every pending call.
func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	for id, p := range c.pending {
		delete(c.pending, id)
		close(p.done)
	}
}

// broken returns the error the client failed with.
func (c *Client) broken() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// passRead hands the read side to a call still waiting other than except,
// or gives it up if none is. Called with mu held, by the goroutine that
// holds the read side.
func (c *Client) passRead(except *call) {
	c.reader = nil
	for _, q := range c.pending {
		if q != except {
			// q's done is empty: only the holder of the read side (the
			// caller) sends outcomes, and q's has not come.
			c.reader = q
			q.done <- errTakeRead
			return
		}
	}
	c.reading = false
}

// errInterrupted is returned by readResponse when ctx ended while it
// waited for a response to begin; the stream is intact.
var errInterrupted = errors.New("wire: wait interrupted")

// readFor holds the read side for call p: it reads responses, completing
// the calls they answer, until p's arrives, then hands the read side on and
// returns p's outcome. If ctx ends while it waits between responses, it
// hands the read side on and returns ctx's error, forgetting p unless keep.
func (c *Client) readFor(ctx context.Context, id uint32, p *call, keep bool) error {
	c.watch(ctx)
	var err error
	for {
		var q *call
		if q, err = c.readResponse(ctx); err != nil || q == p {
			break
		}
	}
	switch {
	case err == errInterrupted:
		c.mu.Lock()
		if !keep {
			delete(c.pending, id)
		}
		c.passRead(p)
		c.mu.Unlock()
		return ctx.Err()
	case err != nil:
		// %w twice: a refusal the server sent before closing (such as
		// limit_exceeded for too many connections) stays visible to
		// errors.Is alongside ErrClientClosed.
		c.fail(fmt.Errorf("%w: %w", ErrClientClosed, err))
		return c.broken()
	}
	c.mu.Lock()
	c.passRead(nil)
	c.mu.Unlock()
	out, ok := <-p.done
	if !ok {
		return c.broken()
	}
	return out
}

// watch arranges for ctx's end to interrupt the reader's wait. Callers
// mostly pass the same context call after call, so the registration is
// kept until a reader brings another: a context that ends while another
// reader waits interrupts it in vain, and that reader waits on.
func (c *Client) watch(ctx context.Context) {
	if ctx == c.watched {
		return
	}
	c.dlmu.Lock()
	defer c.dlmu.Unlock()
	if c.unwatch != nil {
		c.unwatch()
		c.unwatch = nil
	}
	c.watched = ctx
	if ctx.Done() != nil && !c.closed {
		// When ctx ends, interrupt runs in a goroutine of its own: Close
		// waits for it as for the client's other goroutines (see spawn).
		// The count is taken now, under dlmu, so before Close waits.
		c.bg.Add(1)
		stop := context.AfterFunc(ctx, func() {
			defer c.bg.Done()
			c.running.Add(1)
			defer c.running.Add(-1)
			c.interrupt()
		})
		c.unwatch = func() bool {
			if !stop() {
				return false // running or run: it counts itself down
			}
			c.bg.Done()
			return true
		}
	}
}

// interrupt cuts short the reader's wait for the next response, if it is
// waiting; called when the reader's context ends.
func (c *Client) interrupt() {
	c.dlmu.Lock()
	defer c.dlmu.Unlock()
	if c.idleWait && !c.dlSet {
		c.nc.SetReadDeadline(time.Unix(1, 0))
		c.dlSet = true
	}
}

// awaitResponse waits until the first byte of a response has arrived, or
// ctx ends (errInterrupted), or the connection fails.
func (c *Client) awaitResponse(ctx context.Context) error {
	for c.br.Buffered() == 0 {
		c.dlmu.Lock()
		if ctx.Err() != nil {
			c.dlmu.Unlock()
			return errInterrupted
		}
		c.idleWait = true
		c.dlmu.Unlock()
		_, err := c.br.Peek(1)
		c.dlmu.Lock()
		c.idleWait = false
		cut := c.dlSet
		if cut {
			c.nc.SetReadDeadline(time.Time{})
			c.dlSet = false
		}
		c.dlmu.Unlock()
		if err == nil {
			return nil
		}
		if !cut || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		// Interrupted: by ctx's end, or late, by an earlier reader's
		// (then wait on).
		if ctx.Err() != nil {
			return errInterrupted
		}
	}
	return nil
}

// readResponse reads the next response and completes its call, which it
// returns (nil if the call was forgotten). It skips notifications, but for
// the server's "error" notification, sent before it closes a connection it
// refuses, which it returns as an error. An error other than errInterrupted
// means the stream cannot be read further.
func (c *Client) readResponse(ctx context.Context) (*call, error) {
	if err := c.awaitResponse(ctx); err != nil {
		return nil, err
	}
	dec := c.dec
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	typ, err := dec.DecodeInt()
	if err != nil {
		return nil, err
	}
	if typ == typeNotification && n == 3 {
		var method string
		var params []map[string]any
		if err := dec.Decode(&method); err != nil {
			return nil, err
		}
		if err := dec.Decode(&params); err != nil {
			return nil, err
		}
		if method == "error" && len(params) == 1 {
			code, _ := params[0]["code"].(string)
			msg, _ := params[0]["message"].(string)
			return nil, &fencekv.Error{Code: fencekv.Code(code), Message: "server closed the connection: " + msg}
		}
		return nil, nil
	}
	if typ != typeResponse || n != 4 {
		return nil, fmt.Errorf("unexpected message type %d", typ)
	}
	id, err := dec.DecodeUint32()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	p := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	refusal, err := decodeError(dec)
	if err != nil {
		return nil, err
	}
	var outcome error
	switch {
	case refusal != nil:
		outcome = refusal
		err = dec.Skip()
	case p == nil || p.decode == nil:
		err = dec.Skip()
	default:
		// Decode into the caller's variables; the caller reads them only
		// after receiving on done.
		err = p.decode(dec)
		if err != nil {
			outcome = fmt.Errorf("wire: undecodable result: %w", err)
		}
	}
	if p != nil {
		p.done <- outcome
	}
	return p, err
}

// decodeError reads a response's error slot: nil, or a refusal map (or,
// from other MessagePack-RPC servers, a string).
func decodeError(dec *msgpack.Decoder) (error, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return nil, err
	}
	if c == msgpcode.Nil {
		return nil, dec.Skip()
	}
	if msgpcode.IsString(c) {
		s, err := dec.DecodeString()
		return &fencekv.Error{Code: fencekv.CodeInternal, Message: s}, err
	}
	fe := &fencekv.Error{}
	err = eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
		switch k {
		case "code":
			var s string
			s, err = dec.DecodeString()
			fe.Code = fencekv.Code(s)
		case "message":
			fe.Message, err = dec.DecodeString()
		case "fence":
			err = decodeTo(dec, (*uint64)(&fe.Fence))
		case "token":
			err = decodeTo(dec, (*uint64)(&fe.Token))
		case "holder":
			fe.Holder, err = dec.DecodeString()
		case "retry_ms":
			var ms int64
			ms, err = dec.DecodeInt64()
			fe.RetryAfter = time.Duration(ms) * time.Millisecond
		case "revision":
			err = decodeTo(dec, (*uint64)(&fe.Revision))
		case "leader":
			fe.Leader, err = dec.DecodeString()
		case "outcome":
			fe.Outcome, err = dec.DecodeString()
		case "key":
			var b []byte
			b, err = dec.DecodeBytes()
			fe.Key = string(b)
		default:
			err = dec.Skip()
		}
		return err
	})
	return fe, err
}

// eachField reads a map, calling fn for each key with the decoder at its
// value; fn must consume the value. A nil map calls nothing.
func eachField(dec *msgpack.Decoder, fn func(dec *msgpack.Decoder, key string) error) error {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		k, err := dec.DecodeString()
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

func decodeTo(dec *msgpack.Decoder, v *uint64) (err error) {
	*v, err = dec.DecodeUint64()
	return err
}

// params writes a request's params map; each wrapper knows how many fields
// it writes.
type params struct{ *msgpack.Encoder }

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

// start sends [0, id, method, [params]] (params written by write; nil
// write sends an empty params array) and registers p for the response.
func (c *Client) start(method string, write func(params) error, p *call) (uint32, error) {
	c.writers.Add(1)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	// The last of the callers queued here flushes for all of them, so
	// concurrent calls leave in one write.
	last := c.writers.Add(-1) == 0
	c.next++
	id := c.next
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	c.pending[id] = p
	c.mu.Unlock()
	e := c.enc
	e.EncodeArrayLen(4)
	e.EncodeUint(typeRequest)
	e.EncodeUint(uint64(id))
	e.EncodeString(method)
	var err error
	if write == nil {
		err = e.EncodeArrayLen(0)
	} else {
		e.EncodeArrayLen(1)
		err = write(params{e})
	}
	if err == nil && last {
		err = c.bw.Flush()
	}
	if err != nil {
		err = fmt.Errorf("%w: %v", ErrClientClosed, err)
		c.fail(err)
		c.nc.Close()
		return 0, err
	}
	return id, nil
}

// wait waits for p's outcome, reading the connection itself when no other
// caller is (see Client). If ctx ends first, wait returns ctx's error and
// forgets the call (its response, when it comes, is skipped), or, with
// keep, leaves it registered so that the caller can wait for it again. A
// response already being read as ctx ends is waited for: without keep, it
// is dropped, and with keep, its outcome is returned.
func (c *Client) wait(ctx context.Context, id uint32, p *call, keep bool) error {
	c.mu.Lock()
	// A call no longer registered has its response read already (the
	// outcome is in done, or about to be): only wait for it.
	if _, waiting := c.pending[id]; waiting && !c.reading && c.err == nil {
		c.reading = true
		c.mu.Unlock()
		return c.readFor(ctx, id, p, keep)
	}
	c.mu.Unlock()
	select {
	case out, ok := <-p.done:
		if !ok {
			return c.broken()
		}
		if out != errTakeRead {
			return out
		}
		c.mu.Lock()
		c.reader = nil
		c.mu.Unlock()
		return c.readFor(ctx, id, p, keep)
	case <-ctx.Done():
	}
	c.mu.Lock()
	_, waiting := c.pending[id]
	if waiting && !keep {
		delete(c.pending, id)
	}
	if c.reader == p {
		// The read side was handed to p as ctx ended, and its note is
		// in p.done: take it, and hand the read side on.
		<-p.done
		c.passRead(p)
	}
	c.mu.Unlock()
	if !waiting {
		// The reader has taken the call and is decoding into the
		// caller's variables: let it finish before they are read.
		if out, ok := <-p.done; ok && keep {
			return out
		}
	}
	return ctx.Err()
}

// do runs one call: write sends the params, decode reads the result.
func (c *Client) do(ctx context.Context, method string, write func(params) error, decode func(*msgpack.Decoder) error) error {
	p := &call{decode: decode, done: make(chan error, 1)}
	if err := ctx.Err(); err != nil {
		return err // sent nothing
	}
	id, err := c.start(method, write, p)
	if err != nil {
		return err
	}
	return c.wait(ctx, id, p, false)
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
// deadline. If ctx ends first, Acquire returns ctx's error at once, and a
// grant that still arrives later is released, so the lock is not stuck with
// a holder that gave up: a goroutine of the client waits for the answer,
// and Close ends that wait (a grant that comes after Close cannot be
// released through this client; its lease runs out).
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration, o *fencekv.AcquireOptions) (fencekv.Lease, error) {
	var ao fencekv.AcquireOptions
	if o != nil {
		ao = *o
	}
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
		for _, set := range []bool{ao.Holder != "", ao.Wait > 0, ao.LockDelay > 0} {
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
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fencekv.Lease{}, err // sent nothing
	}
	id, err := c.start("acquire", write, p)
	if err != nil {
		return fencekv.Lease{}, err
	}
	err = c.wait(ctx, id, p, true)
	if err != nil && ctx.Err() != nil && err == ctx.Err() {
		// The response still comes (the call stays registered); if it is
		// a grant, nobody will use it: release it. If Close has begun, the
		// call has failed already and there is nothing to wait for.
		c.spawn(func() {
			if c.wait(context.Background(), id, p, false) == nil && token != 0 {
				rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				c.Release(rctx, name, fencekv.Token(token))
			}
		})
		return fencekv.Lease{}, err
	}
	if err != nil {
		return fencekv.Lease{}, err
	}
	return fencekv.Lease{Name: name, Token: fencekv.Token(token), TTL: time.Duration(ttlMs) * time.Millisecond}, nil
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
