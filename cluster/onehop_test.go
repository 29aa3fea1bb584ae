package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// TestForwardedNotForwardedAgain: a request on a connection that says it
// carries forwarded requests (Client.Forwarding, as the nodes' forwarders
// do) reaching a node that does not lead is answered not_leader with the
// leader's address, and is not applied; the same request from a client is
// forwarded in one hop and applied.
func TestForwardedNotForwardedAgain(t *testing.T) {
	nodes := inProcessCluster(t, 3)
	leader := leaderOf(t, nodes, nil)
	var follower *Node
	for _, nd := range nodes {
		if nd != leader {
			follower = nd
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fwd, err := wire.Dial(ctx, follower.cfg.ClientAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.Close()
	if err := fwd.Forwarding(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = fwd.Acquire(ctx, "hop/lock", time.Minute, &fencekv.AcquireOptions{Holder: "twice forwarded"})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeNotLeader || fe.Leader != leader.cfg.ClientAddr {
		t.Fatalf("forwarded acquire on a follower = %v; want not_leader naming %s", err, leader.cfg.ClientAddr)
	}
	if _, err := fwd.Put(ctx, []byte("hop/key"), []byte("v"), fencekv.WriteOptions{}); !errors.As(err, &fe) || fe.Code != fencekv.CodeNotLeader {
		t.Fatalf("forwarded put on a follower = %v; want not_leader", err)
	}
	if _, err := fwd.Get(ctx, []byte("hop/key")); !errors.As(err, &fe) || fe.Code != fencekv.CodeNotLeader {
		t.Fatalf("forwarded linearizable get on a follower = %v; want not_leader", err)
	}

	cl, err := wire.Dial(ctx, follower.cfg.ClientAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	in, err := cl.LockInfo(ctx, "hop/lock")
	if err != nil || in.Held {
		t.Fatalf("lock after the refused forwarded acquire: %+v, %v; want free", in, err)
	}
	if e, err := cl.Get(ctx, []byte("hop/key")); err != nil || e.Found {
		t.Fatalf("key after the refused forwarded put: %+v, %v; want none", e, err)
	}
	// A client's request to the follower makes its one hop.
	l, err := cl.Acquire(ctx, "hop/lock", time.Minute, &fencekv.AcquireOptions{Holder: "client"})
	if err != nil {
		t.Fatal(err)
	}
	// And the forwarder's connection is served on the leader.
	lf, err := wire.Dial(ctx, leader.cfg.ClientAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := lf.Forwarding(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lf.Release(ctx, "hop/lock", l.Token); err != nil {
		t.Fatalf("forwarded release on the leader: %v", err)
	}
}
