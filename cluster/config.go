package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// Config configures a Node. Start from DefaultConfig.
type Config struct {
	Name       string // the node's name, unique in the cluster; kept in its data dir
	Dir        string // data dir
	ClientAddr string // the address clients (and other nodes, forwarding) reach this node on
	RaftAddr   string // replication: listen (and advertise, unless RaftAdvertise is set)
	// RaftAdvertise is the replication address the other nodes dial, if
	// not RaftAddr: a host:port that reaches RaftAddr (through NAT, or a
	// proxy in front of the node, as the fault-injection tests use).
	RaftAdvertise string
	GossipAddr    string // membership (TCP and UDP): listen and advertise

	// Join lists gossip addresses of running members; they are tried
	// until one answers.
	Join []string
	// BootstrapExpect bootstraps a new cluster once this many servers
	// without state see each other by gossip. 0: never bootstrap (join
	// an existing cluster).
	BootstrapExpect int
	// ReapAfter removes from the raft configuration a server that gossip
	// has found dead (or gone) for this long, never leaving the live
	// servers short of a quorum.
	ReapAfter time.Duration
	// HoldTimeout is how long a request waits for a leader (or a new
	// one) before it is answered unavailable.
	HoldTimeout time.Duration

	// Engine holds the limits, logger and clock shared with a single node.
	Engine fencekv.Options

	// RaftTLS, if set, makes raft's connections mutual TLS (tls.go): it
	// must require and verify client certificates (ClientAuth, ClientCAs)
	// and verify the peers it dials (RootCAs; the server name is the
	// peer's raft host), with the node's certificate in Certificates (or
	// given by GetCertificate and GetClientCertificate, to renew it).
	RaftTLS *tls.Config
	// GossipKey, if set, encrypts and authenticates gossip with AES-GCM
	// (memberlist's SecretKey: 16, 24 or 32 bytes, the same on every
	// node).
	GossipKey []byte
	// Dial connects the forwarder to the leader's client address; nil is
	// wire.Dial. A node whose client port is TLS dials with TLS and its
	// own certificate, which the leader's client port verifies.
	Dial func(ctx context.Context, addr string) (*wire.Client, error)

	// Raft timing and log compaction (the defaults suit a LAN; tests
	// make snapshots frequent).
	HeartbeatTimeout  time.Duration
	ElectionTimeout   time.Duration
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		ReapAfter:         10 * time.Minute,
		HoldTimeout:       5 * time.Second,
		Engine:            fencekv.DefaultOptions(),
		HeartbeatTimeout:  500 * time.Millisecond,
		ElectionTimeout:   500 * time.Millisecond,
		SnapshotThreshold: 8192,
		SnapshotInterval:  2 * time.Minute,
		TrailingLogs:      10240,
	}
}

func (c *Config) validate() error {
	if err := c.Engine.Validate(); err != nil {
		return err
	}
	switch {
	case c.Name == "":
		return errors.New("cluster: the node needs a name (--node)")
	case c.Dir == "":
		return errors.New("cluster: the node needs a data dir")
	case c.BootstrapExpect < 0:
		return errors.New("cluster: --bootstrap-expect must not be negative")
	case c.ReapAfter <= 0 || c.HoldTimeout <= 0:
		return errors.New("cluster: --reap-after and --hold-timeout must be positive")
	case c.HeartbeatTimeout <= 0 || c.ElectionTimeout <= 0:
		return errors.New("cluster: raft timeouts must be positive")
	case len(c.GossipKey) != 0 && len(c.GossipKey) != 16 && len(c.GossipKey) != 24 && len(c.GossipKey) != 32:
		return fmt.Errorf("cluster: the gossip key is %d bytes; want 16, 24 or 32", len(c.GossipKey))
	}
	for name, addr := range map[string]string{"client": c.ClientAddr, "raft": c.RaftAddr, "gossip": c.GossipAddr} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("cluster: %s address %q: %w", name, addr, err)
		}
	}
	if c.RaftAdvertise != "" {
		if err := checkAdvertise(c.RaftAdvertise); err != nil {
			return err
		}
	}
	return nil
}

// checkAdvertise refuses an advertised address other nodes cannot dial.
func checkAdvertise(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("cluster: raft advertise address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return fmt.Errorf("cluster: raft advertise address %q: want an IP address other nodes can dial", addr)
	}
	return nil
}

// raftAdvertise is the replication address the other nodes dial.
func (c *Config) raftAdvertise() string {
	if c.RaftAdvertise != "" {
		return c.RaftAdvertise
	}
	return c.RaftAddr
}
