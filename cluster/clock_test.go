package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

// TestClusterLeaseTimeFromClock: a cluster node measures lease time on
// the engine's Clock (Config.Engine.Clock), as a single node does, so a
// fake clock drives grants, renewals and expiry with no waiting: a lease
// is held until the clock passes its TTL, however long the test really
// takes, and expires (the leader proposing it) once the clock does,
// however little real time passed. The node used to read the system
// clock whatever the config said.
func TestClusterLeaseTimeFromClock(t *testing.T) {
	clk := fencekvtest.NewClock()
	nodes := inProcessClusterWith(t, 3, func(c *Config) { c.Engine.Clock = clk })
	leader := leaderOf(t, nodes, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ttl = 10 * time.Second

	a, err := leader.Acquire(ctx, "job", ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leader.Put(ctx, []byte("k"), []byte("a"), fencekv.WriteOptions{Lock: "job", Token: a.Token}); err != nil {
		t.Fatalf("held write: %v", err)
	}
	clk.Advance(9 * time.Second)
	in, err := leader.LockInfo(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if !in.Held || in.Token != a.Token || in.TTL != time.Second {
		t.Fatalf("after 9 s of a 10 s lease: held %v token %d ttl left %v, want held, %d, 1s", in.Held, in.Token, in.TTL, a.Token)
	}
	if left, err := leader.Renew(ctx, "job", a.Token); err != nil || left != ttl {
		t.Fatalf("renew: %v %v, want %v", left, err, ttl)
	}
	clk.Advance(9 * time.Second) // 18 s after the grant, 9 s after the renewal
	if _, err := leader.Put(ctx, []byte("k"), []byte("a2"), fencekv.WriteOptions{Lock: "job", Token: a.Token}); err != nil {
		t.Fatalf("held write 9 s after the renewal: %v", err)
	}

	clk.Advance(2 * time.Second) // past the renewed TTL
	until(t, "the leader expires the lease", 30*time.Second, func() error {
		// The expiry loop may have armed its timer just after the
		// advance, for the remaining time as it saw it: nudge the clock.
		clk.Advance(time.Millisecond)
		in, err := leader.LockInfo(ctx, "job")
		if err != nil {
			return err
		}
		if in.Held {
			return fmt.Errorf("still held, ttl left %v", in.TTL)
		}
		return nil
	})
	_, err = leader.Put(ctx, []byte("k"), []byte("late"), fencekv.WriteOptions{Lock: "job", Token: a.Token})
	if !errors.Is(err, fencekv.ErrLeaseExpired) && !errors.Is(err, fencekv.ErrNotHolder) {
		t.Fatalf("held write after expiry: %v, want lease_expired or not_holder", err)
	}
	b, err := leader.Acquire(ctx, "job", ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Token <= a.Token {
		t.Fatalf("new token %d not above the expired lease's %d", b.Token, a.Token)
	}
	// Every node's clock is the same fake: a follower reads the lock
	// with the same TTL left.
	for _, nd := range nodes {
		if nd == leader {
			continue
		}
		until(t, "a follower sees the new lease", 30*time.Second, func() error {
			in, err := nd.LockInfo(fencekv.WithStaleReads(ctx), "job")
			if err != nil {
				return err
			}
			if !in.Held || in.Token != b.Token || in.TTL != ttl {
				return fmt.Errorf("follower %s: held %v token %d ttl %v", nd.cfg.Name, in.Held, in.Token, in.TTL)
			}
			return nil
		})
	}
}

// until retries fn every few milliseconds until it succeeds or within
// passes.
func until(t *testing.T, what string, within time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, within, err)
		}
		time.Sleep(5 * time.Millisecond) // a poll's interval: fn checks the condition
	}
}
