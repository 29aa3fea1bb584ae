package cluster

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// tlsStream is raft's stream layer over mutual TLS (Config.RaftTLS): the
// node accepts raft connections only from peers whose certificate its
// config verifies, and dials peers verifying theirs (and their raft
// address's host) with the same config. A connection that fails the
// handshake is dropped by raft's transport, which logs why.
type tlsStream struct {
	net.Listener
	advertise net.Addr
	cfg       *tls.Config
}

var _ raft.StreamLayer = (*tlsStream)(nil)

func newTLSStream(bind string, advertise net.Addr, cfg *tls.Config) (*tlsStream, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	cfg = cfg.Clone()
	cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
	if cfg.ClientAuth != tls.RequireAndVerifyClientCert {
		ln.Close()
		return nil, fmt.Errorf("cluster: raft over TLS must require and verify the peers' certificates")
	}
	return &tlsStream{Listener: tls.NewListener(ln, cfg), advertise: advertise, cfg: cfg}, nil
}

// Dial connects to a peer and completes the handshake within timeout.
func (s *tlsStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: s.cfg}
	return d.Dial("tcp", string(addr))
}

// Addr is the address peers reach this node at.
func (s *tlsStream) Addr() net.Addr { return s.advertise }
