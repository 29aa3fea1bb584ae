package cluster_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
)

// TestForwardedWriteCutByShutdown: a follower stopped with SIGTERM while
// a write it forwarded waits at the leader (an acquire queued for a held
// lock) answers it unavailable with outcome unknown: the leader may grant
// it after the follower gave up. It used to answer unavailable without
// an outcome, which says the command was not applied, and the leader
// then granted the lock to a client that had been told it did not get
// it: the lock stayed held, by nobody who knew, for its whole TTL (found
// by TestLinearizableMembership, whose history was illegal until those
// acquires counted as unknown).
func TestForwardedWriteCutByShutdown(t *testing.T) {
	c := clustertest.Start(t, bin(t), 3, nil)
	leader := c.Leader(t)
	f := c.Others(leader)[0]
	ctx := ctxT(t, time.Minute)
	lc := c.Dial(t, leader)
	if _, err := lc.Acquire(ctx, "job", 30*time.Second, &fencekv.AcquireOptions{Holder: "first"}); err != nil {
		t.Fatal(err)
	}
	fc := c.Dial(t, f)
	answer := make(chan error, 1)
	go func() {
		_, err := fc.Acquire(ctx, "job", 30*time.Second, &fencekv.AcquireOptions{Holder: "second", Wait: 30 * time.Second})
		answer <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := lc.LockInfo(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if in.Waiters == 1 {
			break // the forwarded acquire is queued at the leader
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forwarded acquire is not queued at the leader within 10s: %+v", in)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Stop(f)
	var err error
	select {
	case err = <-answer:
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the forwarded acquire within 30s of the follower's stop")
	}
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeUnavailable || fe.Outcome != fencekv.OutcomeUnknown {
		t.Fatalf("forwarded acquire cut short by the follower's SIGTERM: %v (%#v); want unavailable with outcome unknown", err, fe)
	}
}
