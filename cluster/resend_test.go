package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// TestRouteResendsReadAfterLostConnection: a read forwarded to the leader
// whose connection breaks with the read in flight (the leader died, or
// stepped down and closed it) is sent again, to the leader raft names
// next, within the hold timeout: a read changes nothing, so nothing can
// have been applied. It was answered unavailable ("lost the connection to
// the leader"), which a client had to retry itself (found while chasing a
// Python conformance timeout). A write whose connection broke after it
// was sent is not sent again: its outcome is unknown.
func TestRouteResendsReadAfterLostConnection(t *testing.T) {
	nodes := inProcessCluster(t, 3)
	leader := leaderOf(t, nodes, nil)
	var f *Node
	for _, nd := range nodes {
		if nd != leader {
			f = nd
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := leader.Put(ctx, []byte("resend/k"), []byte("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	lost := &wire.ConnError{Addr: leader.cfg.ClientAddr, Outcome: fencekv.OutcomeUnknown, Err: errors.New("connection reset by peer")}
	toLeader := func(context.Context) (fencekv.Entry, error) {
		return fencekv.Entry{}, errForward{leader.cfg.ClientAddr}
	}

	sends := 0
	e, err := route(ctx, f, false, toLeader, func(c *wire.Client) (fencekv.Entry, error) {
		sends++
		if sends == 1 {
			return fencekv.Entry{}, lost
		}
		return c.Get(ctx, []byte("resend/k"))
	})
	if err != nil || string(e.Value) != "v" {
		t.Fatalf("a read whose forward lost its connection = %q, %v; want it sent again and answered", e.Value, err)
	}
	if sends != 2 {
		t.Fatalf("the read was sent %d times; want 2", sends)
	}

	sends = 0
	_, err = route(ctx, f, true, toLeader, func(c *wire.Client) (fencekv.Entry, error) {
		sends++
		return fencekv.Entry{}, lost
	})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeUnavailable || fe.Outcome != fencekv.OutcomeUnknown {
		t.Fatalf("a write whose forward lost its connection = %v; want unavailable, outcome unknown", err)
	}
	if sends != 1 {
		t.Fatalf("the write was sent %d times; want once (it may have been applied)", sends)
	}
}
