package cluster_test

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/auth"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// TestTLSCluster: three nodes with raft over mutual TLS, gossip encrypted
// with a key, TLS on the client ports and an auth file. They elect a
// leader; a write through a follower (forwarded to the leader over TLS,
// as the follower's certificate's principal) is replicated to every node;
// a client without credentials, a plain client and a raft peer without a
// node certificate are refused.
func TestTLSCluster(t *testing.T) {
	dir := t.TempDir()
	ca := fencekvtest.NewCA(t, "cluster CA")
	caFile := ca.WriteFile(t, dir, "ca.crt")
	key := make([]byte, 32)
	rand.Read(key)
	gossipKey := base64.StdEncoding.EncodeToString(key)

	h, err := auth.Hash([]byte("app secret"), 4)
	if err != nil {
		t.Fatal(err)
	}
	authFile := filepath.Join(dir, "auth")
	var lines strings.Builder
	fmt.Fprintf(&lines, "app %s write:app/ write:clustertest/ lock:app admin\n", h)
	for i := range 3 {
		fmt.Fprintf(&lines, "n%d - read: write: lock: admin\n", i)
	}
	if err := os.WriteFile(authFile, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	dial := &wire.DialOptions{TLS: &tls.Config{RootCAs: ca.Pool}, User: "app", Secret: []byte("app secret")}
	c := clustertest.Start(t, bin(t), 3, &clustertest.Options{
		Extra: []string{"--tls-peer-ca", caFile, "--gossip-key", gossipKey, "--auth-file", authFile},
		NodeExtra: func(name string) []string {
			cert, key := ca.Issue(t, name, nil).WriteFiles(t, dir, name)
			return []string{"--tls-cert", cert, "--tls-key", key}
		},
		Dial: dial,
	})
	leader := c.Leader(t)
	follower := c.Others(leader)[0]
	ctx := ctxT(t, time.Minute)

	cl := c.Dial(t, follower)
	l, err := cl.Acquire(ctx, "app", 30*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Put(ctx, []byte("app/k"), []byte("replicated"), fencekv.WriteOptions{Token: l.Token, Lock: "app"}); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.Nodes {
		ncl := c.Dial(t, nd)
		eventually(t, nd.Name+" has the write", 10*time.Second, func() error {
			e, err := ncl.Get(fencekv.WithStaleReads(ctx), []byte("app/k"))
			switch {
			case err != nil:
				return err
			case string(e.Value) != "replicated":
				return fmt.Errorf("value %q", e.Value)
			}
			return nil
		})
	}
	// Rights hold through forwarding: app may not write outside app/.
	if _, err := cl.Put(ctx, []byte("other"), []byte("x"), fencekv.WriteOptions{}); !errors.Is(err, fencekv.ErrPermissionDenied) {
		t.Errorf("a write outside app/ through a follower: %v, want permission_denied", err)
	}

	// Refused: a TLS client without credentials, a plain client.
	anon, err := wire.DialWith(ctx, follower.Client, &wire.DialOptions{TLS: dial.TLS})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Get(ctx, []byte("app/k")); !errors.Is(err, fencekv.ErrUnauthenticated) {
		t.Errorf("a client without credentials: %v, want unauthenticated", err)
	}
	plain, err := wire.Dial(ctx, follower.Client)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Ping(ctx); err == nil {
		t.Error("a plain client was answered by a TLS client port")
	}
	// The raft port wants a node certificate: a client with the right CA
	// but without one, or with one from another CA, is refused.
	other := fencekvtest.NewCA(t, "other CA").Issue(t, "n9", nil)
	for name, cfg := range map[string]*tls.Config{
		"no certificate": {RootCAs: ca.Pool},
		"another CA":     {RootCAs: ca.Pool, Certificates: []tls.Certificate{other.TLS}},
	} {
		conn, err := tls.Dial("tcp", leader.Raft, cfg)
		if err == nil {
			// TLS 1.3: the server's verdict on the client's certificate
			// comes with its first answer.
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			conn.Write([]byte{0})
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("raft port, %s: %v, want a refused certificate", name, err)
		}
	}
}
