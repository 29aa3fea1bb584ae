package cluster_test

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
)

// TestFollowerReadsAnsweredLocally: a linearizable get through a
// follower that has applied the log is answered from the follower's own
// state, with a read index from the leader, not forwarded: the follower
// counts it (fencekv_follower_reads_total), the leader answers read_index
// asks and no get. Concurrent gets share the asks. A get through the
// follower right after each write acknowledged by the leader returns that
// write (answered locally, or forwarded when the follower has yet to
// learn the write is committed).
func TestFollowerReadsAnsweredLocally(t *testing.T) {
	c := clustertest.Start(t, bin(t), 3, nil)
	ctx := ctxT(t, 2*time.Minute)
	leader := c.Leader(t)
	f := c.Others(leader)[0]
	lcl, fcl := c.Dial(t, leader), c.Dial(t, f)
	if _, err := lcl.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the follower applies the write", 30*time.Second, func() error {
		e, err := fcl.Get(fencekv.WithStaleReads(ctx), []byte("k"))
		if err == nil && string(e.Value) != "v" {
			err = fmt.Errorf("k = %q", e.Value)
		}
		return err
	})
	leaderGets := func() float64 {
		n, _ := metric(t, leader, `fencekv_requests_total{code="ok",method="get"}`)
		return n
	}
	asks := func() float64 {
		n, _ := metric(t, leader, `fencekv_requests_total{code="ok",method="read_index"}`)
		return n
	}
	local := func() float64 {
		n, _ := metric(t, f, `fencekv_follower_reads_total`)
		return n
	}
	gets0, asks0, local0 := leaderGets(), asks(), local()

	// 8 connections to the follower, 25 gets each, at once.
	const conns, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for range conns {
		cl := c.Dial(t, f)
		wg.Go(func() {
			for range each {
				e, err := cl.Get(ctx, []byte("k"))
				if err == nil && string(e.Value) != "v" {
					err = fmt.Errorf("k = %q; want v", e.Value)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if d := leaderGets() - gets0; d != 0 {
		t.Errorf("the leader answered %v gets: the follower forwarded them", d)
	}
	if d := local() - local0; d != conns*each {
		t.Errorf("the follower counts %v reads answered locally; want %d", d, conns*each)
	}
	d := asks() - asks0
	if d < 1 || d > conns*each {
		t.Errorf("%v read_index asks for %d gets", d, conns*each)
	}
	t.Logf("%d gets through the follower: %v read_index asks", conns*each, d)

	// Read after write: each write acknowledged through the leader is
	// what the follower's next linearizable get returns.
	for i := range 100 {
		v := strconv.Itoa(i)
		if _, err := lcl.Put(ctx, []byte("rw"), []byte(v), fencekv.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		e, err := fcl.Get(ctx, []byte("rw"))
		if err != nil {
			t.Fatal(err)
		}
		if string(e.Value) != v {
			t.Fatalf("get through the follower after write %s was acknowledged = %q", v, e.Value)
		}
	}
}

// TestReadIndexOnlyFromTheLeader: read_index (the ask behind follower
// reads) is answered by the leader alone, with an index at or above every
// write it acknowledged; a follower answers not_leader naming the leader.
func TestReadIndexOnlyFromTheLeader(t *testing.T) {
	c := clustertest.Start(t, bin(t), 3, nil)
	ctx := ctxT(t, time.Minute)
	leader := c.Leader(t)
	lcl := c.Dial(t, leader)
	res, err := lcl.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(leader)
	if err != nil {
		t.Fatal(err)
	}
	index, err := lcl.ReadIndex(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if index < st.Applied {
		t.Fatalf("read_index = %d, below the index %d the leader had applied after write %+v", index, st.Applied, res)
	}
	for _, f := range c.Others(leader) {
		_, err := c.Dial(t, f).ReadIndex(ctx)
		var fe *fencekv.Error
		if !errors.As(err, &fe) || fe.Code != fencekv.CodeNotLeader || fe.Leader != leader.Client {
			t.Errorf("read_index on follower %s = %v; want not_leader naming %s", f.Name, err, leader.Client)
		}
	}
}
