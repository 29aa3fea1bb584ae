package wire_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
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

// TestTLSRefusalIsConfiguration: a TLS failure before the first request
// is a *wire.TLSError, never a write with an unknown outcome: a plain
// client against a TLS server (which says tls_required), a client without
// the certificate a mutual-TLS server requires (TLS 1.3: learnt at the
// first read), and a client that does not trust the server's CA (at the
// dial). With two addresses (the dial pings) as with one.
func TestTLSRefusalIsConfiguration(t *testing.T) {
	ca := fencekvtest.NewCA(t, "test CA")
	other := fencekvtest.NewCA(t, "another CA")
	plainTLS := startSecure(t, secureConfig(tlsServerConfig(ca.Issue(t, "server", nil), nil), nil))
	mutual := startSecure(t, secureConfig(tlsServerConfig(ca.Issue(t, "server", nil), ca), nil))
	for _, tc := range []struct {
		name string
		addr string
		o    *wire.DialOptions
		code fencekv.Code // of the server's notification, if it sends one
	}{
		{"plain client", plainTLS.Addr, nil, fencekv.CodeTLSRequired},
		{"no client certificate", mutual.Addr, &wire.DialOptions{TLS: tlsClient(ca, nil)}, ""},
		{"untrusted server", plainTLS.Addr, &wire.DialOptions{TLS: tlsClient(other, nil)}, ""},
	} {
		for _, addrs := range [][]string{{tc.addr}, {tc.addr, tc.addr}} {
			t.Run(fmt.Sprintf("%s/%d addresses", tc.name, len(addrs)), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				c, err := wire.DialCluster(ctx, addrs, tc.o)
				if err == nil {
					defer c.Close()
					_, err = c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{})
				}
				var te *wire.TLSError
				if !errors.As(err, &te) {
					t.Fatalf("err = %v (%T); want a *wire.TLSError", err, err)
				}
				var ce *wire.ConnError
				if errors.As(err, &ce) && ce.Outcome != "" {
					t.Errorf("outcome %q for a request TLS refused: %v", ce.Outcome, err)
				}
				if strings.Contains(err.Error(), "may or may not have been applied") {
					t.Errorf("message says the outcome is unknown: %v", err)
				}
				if tc.code != "" {
					wantCode(t, err, tc.code)
				}
			})
		}
	}
	absent(t, plainTLS.DB, "k")
	absent(t, mutual.DB, "k")
}
