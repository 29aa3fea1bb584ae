package wire

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// link is one connection of a Client to one server: the protocol's
// machinery, which the Client replaces by a new link when it breaks.
//
// There is no reader goroutine. A caller waiting for its response reads
// the connection itself, unless another caller already is: that one, the
// reader, completes every response it reads (decoding each into its
// caller's variables) until its own arrives, then hands the reading on to
// a caller still waiting. A lone caller so wakes straight from the socket,
// with no goroutine switch between it and its answer.
type link struct {
	cl   *Client       // whose goroutines the watch counts (see watch)
	nc   net.Conn      // the connection the protocol is spoken on
	rw   io.ReadWriter // how nc is read and written (see streamOf)
	raw  net.Conn      // the TCP connection under it (the same, without TLS): probed when idle
	addr string

	dead atomic.Bool  // err is set: the connection is broken or closed
	used atomic.Int64 // monotonic nanoseconds (see now) when a call last began here

	writers atomic.Int32 // callers waiting for or holding wmu
	wmu     sync.Mutex   // guards enc, next (the write side)
	enc     *encoder     // requests encoded and not yet written (see start)
	batch   []*call      // the calls whose requests are in enc
	next    uint32

	mu      sync.Mutex // guards pending, err, werr, reading, reader
	pending map[uint32]*call
	err     error // why the connection failed: errClosed (Close), or the cause
	werr    error // a write failed: nothing more is sent, and what the server sent before it closed is read (see drain)
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
	closed   bool        // shut has dropped the watch: make no more
}

// call is a request waiting for its response. The reader decodes the
// result straight from the stream with decode (into the caller's
// variables), then sends the outcome on done.
type call struct {
	decode func(*msgpack.Decoder) error // nil: skip the result
	done   chan error                   // buffered; closed if the connection breaks first
	effect bool                         // the method changes state: its outcome is unknown if the connection breaks
	unsent atomic.Bool                  // the write of its request failed before any byte of it left
}

// errTakeRead, sent on a waiting call's done, hands it the read side.
var errTakeRead = errors.New("wire: take over reading")

// errClosed is a link's err once Close has closed it.
var errClosed = ErrClientClosed

// epoch is the origin of now's clock.
var epoch = time.Now()

// now reads the monotonic clock, in nanoseconds since epoch.
func now() int64 { return int64(time.Since(epoch)) }

func newLink(cl *Client, nc, raw net.Conn, addr string) *link {
	if tc, ok := raw.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	rw := streamOf(nc)
	cn := &link{
		cl:      cl,
		nc:      nc,
		rw:      rw,
		raw:     raw,
		addr:    addr,
		enc:     newEncoder(),
		br:      bufio.NewReaderSize(rw, 64<<10),
		pending: make(map[uint32]*call),
	}
	cn.dec = msgpack.NewDecoder(cn.br)
	cn.used.Store(now())
	return cn
}

// probeIdle is how long a connection must have been idle before a call
// checks that the server has not closed it meanwhile (see usable); tests
// change it.
var probeIdle atomic.Int64

func init() { probeIdle.Store(int64(100 * time.Millisecond)) }

// usable reports whether a call may be sent on the connection: it has not
// failed, and, if no call has begun on it for a while, the server has not
// closed it meanwhile (as a restarted server has). Without that check the
// first call after a server restart would be sent into the dead connection
// and fail with an unknown outcome; with it, it goes to a new connection.
// A busy connection is not probed: a call on it finds out soon enough.
func (cn *link) usable() bool {
	if cn.dead.Load() {
		return false
	}
	t := now()
	idle := t - cn.used.Load()
	if idle >= int64(time.Millisecond) {
		cn.used.Store(t) // (not on every call: the word is shared)
	}
	if idle < probeIdle.Load() {
		return true
	}
	return !cn.closedByPeer()
}

// closedByPeer checks, without blocking, whether the server has closed the
// connection or reset it, if no call is using the connection (one that is
// will find out itself), and fails it if so.
func (cn *link) closedByPeer() bool {
	cn.mu.Lock()
	if cn.err != nil {
		cn.mu.Unlock()
		return true
	}
	if cn.reading || len(cn.pending) > 0 {
		cn.mu.Unlock()
		return false
	}
	// Hold the read side while peeking, so that no caller reads meanwhile.
	cn.reading = true
	cn.mu.Unlock()
	gone := peerGone(cn.raw)
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if gone != nil {
		cn.failLocked(gone)
		cn.reading, cn.reader = false, nil
		return true
	}
	cn.passRead(nil)
	return false
}

// shut fails the connection with err (errClosed: by Close) and closes it.
// It is idempotent, and returns the error of the first Close of the
// network connection.
func (cn *link) shut(err error) error {
	cn.fail(err)
	cn.dlmu.Lock()
	cn.closed = true
	if cn.unwatch != nil {
		// Or a long-lived context would keep the connection reachable.
		cn.unwatch()
		cn.unwatch = nil
	}
	cn.dlmu.Unlock()
	return cn.nc.Close()
}

// fail marks the connection broken and fails every pending call.
func (cn *link) fail(err error) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	cn.failLocked(err)
}

func (cn *link) failLocked(err error) {
	if cn.err != nil {
		return
	}
	var fe *fencekv.Error
	if cn.werr != nil && err != errClosed && !errors.As(err, &fe) && !errors.As(err, new(*TLSError)) {
		// The read that ended the drain failed as the write did: the
		// write's error is the cause, unless the server said why.
		err = cn.werr
	}
	cn.err = err
	cn.dead.Store(true)
	for id, p := range cn.pending {
		delete(cn.pending, id)
		close(p.done)
	}
}

// failure is the error of call p (nil: a call not sent) on the failed
// connection: ErrClientClosed after Close, else a *ConnError.
func (cn *link) failure(p *call) error {
	cn.mu.Lock()
	err := cn.err
	cn.mu.Unlock()
	if err == errClosed {
		return ErrClientClosed
	}
	ce := &ConnError{Addr: cn.addr, Err: err}
	if p != nil && p.effect && !p.unsent.Load() && !servedNothing(err) {
		ce.Outcome = fencekv.OutcomeUnknown
	}
	return ce
}

// passRead hands the read side to a call still waiting other than except,
// or gives it up if none is. Called with mu held, by the goroutine that
// holds the read side.
func (cn *link) passRead(except *call) {
	cn.reader = nil
	for _, q := range cn.pending {
		if q != except {
			// q's done is empty: only the holder of the read side (the
			// caller) sends outcomes, and q's has not come.
			cn.reader = q
			q.done <- errTakeRead
			return
		}
	}
	cn.reading = false
}

// errInterrupted is returned by readResponse when ctx ended while it
// waited for a response to begin; the stream is intact.
var errInterrupted = errors.New("wire: wait interrupted")

// readFor holds the read side for call p: it reads responses, completing
// the calls they answer, until p's arrives, then hands the read side on and
// returns p's outcome. If ctx ends while it waits between responses, it
// hands the read side on and returns ctx's error, forgetting p unless keep.
func (cn *link) readFor(ctx context.Context, id uint32, p *call, keep bool) error {
	cn.watch(ctx)
	var err error
	for {
		var q *call
		if q, err = cn.readResponse(ctx); err != nil || q == p {
			break
		}
	}
	switch {
	case err == errInterrupted:
		cn.mu.Lock()
		if !keep {
			delete(cn.pending, id)
		}
		cn.passRead(p)
		cn.mu.Unlock()
		return ctx.Err()
	case err != nil:
		// A refusal the server sent before closing (such as
		// limit_exceeded for too many connections) is the cause; so is
		// a TLS alert (under TLS 1.3 a refused client certificate is
		// learnt at the first read).
		cn.fail(tlsRefusal(err))
		return cn.failure(p)
	}
	cn.mu.Lock()
	cn.passRead(nil)
	cn.mu.Unlock()
	out, ok := <-p.done
	if !ok {
		return cn.failure(p)
	}
	return out
}

// watch arranges for ctx's end to interrupt the reader's wait. Callers
// mostly pass the same context call after call, so the registration is
// kept until a reader brings another: a context that ends while another
// reader waits interrupts it in vain, and that reader waits on.
func (cn *link) watch(ctx context.Context) {
	if ctx == cn.watched {
		return
	}
	cn.dlmu.Lock()
	defer cn.dlmu.Unlock()
	if cn.unwatch != nil {
		cn.unwatch()
		cn.unwatch = nil
	}
	cn.watched = ctx
	if ctx.Done() != nil && !cn.closed {
		// When ctx ends, interrupt runs in a goroutine of its own: Close
		// waits for it as for the client's other goroutines (see spawn).
		// The count is taken now, under dlmu, so before Close waits
		// (Close shuts the connection, under dlmu, before it waits).
		c := cn.cl
		c.bg.Add(1)
		stop := context.AfterFunc(ctx, func() {
			defer c.bg.Done()
			c.running.Add(1)
			defer c.running.Add(-1)
			cn.interrupt()
		})
		cn.unwatch = func() bool {
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
func (cn *link) interrupt() {
	cn.dlmu.Lock()
	defer cn.dlmu.Unlock()
	if cn.idleWait && !cn.dlSet {
		cn.nc.SetReadDeadline(time.Unix(1, 0))
		cn.dlSet = true
	}
}

// awaitResponse waits until the first byte of a response has arrived, or
// ctx ends (errInterrupted), or the connection fails.
func (cn *link) awaitResponse(ctx context.Context) error {
	for cn.br.Buffered() == 0 {
		cn.dlmu.Lock()
		if ctx.Err() != nil {
			cn.dlmu.Unlock()
			return errInterrupted
		}
		cn.idleWait = true
		cn.dlmu.Unlock()
		_, err := cn.br.Peek(1)
		cn.dlmu.Lock()
		cn.idleWait = false
		cut := cn.dlSet
		if cut {
			cn.nc.SetReadDeadline(time.Time{})
			cn.dlSet = false
		}
		cn.dlmu.Unlock()
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
func (cn *link) readResponse(ctx context.Context) (*call, error) {
	if err := cn.awaitResponse(ctx); err != nil {
		return nil, err
	}
	dec := cn.dec
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
			fe := &fencekv.Error{Code: fencekv.Code(code), Message: "server closed the connection: " + msg}
			if fe.Code == fencekv.CodeTLSRequired {
				return nil, &TLSError{Err: fe}
			}
			return nil, connRefusal{fe}
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
	cn.mu.Lock()
	p := cn.pending[id]
	delete(cn.pending, id)
	cn.mu.Unlock()
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

// errNotSent is returned by start when the connection had failed before
// the call was written: nothing was sent, and the call may go on another
// connection.
var errNotSent = errors.New("wire: connection failed before the call was sent")

// start sends [0, id, method, [params]] (params written by write; nil
// write sends an empty params array) and registers p for the response;
// with p nil, it sends the notification [2, method, [params]], which has
// none. A request write cannot encode is not sent: start returns write's
// error and the connection carries on.
func (cn *link) start(method string, write func(params) error, p *call) (uint32, error) {
	cn.writers.Add(1)
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	// The last of the callers queued here writes the requests of all of
	// them, so concurrent calls leave in one write.
	last := cn.writers.Add(-1) == 0
	var id uint32
	e := cn.enc
	mark := e.buf.Len()
	if p == nil {
		e.EncodeArrayLen(3)
		e.EncodeUint(typeNotification)
	} else {
		cn.next++
		id = cn.next
		e.EncodeArrayLen(4)
		e.EncodeUint(typeRequest)
		e.EncodeUint(uint64(id))
	}
	e.EncodeString(method)
	var err error
	if write == nil {
		e.EncodeArrayLen(0)
	} else {
		e.EncodeArrayLen(1)
		err = write(params{e})
	}
	// Registered only once encoded: a registered call may be handed the
	// read side (passRead), and one that is never sent would never take
	// it, leaving the connection unread.
	var broken error
	cn.mu.Lock()
	if broken = cn.err; broken == nil {
		broken = cn.werr
	}
	if broken == nil && err == nil && p != nil {
		cn.pending[id] = p
		cn.batch = append(cn.batch, p)
	}
	cn.mu.Unlock()
	switch {
	case broken != nil:
		e.buf.Reset() // the queued calls were failed with the connection
		if broken == errClosed {
			return 0, ErrClientClosed
		}
		return 0, errNotSent
	case err != nil:
		e.buf.Truncate(mark) // nothing of it has left: take it back
	}
	if last && e.buf.Len() > 0 {
		n, werr := cn.rw.Write(e.buf.Bytes())
		if werr != nil && n <= 0 {
			for _, q := range cn.batch {
				q.unsent.Store(true) // none of its bytes left: it cannot have been applied
			}
		}
		clear(cn.batch)
		cn.batch = cn.batch[:0]
		e.buf.Reset()
		if e.buf.Cap() > maxKeptRequests {
			e.buf = bytes.Buffer{} // after a large value, do not keep its room
		}
		if werr != nil {
			// Part of the requests may have left, and the server may
			// have answered some before it closed the connection (a
			// refusal such as too_large, for a request over its message
			// limit that it stopped reading): those answers are read.
			cn.drain(werr)
			if err == nil && p == nil {
				return 0, cn.failure(p)
			}
		}
	}
	if err != nil {
		return 0, err
	}
	// After a failed write, p's outcome is its answer if the server sent
	// one before it closed, or else the connection's failure: wait says
	// which.
	return id, nil
}

// drainTimeout bounds how long drain reads what the server sent before
// it closed a connection whose write failed.
const drainTimeout = 2 * time.Second

// drain ends a connection whose write failed with werr (the server
// closed or reset it): no more calls are sent on it, and the answers the
// server sent before it closed, still in the socket, are read and
// complete their calls, so that a refusal it sent (too_large, or an
// "error" notification) is what its caller sees, not the reset. Then the
// connection fails, its cause the server's refusal if it sent one, or
// werr, and is closed. If another caller holds the read side, that one
// reads them, and the read that fails (at once: the peer is gone) fails
// the connection. Called with wmu held.
func (cn *link) drain(werr error) {
	cn.mu.Lock()
	if cn.err != nil || cn.werr != nil {
		cn.mu.Unlock()
		return
	}
	cn.werr = werr
	cn.dead.Store(true)
	if cn.reading {
		cn.mu.Unlock()
		return
	}
	cn.reading = true
	cn.mu.Unlock()
	cause := werr
	for {
		cn.nc.SetReadDeadline(time.Now().Add(drainTimeout))
		if _, err := cn.readResponse(context.Background()); err != nil {
			var fe *fencekv.Error
			if err = tlsRefusal(err); errors.As(err, &fe) || errors.As(err, new(*TLSError)) {
				cause = err
			}
			break
		}
	}
	cn.mu.Lock()
	cn.reading, cn.reader = false, nil
	cn.failLocked(cause)
	cn.mu.Unlock()
	cn.nc.Close()
}

// maxKeptRequests is the most room a link keeps for encoding requests
// between writes.
const maxKeptRequests = 64 << 10

// wait waits for p's outcome, reading the connection itself when no other
// caller is (see link). If ctx ends first, wait returns ctx's error and
// forgets the call (its response, when it comes, is skipped), or, with
// keep, leaves it registered so that the caller can wait for it again. A
// response already being read as ctx ends is waited for: without keep, it
// is dropped, and with keep, its outcome is returned.
func (cn *link) wait(ctx context.Context, id uint32, p *call, keep bool) error {
	cn.mu.Lock()
	// A call no longer registered has its response read already (the
	// outcome is in done, or about to be): only wait for it.
	if _, waiting := cn.pending[id]; waiting && !cn.reading && cn.err == nil {
		cn.reading = true
		cn.mu.Unlock()
		return cn.readFor(ctx, id, p, keep)
	}
	cn.mu.Unlock()
	select {
	case out, ok := <-p.done:
		if !ok {
			return cn.failure(p)
		}
		if out != errTakeRead {
			return out
		}
		cn.mu.Lock()
		cn.reader = nil
		cn.mu.Unlock()
		return cn.readFor(ctx, id, p, keep)
	case <-ctx.Done():
	}
	cn.mu.Lock()
	_, waiting := cn.pending[id]
	if waiting && !keep {
		delete(cn.pending, id)
	}
	if cn.reader == p {
		// The read side was handed to p as ctx ended, and its note is
		// in p.done: take it, and hand the read side on.
		<-p.done
		cn.passRead(p)
	}
	cn.mu.Unlock()
	if !waiting {
		// The reader has taken the call and is decoding into the
		// caller's variables: let it finish before they are read.
		if out, ok := <-p.done; ok && keep {
			return out
		}
	}
	return ctx.Err()
}
