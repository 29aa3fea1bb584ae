//go:build linux

package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/vmihailenco/msgpack/v5"
)

// The event loop. A goroutine per connection costs, per request, a read
// that finds nothing (Go reads again after every answer, and only a read
// that would block parks the goroutine in the runtime's poller), the park
// and the wake-up, and the scheduler's work between them; with a client
// that sends one request at a time, that is a third of the server's CPU
// per get. So plain TCP connections to a local engine are served the way
// Redis serves them: one goroutine waits on an epoll instance for every
// such connection, reads what a client sent when epoll says it arrived
// (one read, into a buffer shared by all connections), frames the
// messages in it and serves them: reads itself, at once, as the goroutine
// read loop does, their answers written at the end of the round (one
// write per connection, as Redis writes its replies before it waits
// again: 3-5% less of the server's CPU per get at 16 and 64 clients than
// a write per answer as it is served, and 2-5% less of the client's);
// writes are started (start.go, DB.StartLed), so they
// share commits and no goroutine waits for one, and committed at the end
// of the round, by the loop itself when the round served only writes (as
// Redis does) or else by a committer goroutine, which answers them (see
// commit); an acquire that may wait gets a handler goroutine.
// Answers are written without waiting: when a client's socket buffer is
// full, a goroutine finishes the write once epoll says there is room, so
// neither the loop nor a committer waits on a client.
//
// The socket is a duplicate of the accepted connection's descriptor, which
// is then closed: the runtime's own poller forgets it, and no goroutine is
// woken for its events. The descriptor is registered edge-triggered, for
// reading and writing, until the connection is released.
//
// Lifetime: the loop reads a connection until it ends (end of stream, a
// read error, a message too malformed to answer, a failed write, or
// Shutdown), then conn.end runs as for a goroutine connection. The
// descriptor is closed only in releaseRaw, after the handlers, the watch
// senders and the flusher are done and the loop has forgotten it, so no
// one ever uses a closed (and perhaps reused) descriptor number; before
// that, rawConn.Close only shuts the socket down.

// epollET is EPOLLET as the event mask's bit (syscall's constant is a
// negative int).
const epollET = 1 << 31

// loopReadSize is the loop's read buffer, shared by its connections: one
// read takes up to this much of what a client sent.
const loopReadSize = 64 << 10

// loopYields is how often the loop looks again, finding no event, before
// it blocks until one comes.
const loopYields = 2

// maxIovecs is the most buffers one writev is given (IOV_MAX).
const maxIovecs = 1024

// errWouldBlock is returned by rawConn.writeBatch, told not to wait, when
// the socket's send buffer is full.
var errWouldBlock = errors.New("write would block")

// eventLoop is one epoll instance and the goroutine that waits on it.
type eventLoop struct {
	s    *Server
	epfd int
	wake [2]int // a non-blocking pipe: a byte in it wakes the loop

	mu      sync.Mutex
	conns   []*conn       // registered connections, indexed by descriptor (nil: none)
	nconns  int           // how many conns holds
	resumed []*conn       // connections to read again: their budget has room (wake)
	woken   bool          // a byte is in the pipe, unread
	quit    bool          // the server is closing: end once no connection is left
	ended   chan struct{} // closed when run returns (Shutdown waits for it)
	dead    bool          // the loop failed: it takes no connection

	// The loop goroutine's alone.
	buf    []byte
	dec    *msgpack.Decoder
	now    time.Time // when the round began, with Config.Observe: when its requests were read
	served int       // requests served or started this round
	starts int       // of them, writes started
	gone   int       // of them, handed to a handler goroutine
	yield  bool      // the last round started writes or handed requests on: let them run before waiting
	leads  bool      // a write started this round made the loop the leader (DB.StartLed)
	flush  []*conn   // connections whose answers of this round are to be written at its end
}

// looped hands c to the event loop if it is one the loop serves (plain
// TCP to an engine that starts writes (writeStarter), with Config.EventLoop), starting the loop with the
// first. It returns false if c must be served by a goroutine. Called with
// s.mu held.
func (s *Server) looped(c *conn) bool {
	if !s.cfg.EventLoop || s.cfg.TLS != nil || s.loopBroken {
		return false
	}
	if s.starts == nil {
		return false
	}
	tc, ok := c.nc.(*net.TCPConn)
	if !ok {
		return false
	}
	if s.loop == nil {
		l, err := newEventLoop(s)
		if err != nil {
			s.log.Warn("no event loop: serving each connection from a goroutine", "err", err)
			s.loopBroken = true
			return false
		}
		s.loop = l
		go l.run()
	}
	raw, err := newRawConn(tc)
	if err != nil {
		// Out of descriptors, most likely: a goroutine serves it.
		s.log.Debug("event loop: cannot take the connection; serving it from a goroutine", "remote", tc.RemoteAddr(), "err", err)
		return false
	}
	c.raw, c.nc = raw, raw
	c.reads = fencekv.WithoutCommitWait(c.base)
	if err := s.loop.add(c); err != nil {
		s.log.Warn("event loop: cannot register a connection; closing it", "remote", raw.remote, "err", err)
		c.ended = true
		go c.end()
	}
	return true
}

func newEventLoop(s *Server) (*eventLoop, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	l := &eventLoop{s: s, epfd: epfd, buf: make([]byte, loopReadSize), dec: msgpack.NewDecoder(nil), ended: make(chan struct{})}
	if err := syscall.Pipe2(l.wake[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		syscall.Close(epfd)
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(l.wake[0])}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, l.wake[0], &ev); err != nil {
		l.closeFDs()
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	return l, nil
}

func (l *eventLoop) closeFDs() {
	syscall.Close(l.epfd)
	syscall.Close(l.wake[0])
	syscall.Close(l.wake[1])
}

// add registers c's socket.
func (l *eventLoop) add(c *conn) error {
	fd := c.raw.fd
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLOUT | syscall.EPOLLRDHUP | epollET, Fd: int32(fd)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return errors.New("the event loop failed")
	}
	if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return err
	}
	if fd >= len(l.conns) {
		l.conns = append(l.conns, make([]*conn, fd+1-len(l.conns))...)
	}
	l.conns[fd] = c
	l.nconns++
	return nil
}

// remove forgets c and unregisters its socket, before it is closed.
func (l *eventLoop) remove(c *conn) {
	fd := c.raw.fd
	l.mu.Lock()
	defer l.mu.Unlock()
	if fd < len(l.conns) && l.conns[fd] == c {
		syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, fd, nil)
		l.conns[fd] = nil
		l.nconns--
	}
	if l.quit && l.nconns == 0 {
		l.poke()
	}
}

// resume has the loop read c again: its budget has room. Called with
// c.wmu held.
func (l *eventLoop) resume(c *conn) {
	c.paused.Store(false)
	l.mu.Lock()
	l.resumed = append(l.resumed, c)
	l.poke()
	l.mu.Unlock()
}

// close has the loop end once its last connection is released. Called
// when the server shuts down or closes.
func (l *eventLoop) close() {
	l.mu.Lock()
	l.quit = true
	l.poke()
	l.mu.Unlock()
}

// done is closed once the loop has ended.
func (l *eventLoop) done() <-chan struct{} { return l.ended }

// poke wakes the loop. Called with l.mu held.
func (l *eventLoop) poke() {
	if !l.woken {
		l.woken = true
		syscall.Write(l.wake[1], []byte{1})
	}
}

// run is the loop: it waits for events and serves the connections they
// name, and those resumed. It takes the events ready now without blocking
// (looking twice more before it gives up: under load, more requests
// arrive meanwhile), and only then blocks in epoll_wait. Between looks it
// yields to the server's other goroutines if the last round woke some
// (started writes, handlers): they answer, and the next requests follow.
// After a round it served alone (reads) it does not: a yield with no one
// to run woke an idle thread of the runtime, which then went back to
// sleep, two futex calls for every few gets and the loop moving between
// threads (3-5% of the server's CPU per get at 16 and 64 clients). Waiting
// on the epoll descriptor in the runtime's own poller instead cost 10-17%
// more CPU per write at 16 clients (more hand-offs between the runtime's
// threads) and saved 3-5% on gets.
func (l *eventLoop) run() {
	defer close(l.ended)
	events := make([]syscall.EpollEvent, 256)
	var cs, resumed []*conn
	for {
		n, err := l.wait(events)
		if err != nil {
			// Not expected with a valid epoll descriptor and buffer;
			// without the loop its connections would hang: close them.
			l.s.log.Error("event loop failed: closing its connections", "err", err)
			l.fail()
			return
		}
		if l.dispatch(events[:n], &cs, &resumed) {
			return
		}
	}
}

// wait returns the number of events it put in events, at least one.
func (l *eventLoop) wait(events []syscall.EpollEvent) (int, error) {
	for yielded := 0; yielded < loopYields; yielded++ {
		r, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(l.epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
		if errno != 0 && errno != syscall.EINTR {
			return 0, errno
		}
		if errno == 0 && r > 0 {
			return int(r), nil
		}
		if l.yield {
			runtime.Gosched()
		}
	}
	for {
		n, err := syscall.EpollWait(l.epfd, events, -1)
		switch {
		case err == syscall.EINTR || err == nil && n == 0:
		case err != nil:
			return 0, err
		default:
			return n, nil
		}
	}
}

// dispatch serves one round of events, and the resumed connections. It
// reports whether the loop is to end (then it has closed its descriptors).
func (l *eventLoop) dispatch(events []syscall.EpollEvent, cs, resumed *[]*conn) bool {
	woke := false
	for _, ev := range events {
		if ev.Fd == int32(l.wake[0]) {
			woke = true
			var b [64]byte
			for {
				if k, _ := syscall.Read(l.wake[0], b[:]); k <= 0 {
					break
				}
			}
		}
	}
	l.mu.Lock()
	if woke {
		l.woken = false
	}
	*cs = (*cs)[:0]
	for _, ev := range events {
		var c *conn // nil for the pipe, or a connection just released
		if int(ev.Fd) < len(l.conns) {
			c = l.conns[ev.Fd]
		}
		*cs = append(*cs, c)
	}
	*resumed, l.resumed = l.resumed, (*resumed)[:0]
	quit := l.quit && l.nconns == 0
	if quit {
		l.closeFDs()
	}
	l.mu.Unlock()
	if quit {
		return true
	}
	if l.s.cfg.Observe != nil {
		l.now = time.Now()
	}
	for i, ev := range events {
		c := (*cs)[i]
		if c == nil {
			continue
		}
		if ev.Events&(syscall.EPOLLOUT|syscall.EPOLLERR|syscall.EPOLLHUP) != 0 {
			c.raw.poke()
		}
		if ev.Events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLERR|syscall.EPOLLHUP) != 0 {
			l.serve(c, ev.Events&(syscall.EPOLLRDHUP|syscall.EPOLLERR|syscall.EPOLLHUP) != 0)
		}
	}
	clear(*cs)
	for _, c := range *resumed {
		l.serve(c, true)
	}
	clear(*resumed)
	l.flushRound()
	l.commit()
	return false
}

// fail shuts every connection of the loop down; their handlers end them.
func (l *eventLoop) fail() {
	l.mu.Lock()
	l.dead = true
	cs := make([]*conn, 0, l.nconns)
	for _, c := range l.conns {
		if c != nil {
			cs = append(cs, c)
		}
	}
	l.mu.Unlock()
	for _, c := range cs {
		c.rmu.Lock()
		if !c.ended {
			l.end(c)
		}
		c.rmu.Unlock()
	}
}

// serve reads what c's client sent and serves it. With drain it reads
// until the socket has nothing more (the client hung up, or c was paused
// and its events were ignored); otherwise a read that does not fill the
// buffer emptied the socket, and epoll reports the next bytes.
func (l *eventLoop) serve(c *conn, drain bool) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.ended || c.paused.Load() {
		return // paused: resume reads it
	}
	if len(c.in) > 0 && !l.frames(c, nil) {
		return
	}
	for {
		n, err := readRaw(c.raw.fd, l.buf)
		switch {
		case n > 0:
			if !l.frames(c, l.buf[:n]) {
				return
			}
			if n < len(l.buf) && !drain {
				return
			}
		case err == syscall.EAGAIN:
			return
		case err == syscall.EINTR:
		default: // the end of the stream, or a reset
			l.end(c)
			return
		}
	}
}

// readRaw reads a non-blocking descriptor: a raw system call, without
// the runtime's bookkeeping for one that may block.
func readRaw(fd int, b []byte) (int, error) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if errno != 0 {
		return -1, errno
	}
	return int(n), nil
}

// writevRaw writes iov (not empty) to a non-blocking descriptor, with
// write for one buffer and writev for several: a raw system call, as
// readRaw.
func writevRaw(fd int, iov []syscall.Iovec) (int, syscall.Errno) {
	var n uintptr
	var errno syscall.Errno
	if len(iov) == 1 {
		n, _, errno = syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(iov[0].Base)), uintptr(iov[0].Len))
	} else {
		n, _, errno = syscall.RawSyscall(syscall.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	}
	return int(n), errno
}

// frames serves the messages in c.in followed by data. It returns false
// if the loop must read c no more for now: it paused on its budget, or it
// ended. Called with c.rmu held.
func (l *eventLoop) frames(c *conn, data []byte) bool {
	b := data
	if len(c.in) > 0 {
		c.in = append(c.in, data...)
		b = c.in
	}
	max := c.s.cfg.MaxMessageSize
	for len(b) > 0 {
		if go_, paused := c.roomToRead(); !go_ {
			if paused {
				l.disarmPartial(c) // not read meanwhile: the wait is the server's
				l.keep(c, b)
			} else {
				l.end(c)
			}
			return false
		}
		if !c.scan.begun {
			// A whole message in the usual layout is parsed without
			// framing it first (fastparse.go); its byte arguments are
			// borrowed from b until it is served.
			a := &c.args
			*a = args{}
			if m, n, ok := fastFrame(b, a, true); ok && n <= max {
				if c.partial != nil {
					l.disarmPartial(c)
				}
				m.began = l.now
				c.serveRequest(m, a, false)
				l.served++
				b = b[n:]
				continue
			}
		}
		n, err := c.scan.scan(b, max)
		if err == errShortFrame {
			break
		}
		if err != nil {
			c.frameError(l.dec, b, err)
			l.end(c)
			return false
		}
		if c.partial != nil {
			l.disarmPartial(c)
		}
		ok := c.dispatch(l.dec, b[:n], false, l.now)
		l.served++
		if n > frameKeep {
			// The decoder keeps a buffer as large as the longest string
			// it decoded: do not keep one sized by a large message.
			l.dec = msgpack.NewDecoder(nil)
		}
		b = b[n:]
		if !ok {
			l.end(c)
			return false
		}
	}
	if len(b) > 0 {
		l.armPartial(c) // b begins a message: the rest must follow within the read timeout
	} else if c.partial != nil {
		l.disarmPartial(c)
	}
	l.keep(c, b)
	return true
}

// armPartial starts the read timeout of the message that c's unserved
// bytes begin, unless it runs already: if the rest has not arrived when it
// fires, the connection is ended (a half-sent message must not hold it
// forever). Called with c.rmu held.
func (l *eventLoop) armPartial(c *conn) {
	if c.partial != nil || l.s.cfg.ReadTimeout <= 0 {
		return
	}
	gen := c.partialGen
	c.partial = time.AfterFunc(l.s.cfg.ReadTimeout, func() { l.expire(c, gen) })
}

// disarmPartial stops the read timeout: the message is whole, or c is
// not read for now, or it ends. Called with c.rmu held.
func (l *eventLoop) disarmPartial(c *conn) {
	if c.partial != nil {
		c.partial.Stop()
		c.partial = nil
		c.partialGen++
	}
}

// expire ends c when its message's read timeout fires, unless the
// message was completed (or c ended) meanwhile.
func (l *eventLoop) expire(c *conn, gen uint64) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.ended || c.partial == nil || c.partialGen != gen {
		return
	}
	c.partial = nil
	c.partialGen++
	c.readTimedOut()
	l.end(c)
}

// keep makes b, the bytes of c not served yet, c.in. b is data, or a
// suffix of c.in.
func (l *eventLoop) keep(c *conn, b []byte) {
	switch {
	case len(b) == 0:
		if cap(c.in) > frameKeep {
			c.in = nil // an idle connection holds no large buffer
		} else {
			c.in = c.in[:0]
		}
	case len(c.in) > 0:
		c.in = c.in[:copy(c.in, b)]
	default:
		c.in = append(c.in[:0], b...)
	}
}

// later has c's answers of this round written at its end: c.flushing
// is set, and the answers are in c.queue.
func (l *eventLoop) later(c *conn) { l.flush = append(l.flush, c) }

// flushRound writes the answers the round served, as Redis writes its
// replies before it waits for events again.
func (l *eventLoop) flushRound() {
	for i, c := range l.flush {
		l.flush[i] = nil
		c.wmu.Lock()
		batch := c.queue
		c.queue, c.batch = c.batch[:0], nil
		c.wmu.Unlock()
		c.flushRaw(batch, 0, false)
	}
	l.flush = l.flush[:0]
}

// handed counts a request of this round handed to a handler goroutine.
func (l *eventLoop) handed() { l.gone++ }

// start starts a write read this round (server_start.go). When no batch is
// being committed, the loop is made the leader, and commits at the end of
// the round every write started in it.
func (l *eventLoop) start(ctx context.Context, cmd state.Command, w fencekv.WriteOptions, then func(state.Result)) {
	l.starts++
	if l.s.starts.StartLed(ctx, cmd, w, then) {
		l.leads = true
	}
}

// commit ends a round in which the loop was made the leader. A round that
// served only writes is committed by the loop itself, as Redis commits
// its appends: the writes wait for the sync anyway, and meanwhile the next
// requests gather in the sockets, to be read in one round after it. Not
// handing the batch to a committer goroutine and waking the loop for every
// few requests that arrive during the sync took fenced-put at 16 clients
// from 34 to 24 us of the server's CPU per put, and lock-cycle from 98 to
// 84 us per cycle. A round that also served reads hands the lead to a
// committer instead, so that reads arriving during the sync are not held
// behind it (mixed at 16 clients lost 20% of its throughput the other
// way). A checkpoint that falls due (every 200 ms) runs in the loop's
// batch too, as it would in a committer's.
func (l *eventLoop) commit() {
	leads, reads := l.leads, l.served > l.starts
	l.yield = l.starts > 0 || l.gone > 0
	l.leads, l.served, l.starts, l.gone = false, 0, 0, 0
	switch {
	case !leads:
	case reads:
		l.s.starts.PassLead()
	default:
		l.s.starts.Lead()
	}
}

// end stops reading c and finishes it. Called with c.rmu held.
func (l *eventLoop) end(c *conn) {
	l.disarmPartial(c)
	c.ended = true
	c.in = nil
	go c.end()
}

// stop ends c for Shutdown: it reads no more requests, and its requests in
// flight are answered. Called with s.mu held.
func (l *eventLoop) stop(c *conn) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if !c.ended {
		l.end(c)
	}
}

// roomToRead is the event loop's waitRoom: it reports whether the loop may
// serve another message of c, and if not, whether c paused on its budget
// (wake resumes it) rather than ended. Called with c.rmu held.
func (c *conn) roomToRead() (ok, paused bool) {
	budget := int64(c.s.cfg.MaxPendingBytes)
	if c.pending.Load() <= budget {
		return true, false
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	switch {
	case c.broken:
		return false, false
	case c.pending.Load() <= budget:
		return true, false
	}
	c.waiting = true
	c.paused.Store(true)
	return false, true
}

// flushRaw is flush for an event loop connection: it writes batch (whose
// first off bytes are written already) and what is queued after it.
// Unless told to block, it never waits: when the socket's buffer is full
// it hands the rest to a goroutine that waits for room, up to the write
// timeout, so neither the loop nor a handler waits on a slow client.
func (c *conn) flushRaw(batch []*encoder, off int, block bool) {
	for batch != nil {
		var err error
		off, err = c.raw.writeBatch(batch, off, block, c.s.cfg.WriteTimeout)
		if err == errWouldBlock {
			go c.flushRaw(batch, off, true)
			return
		}
		batch = c.flushed(batch, err)
		off = 0
	}
}

// writerStuck reports whether c's answers wait on its client: on an event
// loop connection, whether a writer has waited for room in the socket for
// stuckAfter. Being over the budget alone is not: the loop queues the
// answers of a round's reads until the round's end (one answer may take
// the pending bytes past the budget), and a client that asked for more
// than the budget in one go has the writer wait while it reads them. On a
// goroutine connection, answers are written as they come, so answers over
// the budget are waiting on the client.
func (c *conn) writerStuck() bool {
	if c.raw == nil {
		return true
	}
	since := c.raw.waiting.Load()
	return since != 0 && monoNanos()-since > int64(stuckAfter)
}

// monoEpoch anchors monoNanos: readings taken from it are monotonic, so a
// step of the wall clock (NTP, an operator's date -s) cannot make a writer
// look stuck, or a stuck one look fresh.
var monoEpoch = time.Now()

// monoNanos is the monotonic time since monoEpoch, in nanoseconds; never 0
// once the process has run for a nanosecond.
func monoNanos() int64 { return int64(time.Since(monoEpoch)) + 1 }

// stuckAfter is how long an event loop connection's writer waits for room
// before its client counts as not reading (writerStuck).
const stuckAfter = time.Second

// releaseRaw closes an event loop connection once it is finished: after
// the flusher is done, so that no one uses the descriptor once closed.
func (c *conn) releaseRaw() {
	c.wmu.Lock()
	for c.flushing {
		c.room.Wait()
	}
	c.broken = true // nothing more is written
	c.wmu.Unlock()
	c.s.loop.remove(c)
	c.raw.closeFD()
}

// rawConn is an event loop connection's socket. It is a net.Conn for the
// code shared with goroutine connections (addresses, Close); reads and
// writes go through the loop and writeBatch.
type rawConn struct {
	fd            int
	local, remote net.Addr
	writable      chan struct{} // a token when epoll says the socket is writable, or hung up, while waiting
	waiting       atomic.Int64  // nonzero while a writer waits for room (since when, monoNanos): epoll's writable events go to writable
	iov           []syscall.Iovec

	mu     sync.Mutex // guards closed: Close and closeFD
	closed bool
}

// newRawConn takes tc's socket out of the runtime's poller: it duplicates
// the descriptor (the duplicate shares the socket and its non-blocking
// mode) and closes tc.
func newRawConn(tc *net.TCPConn) (*rawConn, error) {
	sc, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, derr := -1, error(nil)
	if err := sc.Control(func(s uintptr) {
		r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, s, syscall.F_DUPFD_CLOEXEC, 0)
		if errno != 0 {
			derr = os.NewSyscallError("fcntl", errno)
			return
		}
		fd = int(r)
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	r := &rawConn{fd: fd, local: tc.LocalAddr(), remote: tc.RemoteAddr(), writable: make(chan struct{}, 1)}
	tc.Close()
	return r, nil
}

// poke records that the socket may be writable, if a writer waits for
// it. (Epoll reports the socket writable with nearly every read event:
// passing each on cost a channel send per request.)
func (r *rawConn) poke() {
	if r.waiting.Load() == 0 {
		return
	}
	select {
	case r.writable <- struct{}{}:
	default:
	}
}

// writeBatch writes the answers in batch from byte off on, with writev. It
// returns how far it got. If the socket's buffer is full it waits for
// room, at most timeout from then, or, without block, returns
// errWouldBlock. Only the flusher calls it.
func (r *rawConn) writeBatch(batch []*encoder, off int, block bool, timeout time.Duration) (int, error) {
	var deadline time.Time
	for {
		iov, total, skip := r.iov[:0], 0, off
		for _, e := range batch {
			b := e.buf.Bytes()
			if skip >= len(b) {
				skip -= len(b)
				continue
			}
			b = b[skip:]
			skip = 0
			v := syscall.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			iov = append(iov, v)
			total += len(b)
			if len(iov) == maxIovecs {
				break
			}
		}
		if len(iov) == 0 {
			return off, nil
		}
		n, errno := writevRaw(r.fd, iov)
		clear(iov) // hold no answer's bytes past the write
		r.iov = iov[:0]
		switch errno {
		case 0:
			off += n
			if n == total && len(iov) < maxIovecs {
				return off, nil
			}
			continue
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
		default:
			return off, os.NewSyscallError("writev", errno)
		}
		if !block {
			return off, errWouldBlock
		}
		if r.waiting.Load() == 0 {
			// From now on the loop passes writable events on; the
			// socket may have become writable before: try again.
			r.waiting.Store(monoNanos())
			defer r.waiting.Store(0)
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(timeout)
		}
		if err := r.waitWritable(deadline); err != nil {
			return off, err
		}
	}
}

// waitWritable waits until epoll says the socket may be writable, or the
// deadline passes.
func (r *rawConn) waitWritable(deadline time.Time) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-r.writable:
		return nil
	case <-t.C:
		return os.ErrDeadlineExceeded
	}
}

// Read reads what has arrived, without waiting; the event loop reads the
// socket itself, this is for the net.Conn interface.
func (r *rawConn) Read(b []byte) (int, error) {
	n, err := syscall.Read(r.fd, b)
	if n == 0 && err == nil && len(b) > 0 {
		return 0, io.EOF
	}
	return max(n, 0), err
}

// Write writes b, waiting for room up to 30 s (answers go through
// writeBatch; this is for the net.Conn interface).
func (r *rawConn) Write(b []byte) (int, error) {
	deadline := time.Now().Add(30 * time.Second)
	written := 0
	for written < len(b) {
		n, err := syscall.Write(r.fd, b[written:])
		switch {
		case n > 0:
			written += n
		case err == syscall.EINTR:
		case err == syscall.EAGAIN:
			if err := r.waitWritable(deadline); err != nil {
				return written, err
			}
		default:
			return written, os.NewSyscallError("write", err)
		}
	}
	return written, nil
}

// Close shuts the socket down: the loop reads the end of the stream, and
// writes fail. The descriptor is closed by closeFD.
func (r *rawConn) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		syscall.Shutdown(r.fd, syscall.SHUT_RDWR)
	}
	return nil
}

// closeFD closes the descriptor; Close does nothing after it.
func (r *rawConn) closeFD() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		syscall.Close(r.fd)
	}
}

func (r *rawConn) LocalAddr() net.Addr  { return r.local }
func (r *rawConn) RemoteAddr() net.Addr { return r.remote }

// The deadlines of an event loop connection are its write timeout, which
// writeBatch applies.
func (r *rawConn) SetDeadline(time.Time) error      { return nil }
func (r *rawConn) SetReadDeadline(time.Time) error  { return nil }
func (r *rawConn) SetWriteDeadline(time.Time) error { return nil }

var _ net.Conn = (*rawConn)(nil)
