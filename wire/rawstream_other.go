//go:build !linux

package wire

import (
	"io"
	"net"
)

// streamOf returns what a link, or a server's connection served by a
// goroutine, reads and writes nc through: nc itself (rawStream is
// Linux's).
func streamOf(nc net.Conn) io.ReadWriter { return nc }
