//go:build !linux

package wire

// Elsewhere than Linux every connection is served by a goroutine of its
// own; these stand in for the event loop (loop_linux.go), never used.

import (
	"context"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
)

type eventLoop struct{}

type rawConn struct{}

func (s *Server) looped(*conn) bool        { return false }
func (l *eventLoop) resume(*conn)          {}
func (l *eventLoop) stop(*conn)            {}
func (l *eventLoop) close()                {}
func (l *eventLoop) done() <-chan struct{} { return nil }
func (l *eventLoop) handed()               {}
func (l *eventLoop) later(*conn)           {}
func (l *eventLoop) start(context.Context, state.Command, fencekv.WriteOptions, func(state.Result)) {
}
func (c *conn) flushRaw([]*encoder, int, bool) {}
func (c *conn) releaseRaw()                    {}
func (c *conn) writerStuck() bool              { return true }
