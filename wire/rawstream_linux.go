//go:build linux

package wire

import (
	"io"
	"net"
	"os"
	"syscall"
)

// rawStream reads and writes a plain TCP connection (a client's link, or
// a server's connection served by a goroutine) with raw system calls:
// the socket is non-blocking, so a read or write never blocks in the
// kernel, and when it would, the runtime's poller waits for the socket
// as it does for net.Conn (syscall.RawConn), deadlines included. What it
// saves is the runtime's bookkeeping around a system call that may
// block: entering and leaving it (the goroutine's P is marked as in a
// system call, and taken back on return), and the monitor thread that
// hands a P left in a system call to another thread, waking it. On a
// loopback connection a write runs the receiving side's network stack
// too, long enough for the monitor to take the P over; with 16
// closed-loop callers that monitor and its hand-offs were about a sixth
// of the client's CPU per get.
type rawStream struct {
	rc syscall.RawConn

	// The read side, used by one reader at a time (the link's reader, or
	// the connection's read loop).
	rbuf   []byte
	rn     int
	rerr   error
	readFn func(fd uintptr) bool

	// The write side, used by one writer at a time (under the link's wmu,
	// or the connection's flusher).
	wbufs   *net.Buffers
	one     [1][]byte   // Write's buffer, as wbufs's
	oneBufs net.Buffers // one[:]
	iov     []syscall.Iovec
	wn      int64
	werr    error
	writeFn func(fd uintptr) bool
}

// streamOf returns what a link (or a server's connection served by a
// goroutine) reads and writes nc through: a rawStream for a plain TCP
// connection, nc itself otherwise (TLS).
func streamOf(nc net.Conn) io.ReadWriter {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nc
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nc
	}
	s := &rawStream{rc: rc}
	s.readFn, s.writeFn = s.read1, s.write1
	return s
}

func (s *rawStream) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s.rbuf, s.rn, s.rerr = b, 0, nil
	err := s.rc.Read(s.readFn)
	s.rbuf = nil
	switch {
	case err != nil: // closed, or the read deadline passed
		return 0, err
	case s.rerr != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", s.rerr)}
	case s.rn == 0:
		return 0, io.EOF
	}
	return s.rn, nil
}

// read1 reads once; it returns false if the socket has nothing yet.
func (s *rawStream) read1(fd uintptr) bool {
	for {
		n, err := readRaw(int(fd), s.rbuf)
		switch err {
		case nil:
			s.rn = n
			return true
		case syscall.EAGAIN:
			return false
		case syscall.EINTR:
			continue
		}
		s.rerr = err
		return true
	}
}

// Write writes b whole, or fails: writeBuffers with one buffer.
func (s *rawStream) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s.one[0] = b
	s.oneBufs = s.one[:]
	n, err := s.writeBuffers(&s.oneBufs)
	s.one[0], s.oneBufs = nil, nil
	return int(n), err
}

// writeBuffers writes bufs, consuming what it wrote, as
// net.Buffers.WriteTo does on a net.Conn (see buffersWriter): one write,
// or one writev, for as many buffers as one takes.
func (s *rawStream) writeBuffers(bufs *net.Buffers) (int64, error) {
	s.wbufs, s.wn, s.werr = bufs, 0, nil
	err := s.rc.Write(s.writeFn)
	s.wbufs = nil
	clear(s.iov[:cap(s.iov)]) // every pass's iovecs: keep no answer alive
	n := s.wn
	switch {
	case err != nil:
		return n, err
	case s.werr != nil:
		return n, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("writev", s.werr)}
	}
	return n, nil
}

// write1 writes what is left of wbufs; it returns false if the socket's
// buffer is full.
func (s *rawStream) write1(fd uintptr) bool {
	for len(*s.wbufs) > 0 {
		iov := s.iov[:0]
		for _, b := range *s.wbufs {
			if len(b) == 0 {
				continue
			}
			iov = append(iov, syscall.Iovec{Base: &b[0]})
			iov[len(iov)-1].SetLen(len(b))
			if len(iov) == maxIovecs {
				break
			}
		}
		s.iov = iov
		if len(iov) == 0 {
			*s.wbufs = (*s.wbufs)[:0]
			return true
		}
		n, errno := writevRaw(int(fd), iov)
		switch errno {
		case 0:
			s.wn += int64(n)
			consume(s.wbufs, int64(n))
		case syscall.EAGAIN:
			return false
		case syscall.EINTR:
		default:
			s.werr = errno
			return true
		}
	}
	return true
}

// consume drops the first n bytes of v.
func consume(v *net.Buffers, n int64) {
	for len(*v) > 0 {
		first := int64(len((*v)[0]))
		if first > n {
			(*v)[0] = (*v)[0][n:]
			return
		}
		n -= first
		(*v)[0] = nil
		*v = (*v)[1:]
	}
}
