package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
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
	// A leader is ready once a quorum has its entries: the other follower
	// may not have heard from it yet, and would rightly answer not_leader
	// naming no leader. Wait until this one knows the leader.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if addr, ok := follower.leaderClientAddr(); ok && addr == leader.cfg.ClientAddr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower %s never learned that %s leads", follower.cfg.Name, leader.cfg.Name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fwd := dialForwarder(t, ctx, follower.cfg.ClientAddr)
	_, err := fwd.Acquire(ctx, "hop/lock", time.Minute, &fencekv.AcquireOptions{Holder: "twice forwarded"})
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
	lf := dialForwarder(t, ctx, leader.cfg.ClientAddr)
	if err := lf.Release(ctx, "hop/lock", l.Token); err != nil {
		t.Fatalf("forwarded release on the leader: %v", err)
	}
}

// TestForwardedToNodeWithoutLeader: a forwarded request reaching a node
// that knows no leader, and is not taking the leadership itself, is
// answered not_leader at once rather than held there for the hold
// timeout: held, it could be applied after the node that forwarded it had
// answered its client, if this node won the next election.
func TestForwardedToNodeWithoutLeader(t *testing.T) {
	cfg := leaderlessConfig(t, "alone")
	cfg.HoldTimeout = 20 * time.Second
	serveNode(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fwd := dialForwarder(t, ctx, cfg.ClientAddr)
	_, err := fwd.Acquire(ctx, "hop/lock", time.Minute, nil)
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeNotLeader || fe.Leader != "" {
		t.Fatalf("forwarded acquire on a node without a leader = %v; want not_leader naming none, at once", err)
	}
	// A backup on such a connection looks for no leader to dial either
	// (it once dialed the empty address).
	if _, err := fwd.Backup(ctx); !errors.As(err, &fe) || fe.Code != fencekv.CodeNotLeader {
		t.Fatalf("backup on a marked connection to a node without a leader = %v; want not_leader", err)
	}
}

// TestRouteAfterNotLeader: a node that forwarded a request to a node that
// turned out not to lead (raft had named it: a stale view) hears
// not_leader, waits for raft to name the leader, and sends the request
// there; if raft keeps naming a node that does not lead, the request is
// answered unavailable, not applied, after the hold timeout.
func TestRouteAfterNotLeader(t *testing.T) {
	nodes := inProcessCluster(t, 3)
	leader := leaderOf(t, nodes, nil)
	var followers []*Node
	for _, nd := range nodes {
		if nd != leader {
			followers = append(followers, nd)
		}
	}
	f, g := followers[0], followers[1]
	// f's forwarder drops its connection to g when it hears that the
	// leader is another node: let it hear that first, or the stale
	// forward below may be cut short by it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		f.fwd.mu.Lock()
		heard := f.fwd.leader
		f.fwd.mu.Unlock()
		if heard == leader.cfg.ClientAddr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower %s never heard that %s leads", f.cfg.Name, leader.cfg.Name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acquire := func(c *wire.Client) (fencekv.Lease, error) {
		return c.Acquire(ctx, "hop/route", time.Minute, &fencekv.AcquireOptions{Holder: "route"})
	}

	stale := 0
	l, err := route(ctx, f, true, func(ctx context.Context) (fencekv.Lease, error) {
		if stale < 2 {
			stale++
			return fencekv.Lease{}, errForward{g.cfg.ClientAddr} // raft's view is behind: g does not lead
		}
		return f.acquire(ctx, "hop/route", time.Minute, fencekv.AcquireOptions{Holder: "route"})
	}, acquire)
	if err != nil {
		t.Fatalf("route after not_leader: %v", err)
	}
	in, err := leader.LockInfo(ctx, "hop/route")
	if err != nil || !in.Held || in.Token != l.Token || in.Holder != "route" {
		t.Fatalf("lock after the routed acquire: %+v, %v; want held by token %d", in, err, l.Token)
	}

	began := time.Now()
	_, err = route(ctx, f, true, func(context.Context) (fencekv.Lease, error) {
		return fencekv.Lease{}, errForward{g.cfg.ClientAddr}
	}, func(c *wire.Client) (fencekv.Lease, error) {
		return c.Acquire(ctx, "hop/never", time.Minute, nil)
	})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeUnavailable || fe.Outcome != "" {
		t.Fatalf("route to a node that never leads = %v; want unavailable, not applied", err)
	}
	if d := time.Since(began); d < f.cfg.HoldTimeout {
		t.Errorf("answered after %v; want the hold timeout (%v) first", d, f.cfg.HoldTimeout)
	}
	if in, err := leader.LockInfo(ctx, "hop/never"); err != nil || in.Held {
		t.Fatalf("lock after the refused route: %+v, %v; want free", in, err)
	}
}

// dialForwarder connects to addr as a node's forwarder does: the
// connection is marked (Client.Forwarding). It is closed when the test
// ends.
func dialForwarder(t *testing.T, ctx context.Context, addr string) *wire.Client {
	t.Helper()
	c, err := wire.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Forwarding(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestHoldTimeoutBoundsAllWaits: the hold timeout bounds all of a
// request's waits for a leader together, counted from when it reached the
// node. Each wait used to start a hold timeout of its own, so a request
// that waited for a leader, was sent to one that could not be reached,
// and waited again took up to twice the hold timeout (found in review).
func TestHoldTimeoutBoundsAllWaits(t *testing.T) {
	cfg := leaderlessConfig(t, "alone")
	cfg.HoldTimeout = 3 * time.Second
	nd := serveNode(t, cfg)
	gone := clustertest.FreeAddr(t) // nothing listens: a leader that cannot be reached
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	began := time.Now()
	tries := 0
	_, err := route(ctx, nd, true, func(ctx context.Context) (fencekv.Lease, error) {
		tries++
		if tries == 1 {
			// Wait for a leader for two thirds of the hold timeout,
			// then take raft to name one that cannot be reached.
			wctx, wcancel := context.WithTimeout(ctx, 2*cfg.HoldTimeout/3)
			defer wcancel()
			if _, err := nd.awaitReady(wctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("first wait for a leader = %v; want the test's own deadline", err)
			}
			return fencekv.Lease{}, errForward{gone}
		}
		_, err := nd.awaitReady(ctx)
		return fencekv.Lease{}, err
	}, func(c *wire.Client) (fencekv.Lease, error) {
		t.Error("the unreachable leader was reached")
		return fencekv.Lease{}, nil
	})
	d := time.Since(began)
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeUnavailable || fe.Outcome != "" {
		t.Fatalf("route with no leader = %v; want unavailable, not applied", err)
	}
	if tries < 2 {
		t.Fatalf("local tried %d times; want the wait after the unreachable leader too", tries)
	}
	// Before the fix: 2 s, then the second wait's own 3 s.
	if d < cfg.HoldTimeout || d > cfg.HoldTimeout+time.Second {
		t.Errorf("answered after %v; want the hold timeout (%v), all waits together", d, cfg.HoldTimeout)
	}
}
