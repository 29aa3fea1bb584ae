package wire_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// TestTooLargeWhileWriting: a request far over the message limit is
// refused with too_large, which the server answers and then closes the
// connection while the client is still writing the rest (the write fails
// with a reset). The client reports the server's answer, not the reset
// with an unknown outcome; and the next call goes on a new connection.
// Both server paths (event loop and a goroutine per connection).
func TestTooLargeWhileWriting(t *testing.T) {
	for _, loop := range []bool{true, false} {
		name := "goroutine"
		if loop {
			name = "event-loop"
		}
		t.Run(name, func(t *testing.T) {
			ts := startServer(t, func(o *fencekv.Options, c *wire.Config) {
				c.MaxMessageSize = 64 << 10
				c.EventLoop = loop
			})
			cl := dial(t, ts.Addr)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Far more than the socket buffers hold: the write is still
			// going when the server closes.
			big := make([]byte, 32<<20)
			_, err := cl.Put(ctx, b("big"), big, fencekv.WriteOptions{})
			fe := wantCode(t, err, fencekv.CodeTooLarge)
			var ce *wire.ConnError
			if errors.As(err, &ce) {
				t.Errorf("too_large came as a connection error: %v", err)
			}
			if fe.Outcome != "" {
				t.Errorf("outcome %q for a refused request", fe.Outcome)
			}
			if _, err := cl.Put(ctx, b("small"), b("v"), fencekv.WriteOptions{}); err != nil {
				t.Fatalf("the call after the refusal: %v", err)
			}
		})
	}
}
