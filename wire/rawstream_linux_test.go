//go:build linux

package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

func TestRawStreamIsUsedForPlainTCP(t *testing.T) {
	c, _ := tcpPair(t)
	if _, ok := streamOf(c).(*rawStream); !ok {
		t.Fatalf("streamOf(*net.TCPConn) = %T, want *rawStream", streamOf(c))
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if streamOf(p1) != io.ReadWriter(p1) {
		t.Fatal("streamOf of a non-TCP connection is not the connection itself")
	}
}

// A write larger than the socket buffers waits for room (the EAGAIN
// path) and arrives whole; reads see it in order, then io.EOF.
func TestRawStreamLargeWriteAndEOF(t *testing.T) {
	c, s := tcpPair(t)
	// Small buffers: the writer finds them full many times over.
	c.SetWriteBuffer(32 << 10)
	s.SetReadBuffer(32 << 10)
	rs := streamOf(c).(*rawStream)
	msg := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(s)
		got <- b
	}()
	n, err := rs.Write(msg)
	if err != nil || n != len(msg) {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(msg))
	}
	c.CloseWrite()
	if b := <-got; !bytes.Equal(b, msg) {
		t.Fatalf("the server read %d bytes, not the %d written (or not the same)", len(b), len(msg))
	}

	// And the other way: what the server sends, then the end of stream.
	go func() {
		s.Write([]byte("hello"))
		s.Close()
	}()
	b, err := io.ReadAll(rs)
	if err != nil || string(b) != "hello" {
		t.Fatalf("ReadAll = %q, %v; want hello, nil (io.EOF ends it)", b, err)
	}
	if n, err := rs.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("Read after the end = %d, %v; want 0, io.EOF", n, err)
	}
}

// A read waiting for data ends when the read deadline passes, as a
// net.Conn's would (the link interrupts its reader so), and when the
// connection is closed.
func TestRawStreamDeadlineAndClose(t *testing.T) {
	c, _ := tcpPair(t)
	rs := streamOf(c).(*rawStream)
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := rs.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past its deadline = %v, want os.ErrDeadlineExceeded", err)
	}
	c.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := rs.Read(make([]byte, 8))
		done <- err
	}()
	// Close once the reader is waiting; whether it is already waiting
	// or not, it must end with net.ErrClosed.
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read on a closed connection = %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read did not end when the connection was closed")
	}
}

// A write to a connection the peer reset fails with the system's error,
// wrapped as net.Conn's errors are.
func TestRawStreamWriteAfterReset(t *testing.T) {
	c, s := tcpPair(t)
	rs := streamOf(c).(*rawStream)
	s.SetLinger(0)
	s.Close() // a reset
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for err == nil && time.Now().Before(deadline) {
		_, err = rs.Write([]byte("x"))
	}
	var op *net.OpError
	if !errors.As(err, &op) || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		t.Fatalf("Write after a reset = %v, want a *net.OpError with ECONNRESET or EPIPE", err)
	}
}

// writeBuffers writes more buffers than one writev takes, through full
// socket buffers, in order, and consumes them all.
func TestRawStreamWriteBuffers(t *testing.T) {
	c, s := tcpPair(t)
	c.SetWriteBuffer(32 << 10)
	s.SetReadBuffer(32 << 10)
	rs := streamOf(c).(*rawStream)
	var bufs net.Buffers
	var want bytes.Buffer
	for i := 0; i < 3*maxIovecs; i++ {
		b := bytes.Repeat([]byte{byte(i)}, 1+i%700)
		if i%97 == 0 {
			b = nil // empty buffers are skipped
		}
		bufs = append(bufs, b)
		want.Write(b)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(s)
		got <- b
	}()
	n, err := rs.writeBuffers(&bufs)
	if err != nil || n != int64(want.Len()) || len(bufs) != 0 {
		t.Fatalf("writeBuffers = %d, %v, %d buffers left; want %d, nil, 0", n, err, len(bufs), want.Len())
	}
	c.CloseWrite()
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("the server read %d bytes, not the %d written (or not the same)", len(b), want.Len())
	}
	// The iovecs of every pass are cleared: a large answer is not kept
	// alive until a later writev overwrites its slot (found in review).
	for i, v := range rs.iov[:cap(rs.iov)] {
		if v.Base != nil {
			t.Fatalf("iovec %d (of %d kept) still points at a written buffer", i, cap(rs.iov))
		}
	}
}

// A write the peer does not read ends at the write deadline, with what
// was written counted (the server's WriteTimeout relies on it).
func TestRawStreamWriteDeadline(t *testing.T) {
	c, _ := tcpPair(t)
	c.SetWriteBuffer(32 << 10)
	rs := streamOf(c).(*rawStream)
	big := make([]byte, 64<<20)
	c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
	n, err := rs.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n <= 0 || n >= len(big) {
		t.Fatalf("Write to a peer that reads nothing = %d, %v; want part of it, os.ErrDeadlineExceeded", n, err)
	}
	bufs := net.Buffers{big}
	if _, err := rs.writeBuffers(&bufs); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("writeBuffers past the deadline = %v, want os.ErrDeadlineExceeded", err)
	}
}

func TestConsume(t *testing.T) {
	v := net.Buffers{[]byte("ab"), []byte("cde"), []byte("f")}
	consume(&v, 3)
	if len(v) != 2 || string(v[0]) != "de" || string(v[1]) != "f" {
		t.Fatalf("after consuming 3: %q", v)
	}
	consume(&v, 3)
	if len(v) != 0 {
		t.Fatalf("after consuming all: %q", v)
	}
}

// A write and a read on the raw stream allocate nothing (the client
// makes one of each per call).
func TestRawStreamAllocatesNothing(t *testing.T) {
	c, s := tcpPair(t)
	rs := streamOf(c).(*rawStream)
	msg, back := []byte("ping"), make([]byte, 4)
	go func() {
		b := make([]byte, 4)
		for {
			if _, err := io.ReadFull(s, b); err != nil {
				return
			}
			if _, err := s.Write(b); err != nil {
				return
			}
		}
	}()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := rs.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(rs, back); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per write and read, want 0", allocs)
	}
}
