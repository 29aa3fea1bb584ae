package wire

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/fencekv/fencekv"
)

// TLSError is a connection that TLS refused before the server read any
// request on it: a setting of the client that does not match the server's
// (a configuration error, not an outage). The server's certificate was
// not trusted, or is not for the name dialed; the server refused the
// client's certificate or its absence (mutual TLS); they share no TLS
// version; a TLS client reached a server that does not speak TLS; or a
// plain client reached a TLS server, which says so with the error
// notification tls_required (then Err is that *fencekv.Error). Nothing
// sent on such a connection was served. It comes wrapped in the call's or
// the dial's error: find it with errors.As.
type TLSError struct {
	Err error
}

func (e *TLSError) Error() string { return "TLS: " + e.Err.Error() }
func (e *TLSError) Unwrap() error { return e.Err }

// tlsRefusal wraps err, a failure of the TLS handshake (dial) or of the
// first read after it, in a *TLSError if it is TLS refusing the
// connection, rather than the network or the server going away (a reset,
// the end of the stream, a timeout, the caller's context).
func tlsRefusal(err error) error {
	if err == nil || errors.As(err, new(*TLSError)) {
		return err
	}
	var ve *tls.CertificateVerificationError
	var rhe tls.RecordHeaderError
	var hn x509.HostnameError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	var op *net.OpError
	switch {
	case errors.As(err, &ve), errors.As(err, &rhe), errors.As(err, &hn), errors.As(err, &ua), errors.As(err, &ci):
		return &TLSError{Err: err}
	case errors.As(err, &op) && op.Op == "remote error":
		// A TLS alert from the server: it refused the handshake (under
		// TLS 1.3 the client learns it only at its first read).
		return &TLSError{Err: err}
	}
	return err
}

// handshakeRefusal is tlsRefusal for an error of the client's own
// handshake: also a local alert (no common version, a malformed answer),
// but not the network failing or the caller giving up.
func handshakeRefusal(err error) error {
	if e := tlsRefusal(err); e != err {
		return e
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return &TLSError{Err: err}
}

// connRefusal is the server's error notification: it refused the whole
// connection (PROTOCOL.md §2.4), before serving anything sent on it.
type connRefusal struct{ fe *fencekv.Error }

func (e connRefusal) Error() string { return e.fe.Error() }
func (e connRefusal) Unwrap() error { return e.fe }

// servedNothing reports whether a connection that failed with err
// served none of its requests: the server refused the connection (its
// error notification), or TLS did.
func servedNothing(err error) bool {
	return errors.As(err, new(connRefusal)) || errors.As(err, new(*TLSError))
}
