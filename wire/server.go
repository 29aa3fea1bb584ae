package wire

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// Engine is what the server serves: a *fencekv.DB, or anything with the
// same methods (a cluster node). Every method is called concurrently from
// many goroutines.
type Engine interface {
	Get(ctx context.Context, key []byte) (fencekv.Entry, error)
	Put(ctx context.Context, key, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error)
	Delete(ctx context.Context, key []byte, w fencekv.WriteOptions) (bool, fencekv.WriteResult, error)
	CAS(ctx context.Context, key []byte, rev fencekv.Revision, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error)
	Incr(ctx context.Context, key []byte, delta int64, w fencekv.WriteOptions) (int64, fencekv.WriteResult, error)
	Scan(ctx context.Context, o fencekv.ScanOptions) ([]fencekv.Entry, bool, error)
	Acquire(ctx context.Context, name string, ttl time.Duration, o *fencekv.AcquireOptions) (fencekv.Lease, error)
	Renew(ctx context.Context, name string, token fencekv.Token) (time.Duration, error)
	Release(ctx context.Context, name string, token fencekv.Token) error
	LockInfo(ctx context.Context, name string) (fencekv.LockInfo, error)
	Locks(ctx context.Context, prefix, start string, limit int) ([]fencekv.LockInfo, bool, error)
	Status(ctx context.Context) (fencekv.Status, error)
}

var _ Engine = (*fencekv.DB)(nil)

// Config holds the server's limits. Start from DefaultConfig.
type Config struct {
	// MaxMessageSize is the largest message accepted, in bytes. A bigger
	// one is answered with too_large (when its msgid can be read) and the
	// connection is closed.
	MaxMessageSize int
	// MaxConns is the most connections served at once; more are sent an
	// error notification and closed.
	MaxConns int
	// MaxInFlight is the most requests one connection may have pending
	// (including blocked acquires); more are refused with limit_exceeded.
	MaxInFlight int
	// MaxPendingBytes is a connection's budget, in bytes, of answers
	// waiting to be written and of the arguments of its writes in flight
	// (a put holds its value until it is applied). While these are over
	// it, the server reads no more requests from the connection
	// (backpressure) until the client has read enough answers or the
	// writes are applied. One answer larger than the budget is still sent:
	// the budget only stops the reading.
	MaxPendingBytes int
	// MaxWatches is the most watches one connection may have at once;
	// more are refused with limit_exceeded (the store also bounds its
	// watchers: fencekv.Options.MaxWatchers).
	MaxWatches int
	// WriteTimeout drops a connection whose peer does not read its
	// responses for this long.
	WriteTimeout time.Duration
	// ReadTimeout drops a connection that has sent the first bytes of a
	// message and not the rest within this long (a half-sent message
	// would otherwise hold the connection, and a slot of MaxConns,
	// forever). An idle connection, between messages, has no deadline.
	// 0 means none.
	ReadTimeout time.Duration
	// Logger receives connection errors and recovered panics; nil discards.
	Logger *slog.Logger
	// Observe, if set, is called once for every request (and
	// notification) served, after its answer is sent: its method as the
	// client named it, the code of its refusal ("" on success) and the
	// time from being read to being answered. It runs on the request
	// path, concurrently: it must be quick (metrics).
	Observe func(method string, code fencekv.Code, d time.Duration)

	// TLS, if set, makes every connection TLS (tls.go): the handshake
	// comes first, and a connection that fails it is closed, logged,
	// and changes nothing. Set ClientAuth and ClientCAs for mutual TLS.
	TLS *tls.Config
	// Auth, if set, requires every connection to authenticate and checks
	// each request against its principal's rights (auth.go).
	Auth Authenticator

	// EventLoop serves plain TCP connections to a *fencekv.DB (an
	// engine with its StartLed, Lead and PassLead) from one
	// event loop (epoll, on Linux) instead of a goroutine per connection:
	// one read brings whatever a client sent, reads are answered by the
	// loop itself, writes are started without a goroutine waiting for
	// them and committed by the loop or a committer (loop_linux.go), and
	// only an acquire that may wait gets a goroutine. It costs the server
	// less CPU per request. TLS connections, other engines (a cluster
	// node) and other systems always get a goroutine per connection.
	EventLoop bool
}

// DefaultConfig returns the documented default limits.
func DefaultConfig() Config {
	return Config{
		MaxMessageSize:  4 << 20,
		MaxConns:        10_000,
		MaxInFlight:     1024,
		MaxPendingBytes: 4 << 20,
		MaxWatches:      64,
		WriteTimeout:    30 * time.Second,
		ReadTimeout:     30 * time.Second,
		EventLoop:       true,
	}
}

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("wire: server closed")

// Server serves the MessagePack-RPC protocol over TCP.
type Server struct {
	eng Engine
	// starts is eng, if it starts writes for the event loop itself (a
	// *fencekv.DB, not a type embedding one: server_start.go).
	starts writeStarter
	cfg    Config
	log    *slog.Logger

	// base is cancelled when shutdown starts: it ends blocked acquires.
	base   context.Context
	cancel context.CancelFunc

	mu        sync.Mutex // guards listeners, conns, closing
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   bool

	connWG sync.WaitGroup // one per connection

	tlsLog, authLog logLimiter // refused handshakes and failed auth calls, logged once per host per burst
	readLog         logLimiter // connections closed by the read timeout, likewise

	refuseMu   sync.Mutex // guards overConns, overLogged
	overConns  int        // connections refused over MaxConns since the last line logged
	overLogged time.Time  // when that line was logged

	jobs         chan job     // to an idle handler goroutine (goHandle)
	idleHandlers atomic.Int32 // handler goroutines waiting on jobs, or about to

	loop       *eventLoop // with Config.EventLoop, once the first connection comes (loop_linux.go)
	loopBroken bool       // the event loop could not start: goroutines serve every connection
}

// NewServer returns a server for eng.
func NewServer(eng Engine, cfg Config) (*Server, error) {
	if cfg.MaxMessageSize <= 0 || cfg.MaxConns <= 0 || cfg.MaxInFlight <= 0 || cfg.MaxPendingBytes <= 0 || cfg.MaxWatches <= 0 || cfg.WriteTimeout <= 0 {
		return nil, errors.New("wire: limits must be positive")
	}
	if cfg.TLS != nil {
		cfg.TLS = cfg.TLS.Clone()
		cfg.TLS.MinVersion = max(cfg.TLS.MinVersion, tls.VersionTLS12) // tls.go
	}
	s := &Server{
		eng:       eng,
		cfg:       cfg,
		log:       cfg.Logger,
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
		jobs:      make(chan job),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if ws, ok := eng.(writeStarter); ok && isDirect(ws, eng) {
		s.starts = ws
	}
	s.base, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Serve accepts connections on ln until Shutdown. It returns
// ErrServerClosed after Shutdown, or the listener's error.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()
	// spare is a descriptor kept open for one purpose: when the process
	// runs out of descriptors, closing it lets Accept take the next
	// connection, so that the client is told why instead of waiting
	// unanswered in the listen queue.
	spare := openSpare()
	defer func() {
		if spare != nil {
			spare.Close()
		}
	}()
	var backoff time.Duration
	out := false // out of descriptors since the last accept that was served
	refused := 0 // connections refused since then
	served := func(nc net.Conn) {
		if out {
			s.log.Info("file descriptors available again", "refused_connections", refused)
			out, refused = false, 0
		}
		s.accept(nc)
	}
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			if outOfDescriptors(err) {
				if !out {
					// Once per burst, not per connection.
					s.log.Warn("out of file descriptors: refusing new connections with limit_exceeded until some close", "err", err)
					out = true
				}
				if spare == nil {
					spare = openSpare()
				}
				if spare != nil {
					// Trade the spare for the waiting connection.
					spare.Close()
					nc, err = ln.Accept()
					spare = openSpare()
					switch {
					case err != nil:
						continue // handled above, next time round
					case spare == nil:
						// Still out: tell the client why, and take the
						// descriptor back for the spare.
						s.refuse(nc, "the server is out of file descriptors; try again later")
						spare = openSpare()
						refused++
						continue
					default:
						// Descriptors came free meanwhile: serve it.
						served(nc)
						continue
					}
				}
			}
			// No spare to trade, or another failure: back off, keep serving.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			if !out {
				s.log.Warn("accept failed; retrying", "err", err, "in", backoff)
			}
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if spare == nil {
			spare = openSpare()
		}
		served(nc)
	}
}

// openSpare opens the reserve descriptor; nil if the process is out of
// them too.
func openSpare() *os.File {
	f, err := os.Open(os.DevNull)
	if err != nil {
		return nil
	}
	return f
}

// outOfDescriptors reports an accept that failed for want of a file
// descriptor, in the process (EMFILE) or the system (ENFILE).
func outOfDescriptors(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

func (s *Server) accept(nc net.Conn) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if len(s.conns) >= s.cfg.MaxConns {
		s.mu.Unlock() // the refusal writes: not under mu (refusedConn is the accept loop's)
		if s.cfg.TLS != nil {
			nc.Close() // no handshake for a connection that will not be served
			s.refusedConn(time.Now())
			return
		}
		s.refuse(nc, fmt.Sprintf("too many connections (limit %d)", s.cfg.MaxConns))
		s.refusedConn(time.Now())
		return
	}
	s.refuseMu.Lock()
	if s.overConns > 0 {
		s.log.Info("accepting connections again", "max_conns", s.cfg.MaxConns, "refused_since_last_log", s.overConns)
		s.overConns, s.overLogged = 0, time.Time{}
	}
	s.refuseMu.Unlock()
	c := newConn(s, nc)
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	if s.looped(c) { // loop_linux.go: the event loop serves it
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	go c.serve()
}

// refusedConn counts a connection refused over MaxConns and logs the
// refusals at most once a second, with how many there were since the last
// line. Only the accept loop calls it (and accept, which it calls).
func (s *Server) refusedConn(now time.Time) {
	s.refuseMu.Lock()
	defer s.refuseMu.Unlock()
	s.overConns++
	if now.Sub(s.overLogged) < time.Second {
		return
	}
	s.log.Warn("refusing connections over --max-conns with limit_exceeded", "max_conns", s.cfg.MaxConns, "refused", s.overConns)
	s.overConns, s.overLogged = 0, now
}

// refuse tells a connection over a limit (of connections, or of file
// descriptors) why it is closed, with a notification
// ["error", [{code, message}]], then closes it.
func (s *Server) refuse(nc net.Conn, msg string) {
	e := newEncoder()
	e.EncodeArrayLen(3)
	e.EncodeUint(typeNotification)
	e.EncodeString("error")
	e.EncodeArrayLen(1)
	e.errorMap(&fencekv.Error{Code: fencekv.CodeLimitExceeded, Message: msg})
	nc.SetWriteDeadline(time.Now().Add(time.Second))
	nc.Write(e.buf.Bytes())
	nc.Close()
}

// Shutdown stops accepting, stops reading new requests, ends blocked
// acquires (they are answered unavailable), and waits for in-flight requests
// to be answered. If ctx ends first, it closes the remaining connections and
// returns ctx's error. It does not close the engine.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.stopReading()
	}
	var loopDone <-chan struct{}
	if s.loop != nil {
		s.loop.close()
		loopDone = s.loop.done()
	}
	s.mu.Unlock()
	s.cancel()
	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		if loopDone != nil {
			<-loopDone // it ends once its last connection is removed
		}
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.Close()
		<-done
		return ctx.Err()
	}
}

// Close closes the listeners and every connection at once. In-flight
// requests still run to completion in the engine; their answers are lost.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.nc.Close()
	}
	if s.loop != nil {
		s.loop.close()
	}
	s.mu.Unlock()
	s.cancel()
	return nil
}

// Conns is the number of open connections.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}

// conn is one client connection: a read loop that parses frames, serves
// reads itself and starts a handler goroutine per other request.
//
// Answers are written by one goroutine at a time, the flusher: whichever
// has an answer when nobody is writing. Answers that are ready while it
// writes are queued for it, so no goroutine waits on a slow client, and a
// burst of answers leaves in one write. The memory held by the queued
// answers and the ones being written, and by the arguments of the requests
// in flight (but acquires), is counted in pending; while that is over the
// budget (Config.MaxPendingBytes) the read loop reads no further request.
// pending only falls under wmu, and wake is called then, so the read loop,
// which checks it under wmu before it waits, misses no wake-up.
type conn struct {
	s  *Server
	nc net.Conn
	// rw is how a connection served by a goroutine is read and written
	// (see streamOf); set before its read loop starts.
	rw io.ReadWriter
	// waits is cancelled when the connection stops reading (it closed, or
	// the server is shutting down): it ends the connection's blocked
	// acquires. Other requests are not cancelled: once read, they are
	// applied and answered.
	waits  context.Context
	base   context.Context // every other request's context: the client's address
	reads  context.Context // base, for the reads the event loop serves itself: they must not wait for a commit
	cancel context.CancelFunc
	ws     watches // the connection's watchers (watch.go)

	sess *session // with Config.Auth: who the connection is (auth.go)

	// forwarded: the connection is a cluster node's forwarder's (method
	// forwarding): the requests read after it say so (Forwarded). Read
	// and set by the connection's reader only (serveRequest).
	forwarded bool

	slots    chan struct{} // one per in-flight request
	handlers sync.WaitGroup

	// The flusher alone uses vec and out, outside wmu.
	vec [][]byte    // its write vector, reused
	out net.Buffers // vec as WriteTo consumes it

	wmu      sync.Mutex   // guards the fields below
	queue    []*encoder   // answers waiting for the flusher
	batch    []*encoder   // the flusher's spare batch slice, reused
	flushing bool         // a flusher is at work and will drain queue
	broken   bool         // a write failed: the connection is being torn down
	stopping bool         // the read loop was told to stop (shutdown)
	waiting  bool         // the read loop waits on room
	room     sync.Cond    // wakes the read loop: room in the budget, or it must stop
	pending  atomic.Int64 // cost of the answers queued or being written and of the requests in flight

	bk connBackup // the backup this connection reads, if any (backup.go)

	// An event loop connection's (loop_linux.go): raw is its socket (and
	// nc), read by the loop, which holds rmu while it serves the
	// connection; in is the bytes read and not yet served (a message cut
	// by the end of a read, or messages held back by the budget); ended
	// is set, under rmu, once the loop reads no more.
	raw    *rawConn
	rmu    sync.Mutex
	in     []byte
	scan   frameScan // how far the loop framed the message at the start of in
	ended  bool
	paused atomic.Bool // the loop reads c no more until wake resumes it (set and cleared under wmu)
	// partial is the read timeout of the message c.in ends with, begun
	// and not whole (loop_linux.go: armPartial); partialGen tells a
	// timer stopped too late that it is stale. Under rmu.
	partial    *time.Timer
	partialGen uint64

	args args // the request being parsed: dispatch's (its caller's goroutine)
}

// forwardedKey marks the context of a request a cluster node forwarded.
type forwardedKey struct{}

// Forwarded reports whether the request whose context ctx is was
// forwarded by another cluster node (on a connection that called
// forwarding: see Client.Forwarding). A node that does not lead must not
// forward it again.
func Forwarded(ctx context.Context) bool {
	v, _ := ctx.Value(forwardedKey{}).(bool)
	return v
}

func newConn(s *Server, nc net.Conn) *conn {
	if s.cfg.TLS != nil {
		nc = tls.Server(nc, s.cfg.TLS) // the handshake comes first in serve
	}
	c := &conn{
		s:     s,
		nc:    nc,
		slots: make(chan struct{}, s.cfg.MaxInFlight),
	}
	if s.cfg.Auth != nil {
		c.sess = &session{}
	}
	c.room.L = &c.wmu
	// Every request's context carries the client's address (for the
	// refusal log) and the logger (for the lock methods' audit trail);
	// made once per connection.
	c.base = withAudit(fencekv.WithClient(context.Background(), nc.RemoteAddr().String()), s.log)
	c.waits, c.cancel = context.WithCancel(withAudit(fencekv.WithClient(s.base, nc.RemoteAddr().String()), s.log))
	return c
}

// stopReading makes the read loop end at its next read, or now if it waits
// for room. Called with s.mu held.
func (c *conn) stopReading() {
	if c.raw != nil {
		c.s.loop.stop(c) // loop_linux.go
		return
	}
	c.wmu.Lock()
	c.stopping = true // under wmu, so that a message's read deadline set after this does not undo it (setReadDeadline)
	c.nc.SetReadDeadline(time.Now())
	c.room.Signal()
	c.wmu.Unlock()
}

func (c *conn) isStopping() bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.stopping
}

// setReadDeadline sets the connection's read deadline for the message
// being read (msgDeadline), unless the read loop is being stopped, whose
// deadline (now) stays. It reports whether it set it.
func (c *conn) setReadDeadline(t time.Time) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.stopping {
		return false
	}
	c.nc.SetReadDeadline(t)
	return true
}

// msgDeadline is the goroutine read loop's stream: a read that must wait
// for more of a message whose first byte has arrived gets the read
// timeout, counted from then; the wait for the next message has none.
type msgDeadline struct {
	r     io.Reader
	c     *conn
	fr    *frameReader
	armed bool // the deadline is set: clear it once the message is read
}

func (d *msgDeadline) Read(b []byte) (int, error) {
	if d.fr.inMsg && !d.armed && d.c.s.cfg.ReadTimeout > 0 {
		d.armed = d.c.setReadDeadline(time.Now().Add(d.c.s.cfg.ReadTimeout))
	}
	return d.r.Read(b)
}

// done clears the deadline of the message just read, if it had one.
func (d *msgDeadline) done() {
	if d.armed {
		d.c.setReadDeadline(time.Time{})
		d.armed = false
	}
}

// readTimedOut logs a connection closed for a message left incomplete
// past the read timeout, once per remote host per burst.
func (c *conn) readTimedOut() {
	if ok, suppressed := c.s.readLog.allow(remoteHost(c.nc.RemoteAddr()), time.Now()); ok {
		c.s.log.Info("closing a connection whose message stayed incomplete past the read timeout",
			"remote", c.nc.RemoteAddr().String(), "read_timeout", c.s.cfg.ReadTimeout, "earlier_not_logged", suppressed)
	}
}

var encoderPool = sync.Pool{New: func() any { return newEncoder() }}

// maxPooledEncoder is the largest encoder buffer kept for reuse: a large
// answer's buffer goes back to the garbage collector.
const maxPooledEncoder = 64 << 10

func putEncoder(e *encoder) {
	if e.buf.Cap() <= maxPooledEncoder {
		encoderPool.Put(e)
	}
}

func (c *conn) serve() {
	if !c.handshake() { // tls.go
		c.cancel()
		c.nc.Close()
		c.s.forget(c)
		return
	}
	c.rw = streamOf(c.nc)
	c.readLoop()
	c.end()
}

// end ends a connection once it reads no more requests: it ends the
// connection's blocked acquires now (their callers are gone, or the
// server is shutting down), so that no grant goes to a waiter nobody will
// release; waits for the other requests in flight, whose answers are
// written and flushed; then closes the connection.
func (c *conn) end() {
	defer c.s.forget(c)
	c.cancel()
	c.handlers.Wait()
	c.closeWatches()
	c.bk.release()
	if c.raw != nil {
		c.releaseRaw() // loop_linux.go
		return
	}
	c.nc.Close()
}

func (c *conn) readLoop() {
	md := &msgDeadline{r: c.rw, c: c}
	fr := newFrameReader(md, c.s.cfg.MaxMessageSize)
	md.fr = fr
	dec := msgpack.NewDecoder(nil)
	last := 0 // the size of the previous message
	for {
		if !c.waitRoom() {
			return
		}
		if last > frameKeep {
			// The decoder keeps a buffer as large as the longest string
			// it decoded or skipped: do not keep one sized by a large
			// message.
			dec = msgpack.NewDecoder(nil)
		}
		frame, err := fr.next()
		md.done()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && md.c.s.cfg.ReadTimeout > 0 && !c.isStopping() {
				c.readTimedOut()
			}
			c.frameError(dec, frame, err)
			return
		}
		last = len(frame)
		// Serve a request here, without a goroutine or an in-flight slot,
		// when that holds up nothing: reads (microseconds to a
		// millisecond), and writes when the client has sent nothing more
		// yet (a client waiting for this answer; a pipelining client gets
		// its writes served concurrently, so they share commits), unless
		// the connection is another node's forwarding link
		// (serveRequest). Never an acquire that may wait for the lock.
		var now time.Time
		if c.s.cfg.Observe != nil {
			now = time.Now()
		}
		if !c.dispatch(dec, frame, fr.idle(), now) {
			return
		}
	}
}

// dispatch parses one message and serves it, or starts a handler for it.
// now is when it was read (with Config.Observe). idle allows serving a
// write on the calling goroutine (it may wait for a commit): the
// goroutine read loop passes it when the client has sent nothing more;
// the event loop never does. Reads, whose answers can be
// large (a scan page, a value), are always served by the caller, as
// requests or notifications: so one at a time per connection, each after
// the budget check, and a client that does not read its answers holds at
// most the budget and one such answer, plus the small answers of the
// requests in flight. dispatch returns false when the connection must be
// closed (a message too malformed to answer).
func (c *conn) dispatch(dec *msgpack.Decoder, frame []byte, idle bool, now time.Time) bool {
	m, hasID, err := parseMessage(dec, frame)
	m.began = now
	if err != nil {
		if !hasID {
			c.s.log.Debug("closing connection after malformed message", "remote", c.nc.RemoteAddr(), "err", err)
			return false
		}
		c.reply(m.msgid, nil, asError(err))
		return true
	}
	// The args own their bytes: the frame buffer can be reused. The
	// struct is the connection's, reused for each request (it escapes,
	// through the method calls, and was a 384-byte allocation for each):
	// a request served here is done with it when handle returns, and one
	// started or handed to a handler takes a copy.
	a := &c.args
	*a = args{}
	if err := parseArgs(dec, m.params, a); err != nil {
		if m.typ == typeRequest {
			c.reply(m.msgid, nil, asError(err))
		}
		c.observe(m.method, fencekv.CodeBadRequest)
		return true
	}
	c.serveRequest(m, a, idle)
	return true
}

// serveRequest serves the parsed message m with arguments a, as dispatch
// says. a's byte arguments may be borrowed from the frame (fastFrame): a
// read served here is done with them when serveRequest returns, and a
// request that outlives it makes them its own first.
func (c *conn) serveRequest(m message, a *args, idle bool) {
	if m.method == "forwarding" {
		// Marked here, in the order the connection's messages are read,
		// so that every request read after it is marked, and none read
		// before it, however the requests are then served.
		c.forwarded = true
	}
	m.forwarded = c.forwarded
	// Not a forwarded write: another node's link carries many clients'
	// requests, and one that arrives while this one waits for its commit
	// would wait unread behind it, missing the next raft batch.
	idle = idle && !c.forwarded
	if m.info != nil && m.info.readOnly || idle && m.typ == typeRequest && !(m.method == "acquire" && a.waitMs > 0) {
		c.handlers.Add(1)
		m.inline = c.raw != nil
		c.handle(m, a)
		return
	}
	a.own()
	select {
	case c.slots <- struct{}{}:
		m.slot = true
	default:
		if m.typ == typeRequest {
			c.reply(m.msgid, nil, &fencekv.Error{Code: fencekv.CodeLimitExceeded,
				Message: fmt.Sprintf("too many requests in flight on this connection (limit %d)", c.s.cfg.MaxInFlight)})
		}
		c.observe(m.method, fencekv.CodeLimitExceeded)
		return
	}
	m.params = nil // parsed into a; the frame buffer is reused
	// A request in flight holds its arguments (a put's value) until
	// it is applied: they count against the budget like unsent
	// answers, until its answer replaces them. Not an acquire's,
	// which are small and may wait for a release that this
	// connection has yet to send.
	if m.method != "acquire" {
		m.held = a.size()
		c.pending.Add(m.held)
	}
	c.handlers.Add(1)
	if st := c.starterFor(&m, a); st != nil {
		c.start(st, m, a) // server_start.go: no goroutine waits for the commit
		return
	}
	if c.raw != nil {
		c.s.loop.handed() // loop_linux.go
	}
	c.s.goHandle(c, m, a)
}

// job is a request for a handler goroutine.
type job struct {
	c *conn
	m message
	a args
}

// maxIdleHandlers is the most handler goroutines kept waiting for work.
const maxIdleHandlers = 256

// goHandle serves a request on a handler goroutine: an idle one, or a new
// one. Handlers outlive their request and wait for the next, because a
// new goroutine's stack starts small and the request path grows it (the
// copies were an eighth of the server's CPU under 64 writing clients); a
// burst leaves at most maxIdleHandlers of them waiting, until shutdown.
func (s *Server) goHandle(c *conn, m message, a *args) {
	select {
	case s.jobs <- job{c, m, *a}:
	default:
		go s.handler(job{c, m, *a})
	}
}

func (s *Server) handler(j job) {
	for {
		j.c.handle(j.m, &j.a)
		j = job{}
		if s.idleHandlers.Add(1) > maxIdleHandlers {
			s.idleHandlers.Add(-1)
			return
		}
		select {
		case j = <-s.jobs:
			s.idleHandlers.Add(-1)
		case <-s.base.Done():
			s.idleHandlers.Add(-1)
			return
		}
	}
}

// frameError answers a message that could not be framed, if its msgid can
// be read from the prefix that was.
func (c *conn) frameError(dec *msgpack.Decoder, prefix []byte, err error) {
	var fe *fencekv.Error
	switch {
	case errors.Is(err, errFrameTooLarge):
		fe = &fencekv.Error{Code: fencekv.CodeTooLarge, Message: fmt.Sprintf("message is over the limit of %d bytes", c.s.cfg.MaxMessageSize)}
	case errors.Is(err, errFrameDepth):
		fe = badRequest("message nests arrays and maps more than %d deep", maxDepth)
	default:
		return // EOF, a closed connection, or bytes that are not msgpack
	}
	dec.Reset(bytes.NewReader(prefix))
	if n, err := dec.DecodeArrayLen(); err != nil || n != 4 {
		return
	}
	if t, err := decodeInt(dec); err != nil || t != typeRequest {
		return
	}
	if id, err := decodeUint(dec); err == nil && id <= 1<<32-1 {
		c.reply(uint32(id), nil, fe)
	}
}

func (c *conn) handle(m message, a *args) {
	var code fencekv.Code // of the refusal, for Observe
	defer func() {
		if p := recover(); p != nil {
			c.s.log.Error("panic serving request; recovered", "method", m.method, "panic", p, "stack", string(debug.Stack()))
			// send was not reached (it cannot panic), so the slot, if any,
			// is still held: finish frees it and answers a request.
			e := encoderPool.Get().(*encoder)
			e.response(m.msgid)
			code = fencekv.CodeInternal
			c.finish(m, e, &fencekv.Error{Code: code, Message: fmt.Sprintf("internal error serving %s", m.method)})
		}
		if c.s.cfg.Observe != nil {
			c.s.cfg.Observe(m.method, code, time.Since(m.began))
		}
		c.handlers.Done()
	}()
	e := encoderPool.Get().(*encoder)
	e.response(m.msgid)
	ok := m.info != nil && (m.info.call != nil || m.info.conn != nil)
	watching := m.method == "watch" || m.method == "unwatch" // methods of the connection itself (watch.go)
	if !ok && !watching {
		code = fencekv.CodeUnknownMethod
		c.finish(m, e, &fencekv.Error{Code: code, Message: fmt.Sprintf("unknown method %.64q", m.method)})
		return
	}
	// The result is written after the nil error slot; on a refusal the
	// response is rewritten with the error and a nil result.
	e.EncodeNil()
	ctx := c.base
	if m.method == "acquire" {
		ctx = c.waits
	}
	if c.raw != nil && m.info != nil && m.info.readOnly {
		// Served by the event loop itself, which may lead the batch of
		// this round's writes.
		ctx = c.reads
	}
	if m.forwarded {
		ctx = context.WithValue(ctx, forwardedKey{}, true)
	}
	ctx, ferr := c.authorize(ctx, m.method, a) // auth.go
	if ferr != nil {
		e.response(m.msgid)
		code = ferr.Code
		c.finish(m, e, ferr)
		return
	}
	if watching {
		var start func()
		var err error
		if m.method == "watch" {
			start, err = c.watch(a, e)
		} else {
			err = c.unwatch(a, e)
		}
		if err != nil {
			e.response(m.msgid)
			fe := asError(err)
			code = fe.Code
			c.finish(m, e, fe)
			return
		}
		c.send(m, e)
		if start != nil {
			start() // after the answer is queued: the client reads the id first
		}
		return
	}
	if err := m.info.serve(c, ctx, a, e); err != nil {
		e.response(m.msgid)
		fe := asError(shutdownError(ctx, err))
		code = fe.Code
		c.finish(m, e, fe)
		return
	}
	c.send(m, e)
}

// observe reports a request refused by the read loop, before it was
// served, to Config.Observe.
func (c *conn) observe(method string, code fencekv.Code) {
	if c.s.cfg.Observe != nil {
		c.s.cfg.Observe(method, code, 0)
	}
}

// shutdownError reports a blocked acquire cut short by shutdown or a closed
// connection as unavailable rather than a context error.
func shutdownError(ctx context.Context, err error) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "the server is shutting down or the connection closed"}
	}
	return err
}

// finish completes e, started with response(msgid), as an error response.
func (c *conn) finish(m message, e *encoder, err *fencekv.Error) {
	e.errorMap(err)
	e.EncodeNil()
	c.send(m, e)
}

// send writes the response of a request and frees its in-flight slot.
// Every path through handle ends here exactly once.
func (c *conn) send(m message, e *encoder) {
	if m.typ != typeRequest {
		putEncoder(e)
		if m.held == 0 {
			if m.slot {
				<-c.slots
			}
			return
		}
		c.wmu.Lock()
		if m.slot {
			<-c.slots
		}
		c.pending.Add(-m.held)
		c.wake()
		c.wmu.Unlock()
		return
	}
	c.write(e, m.slot, m.held, m.inline)
}

// reply sends an error response from the read loop (which holds no slot).
func (c *conn) reply(msgid uint32, _ any, err *fencekv.Error) {
	e := encoderPool.Get().(*encoder)
	e.response(msgid)
	e.errorMap(err)
	e.EncodeNil()
	c.write(e, false, 0, false)
}

// write sends an answer: it queues it if a flusher is at work, or becomes
// the flusher. The slot is freed first, under wmu: a client that sends its
// next request as soon as it has an answer must find the slot free. A
// handler never waits for a slow client here unless it is the flusher, so
// handlers do not pile up behind one; what piles up is the queue, which
// the budget bounds.
func (c *conn) write(e *encoder, slot bool, held int64, later bool) {
	c.wmu.Lock()
	if slot {
		<-c.slots
	}
	if c.broken {
		c.pending.Add(-held)
		c.wake()
		c.wmu.Unlock()
		putEncoder(e)
		return
	}
	// The answer takes the place of the request's arguments.
	c.pending.Add(cost(e) - held)
	if c.flushing {
		c.queue = append(c.queue, e)
		if held > 0 {
			c.wake()
		}
		c.wmu.Unlock()
		return
	}
	c.flushing = true
	if later {
		c.queue = append(c.queue, e)
		if held > 0 {
			c.wake()
		}
		c.wmu.Unlock()
		c.s.loop.later(c)
		return
	}
	batch := append(c.batch[:0], e)
	c.batch = nil
	if held > 0 {
		c.wake()
	}
	c.wmu.Unlock()
	c.flush(batch)
}

// buffersWriter is a stream that writes several buffers in one system
// call (rawStream), as net.Buffers.WriteTo does on a *net.TCPConn.
type buffersWriter interface {
	writeBuffers(*net.Buffers) (int64, error)
}

// flush writes batch, then whatever was queued meanwhile, until the queue
// is empty; then it gives up the flusher's role. Only the flusher touches
// vec and out. Each write to the socket gets the write timeout: a client that
// reads nothing for that long fails it, and the connection is torn down.
// An event loop connection writes without waiting (flushRaw).
func (c *conn) flush(batch []*encoder) {
	if c.raw != nil {
		c.flushRaw(batch, 0, false) // loop_linux.go
		return
	}
	for batch != nil {
		c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
		var err error
		if len(batch) == 1 {
			_, err = c.rw.Write(batch[0].buf.Bytes())
		} else {
			vec := c.vec[:0]
			for _, e := range batch {
				vec = append(vec, e.buf.Bytes())
			}
			c.vec, c.out = vec, vec
			if bw, ok := c.rw.(buffersWriter); ok {
				_, err = bw.writeBuffers(&c.out) // one writev for the whole batch
			} else {
				_, err = c.out.WriteTo(c.rw)
			}
			clear(vec)
		}
		batch = c.flushed(batch, err)
	}
}

// flushed ends the write of batch (err is its error): it frees the
// answers, and returns the answers queued meanwhile, to be written next,
// or nil if there are none and the flusher's role is given up.
func (c *conn) flushed(batch []*encoder, err error) []*encoder {
	var n int64
	for i, e := range batch {
		n += cost(e)
		putEncoder(e)
		batch[i] = nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.pending.Add(-n)
	if err != nil {
		c.fail()
	}
	if c.broken || len(c.queue) == 0 {
		c.flushing = false
		// Keep the slices a usual burst needs, not those a long
		// queue grew.
		if cap(batch) <= keepQueue {
			c.batch = batch[:0]
		}
		if cap(c.queue) > keepQueue {
			c.queue = nil
		}
		if cap(c.vec) > keepQueue {
			c.vec, c.out = nil, nil
		}
		c.wake()
		if c.raw != nil {
			c.room.Broadcast() // releaseRaw may wait for the flusher to finish
		}
		return nil
	}
	batch, c.queue = c.queue, batch[:0]
	c.wake()
	return batch
}

// entryOverhead is what a queued answer costs besides its bytes (the
// encoder holding it, its places in the queue and the write vector), and
// what a request in flight costs besides its arguments' bytes.
const entryOverhead = 256

// keepQueue is the most queue entries a connection keeps room for between
// bursts.
const keepQueue = 1024

// cost is what an answer counts against the connection's budget while it
// waits to be written: the memory it holds.
func cost(e *encoder) int64 { return int64(e.buf.Cap() + entryOverhead) }

// fail tears the connection down after a failed write: the peer is gone or
// does not read. The queued answers are dropped, and the read loop stops
// too. Called with wmu held.
func (c *conn) fail() {
	c.broken = true
	for i, e := range c.queue {
		c.pending.Add(-cost(e))
		putEncoder(e)
		c.queue[i] = nil
	}
	c.queue = c.queue[:0]
	c.nc.Close()
	c.cancel()
}

// wake lets the read loop go on if it waits and there is room now, or if
// it must stop. Called with wmu held.
func (c *conn) wake() {
	if c.waiting && (c.broken || c.pending.Load() <= int64(c.s.cfg.MaxPendingBytes)) {
		if c.raw != nil {
			c.waiting = false
			c.s.loop.resume(c) // loop_linux.go
			return
		}
		c.room.Signal()
	}
}

// waitRoom blocks the read loop while the connection's unsent answers are
// over the budget. It returns false if the connection is being torn down
// or the server is shutting down: the read loop must stop.
func (c *conn) waitRoom() bool {
	budget := int64(c.s.cfg.MaxPendingBytes)
	if c.pending.Load() <= budget {
		return true
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for c.pending.Load() > budget && !c.broken && !c.stopping {
		c.waiting = true
		c.room.Wait()
	}
	c.waiting = false
	return !c.broken && !c.stopping
}
