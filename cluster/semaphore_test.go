package cluster_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// TestSemaphoreHistoryFailover: eight clients take, hold and release
// permits of a semaphore of limit 3 on a three-node cluster while its
// leader is killed (kill -9) and another takes over. The history they saw
// never has more than 3 permits live at once, and its tokens are unique
// and rise with real time, across the failover (CheckSemaphore).
func TestSemaphoreHistoryFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes and real time")
	}
	c := clustertest.Start(t, bin(t), 3, nil)
	leader := c.Leader(t)
	addrs := []string{leader.Client}
	for _, nd := range c.Others(leader) {
		addrs = append(addrs, nd.Client)
	}
	var clients []*wire.Client
	for range 8 {
		cl, err := wire.DialCluster(ctxT(t, time.Minute), addrs, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients = append(clients, cl)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		ps []fencekvtest.Permit
		st fencekvtest.SemStats
	}
	done := make(chan result, 1)
	var granted atomic.Int64
	const ttl = 3 * time.Second
	start := time.Now()
	go func() {
		ps, st := fencekvtest.RunSemaphore(ctx, clients, fencekvtest.SemWorkload{
			Name: "S", Limit: 3, TTL: ttl, Hold: 20 * time.Millisecond,
			Wait: time.Second, Retries: 10 * time.Second, Granted: &granted})
		done <- result{ps, st}
	}()
	fencekvtest.Eventually(t, 30*time.Second, "200 permits granted before the kill", func() bool { return granted.Load() >= 200 })
	c.Kill(leader)
	killed, base := time.Now(), granted.Load()
	t.Logf("%d permits in %v; %s killed", base, killed.Sub(start).Round(time.Millisecond), leader.Name)
	next := c.Leader(t)
	t.Logf("%s leads after %v", next.Name, time.Since(killed).Round(time.Millisecond))
	// Past the TTL of the permits held at the kill (the new leader gives
	// them their full TTL again), and 200 more grants.
	fencekvtest.Eventually(t, 60*time.Second, "200 more permits, past the TTL after the kill", func() bool {
		return granted.Load() >= base+200 && time.Since(killed) > 2*ttl
	})
	cancel()
	r := <-done
	t.Logf("%d permits, %+v", len(r.ps), r.st)
	if err := fencekvtest.CheckSemaphore(r.ps, 3); err != nil {
		t.Fatal(err)
	}
	var before, after int
	for _, p := range r.ps {
		if p.Ack.Before(killed) {
			before++
		} else {
			after++
		}
	}
	// 200 counted before the kill, 200 more after it: of those, a few
	// (at most one per client) may have been answered just before it.
	if before < 200 || after < 200-len(clients) {
		t.Fatalf("%d permits granted before the kill, %d after; want at least 200 and %d", before, after, 200-len(clients))
	}
}
