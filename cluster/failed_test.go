package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/wire"
	"github.com/hashicorp/raft"
)

// inProcessCluster starts n nodes in this process, each with a wire server
// on its client address, bootstrapped together.
func inProcessCluster(t *testing.T, n int) []*Node {
	t.Helper()
	return inProcessClusterWith(t, n, nil)
}

// inProcessClusterWith is inProcessCluster with each node's config passed
// through configure (if not nil) before it opens.
func inProcessClusterWith(t *testing.T, n int, configure func(*Config)) []*Node {
	t.Helper()
	type addrs struct{ client, raft, gossip string }
	as := make([]addrs, n)
	for i := range as {
		as[i] = addrs{clustertest.FreeAddr(t), clustertest.FreeAddr(t), clustertest.FreeAddr(t)}
	}
	nodes := make([]*Node, n)
	for i := range nodes {
		cfg := DefaultConfig()
		cfg.Name = fmt.Sprintf("n%d", i)
		cfg.Dir = t.TempDir()
		cfg.ClientAddr, cfg.RaftAddr, cfg.GossipAddr = as[i].client, as[i].raft, as[i].gossip
		cfg.BootstrapExpect = n
		for j := range as {
			if j != i {
				cfg.Join = append(cfg.Join, as[j].gossip)
			}
		}
		if configure != nil {
			configure(&cfg)
		}
		nodes[i] = serveNode(t, cfg)
	}
	return nodes
}

// leaderlessConfig is the config of a node on free loopback ports that
// waits for two more nodes to bootstrap with, which never come: it never
// has a leader.
func leaderlessConfig(t *testing.T, name string) Config {
	cfg := DefaultConfig()
	cfg.Name = name
	cfg.Dir = t.TempDir()
	cfg.ClientAddr, cfg.RaftAddr, cfg.GossipAddr = clustertest.FreeAddr(t), clustertest.FreeAddr(t), clustertest.FreeAddr(t)
	cfg.BootstrapExpect = 3
	return cfg
}

// serveNode opens a node with cfg (without fsync) and serves the protocol
// on its client address until the test ends.
func serveNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	cfg.Engine.NoSync = true
	nd, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.ClientAddr)
	if err != nil {
		nd.Close()
		t.Fatal(err)
	}
	srv, err := wire.NewServer(nd, wire.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Shutdown(context.Background())
		nd.Close()
	})
	return nd
}

func leaderOf(t *testing.T, nodes []*Node, except *Node) *Node {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, nd := range nodes {
			if ready, _ := nd.isReady(); ready && nd != except {
				return nd
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no ready leader")
	return nil
}

// TestFailedMachineHandsOverLeadership: a leader whose state machine
// fails (a storage error) stops leading: it answers the write that met the
// failure with an unknown outcome (the others apply it), hands the
// leadership over, and forwards what it is sent to the new leader, so
// every write acknowledged is read back, through it too. It used to keep
// leading, answering reads from its frozen state and every write as
// unknown while the others applied them (found in review).
func TestFailedMachineHandsOverLeadership(t *testing.T) {
	nodes := inProcessCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	old := leaderOf(t, nodes, nil)
	if _, err := old.Put(ctx, []byte("before"), []byte("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected: the disk is gone")
	old.fsm.failNext.Store(&injected)
	_, err := old.Put(ctx, []byte("met"), []byte("v"), fencekv.WriteOptions{})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeUnavailable || fe.Outcome != fencekv.OutcomeUnknown {
		t.Fatalf("the write that met the failure: %v; want unavailable, outcome unknown", err)
	}
	leader := leaderOf(t, nodes, old)
	// The old leader learns of the new term from the new leader's first
	// message, a moment after the new one is ready.
	for deadline := time.Now().Add(10 * time.Second); old.raft.State() == raft.Leader; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the failed node still leads (term %d) while %s leads too", old.raft.CurrentTerm(), leader.cfg.Name)
		}
	}
	// Through the failed node: forwarded to the new leader.
	if _, err := old.Put(ctx, []byte("after"), []byte("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatalf("a write through the failed node: %v", err)
	}
	for _, nd := range []*Node{leader, old} {
		for _, k := range []string{"before", "met", "after"} {
			e, err := nd.Get(ctx, []byte(k))
			if err != nil || !e.Found {
				t.Fatalf("%s read through %s: %+v, %v; want found", k, nd.cfg.Name, e, err)
			}
		}
	}
	if err := old.Ready(ctx); err == nil {
		t.Fatal("the failed node says it is ready")
	}
}
