package wire

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// handshakeTimeout bounds a TLS handshake: a client that connects and
// says nothing is closed after it.
const handshakeTimeout = 10 * time.Second

// handshake runs the TLS handshake of a TLS connection (a plain one
// passes). A client that fails it (a plain client, no certificate or an
// untrusted or expired one under mutual TLS, no common version) is logged,
// once per host per burst, and the connection is closed having changed
// nothing. With an auth file, a verified client certificate whose common
// name is a principal's name authenticates the connection as it.
func (c *conn) handshake() bool {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return true
	}
	ctx, cancel := context.WithTimeout(c.waits, handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		var rhe tls.RecordHeaderError
		if errors.As(err, &rhe) && rhe.Conn != nil {
			// Plain bytes, most likely a client without TLS: say so, in
			// plain MessagePack, which that client reads.
			c.s.tellPlain(rhe.Conn)
		}
		switch {
		case c.waits.Err() != nil:
			// Shutting down.
		case errors.Is(err, io.EOF):
			// Connected and closed without a word: a port probe.
			c.s.log.Debug("connection closed before the TLS handshake", "remote", c.nc.RemoteAddr().String())
		default:
			if ok, suppressed := c.s.tlsLog.allow(remoteHost(c.nc.RemoteAddr()), time.Now()); ok {
				c.s.log.Warn("TLS handshake failed: connection refused", "remote", c.nc.RemoteAddr().String(), "err", err,
					"earlier_refusals_not_logged", suppressed)
			}
		}
		return false
	}
	if st := tc.ConnectionState(); len(st.VerifiedChains) > 0 && c.sess != nil {
		c.certPrincipal(st.PeerCertificates[0].Subject.CommonName)
	}
	return true
}

// tellPlain answers a connection whose first bytes are not a TLS handshake
// with the error notification tls_required (PROTOCOL.md §2.4), unencrypted,
// then closes its sending side and reads what the client sends on for up
// to a second, so that the notification is not lost to a reset: a socket
// closed with unread bytes in it resets the connection.
func (s *Server) tellPlain(nc net.Conn) {
	e := newEncoder()
	e.EncodeArrayLen(3)
	e.EncodeUint(typeNotification)
	e.EncodeString("error")
	e.EncodeArrayLen(1)
	e.errorMap(&fencekv.Error{Code: fencekv.CodeTLSRequired, Message: "this server requires TLS: connect with TLS (fencekv: --tls-ca FILE, or --tls)"})
	nc.SetDeadline(time.Now().Add(time.Second))
	if _, err := nc.Write(e.buf.Bytes()); err != nil {
		return
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(nc, 1<<20))
}

// DialWith connects to a fencekv server at addr (host:port) with o's TLS
// and credentials; the client reconnects to addr, with them, when its
// connection breaks.
func DialWith(ctx context.Context, addr string, o *DialOptions) (*Client, error) {
	return DialCluster(ctx, []string{addr}, o)
}

// Auth authenticates the connection as the principal name with secret,
// and returns the principal's name ("" from a server without an auth
// file, which needs none). A wrong name or secret is
// fencekv.ErrUnauthenticated.
func (c *Client) Auth(ctx context.Context, name string, secret []byte) (string, error) {
	var principal string
	err := c.do(ctx, "auth", authParams(name, secret), func(dec *msgpack.Decoder) error {
		return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
			if k == "principal" {
				principal, err = dec.DecodeString()
				return err
			}
			return dec.Skip()
		})
	})
	if err == nil {
		// Reconnections authenticate again as this principal.
		c.dmu.Lock()
		c.opts.User, c.opts.Secret = name, secret
		c.dmu.Unlock()
	}
	return principal, err
}

func authParams(name string, secret []byte) func(params) error {
	return func(p params) error {
		p.EncodeMapLen(2)
		p.str("name", name)
		p.bin("secret", secret)
		return nil
	}
}

// auth authenticates a new connection before the client uses it.
func (cn *link) auth(ctx context.Context, name string, secret []byte) error {
	p := &call{done: make(chan error, 1)}
	id, err := cn.start("auth", authParams(name, secret), p)
	if err != nil {
		return err
	}
	return cn.wait(ctx, id, p, false)
}
