package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestReapedNodeNotListed: once the leader has reaped a node (removed it
// from raft after --reap-after), no node lists it among the members any
// more, nor counts it in fencekv_cluster_members. It used to stay listed,
// as left or dead, for as long as each node that had seen it ran, while a
// node that joined later did not list it: the views disagreed, and a
// routine replacement left a dead member on the dashboards for good
// (found by TestLinearizableMembership).
func TestReapedNodeNotListed(t *testing.T) {
	nodes := inProcessClusterWith(t, 3, func(c *Config) { c.ReapAfter = 300 * time.Millisecond })
	leader := leaderOf(t, nodes, nil)
	var gone *Node
	for _, nd := range nodes {
		if nd != leader {
			gone = nd
		}
	}
	name := gone.cfg.Name
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for inConfig(t, leader, name) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not reaped within 30s", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, nd := range nodes {
		if nd == gone {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			ms, err := nd.Members(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			listed := ""
			for _, m := range ms {
				if m.Node == name {
					listed = m.State
				}
			}
			if listed == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still lists %s (%s) 10s after it was reaped", nd.cfg.Name, name, listed)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func inConfig(t *testing.T, nd *Node, name string) bool {
	t.Helper()
	f := nd.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == raft.ServerID(name) {
			return true
		}
	}
	return false
}
