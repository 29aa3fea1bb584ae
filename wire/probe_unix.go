//go:build unix

package wire

import (
	"io"
	"net"
	"syscall"
)

// peerGone reports, without blocking and without consuming anything,
// whether the other end has closed the TCP connection (io.EOF) or reset it
// (the error); nil means it looks alive (or cannot be told).
func peerGone(raw net.Conn) error {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	var gone error
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n == 0 && err == nil:
			gone = io.EOF
		case err != nil && err != syscall.EAGAIN && err != syscall.EINTR:
			gone = err
		}
		return true // never wait for data
	})
	if err != nil {
		return err // the connection was closed on this side
	}
	return gone
}
