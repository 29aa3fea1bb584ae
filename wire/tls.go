package wire

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

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

// DialOptions tune DialWith. The zero value (or nil) dials plain TCP and
// does not authenticate, as Dial does.
type DialOptions struct {
	// TLS, if set, makes the connection TLS, verified with it (RootCAs,
	// ServerName, and Certificates for mutual TLS). Versions below TLS
	// 1.2 are never used. An empty ServerName is the address's host.
	TLS *tls.Config
	// User and Secret, if User is set, authenticate the connection right
	// after it is made (method auth); a refusal fails the dial.
	User   string
	Secret []byte
}

// DialWith connects to a fencekv server at addr (host:port) with o's TLS
// and credentials.
func DialWith(ctx context.Context, addr string, o *DialOptions) (*Client, error) {
	if o == nil {
		o = &DialOptions{}
	}
	var nc net.Conn
	var err error
	if o.TLS != nil {
		cfg := o.TLS.Clone()
		cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
		d := tls.Dialer{Config: cfg}
		nc, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("wire: dial %s: %w", addr, err)
	}
	c := newClient(nc, addr)
	if o.User != "" {
		if _, err := c.Auth(ctx, o.User, o.Secret); err != nil {
			c.Close()
			return nil, fmt.Errorf("wire: %s: authenticate as %q: %w", addr, o.User, err)
		}
	}
	return c, nil
}

// Auth authenticates the connection as the principal name with secret,
// and returns the principal's name ("" from a server without an auth
// file, which needs none). A wrong name or secret is
// fencekv.ErrUnauthenticated.
func (c *Client) Auth(ctx context.Context, name string, secret []byte) (string, error) {
	var principal string
	err := c.do(ctx, "auth",
		func(p params) error {
			p.EncodeMapLen(2)
			p.str("name", name)
			p.bin("secret", secret)
			return nil
		},
		func(dec *msgpack.Decoder) error {
			return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
				if k == "principal" {
					principal, err = dec.DecodeString()
					return err
				}
				return dec.Skip()
			})
		})
	return principal, err
}
