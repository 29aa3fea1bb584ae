package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// TestElectionFailover: three candidates campaign for one election on a
// three-node cluster, each leading for a few fenced writes and resigning,
// while the cluster's raft leader is killed with -9 (and restarted), then
// paused with SIGSTOP (and resumed). Candidates reach the cluster through
// every node and ride the failovers. Every write is fenced by its
// leader's epoch on the election's lock; the accepted ones, in revision
// order, never go back to an older epoch and each carries its epoch as
// fence: never two leaders whose epochs are both accepted out of order.
func TestElectionFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes and real time")
	}
	c := clustertest.Start(t, bin(t), 3, nil)
	var addrs []string
	for _, nd := range c.Nodes {
		addrs = append(addrs, nd.Client)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type write struct {
		rev   fencekv.Revision
		fence fencekv.Token
		epoch fencekv.Token
	}
	var mu sync.Mutex
	var accepted []write
	var terms []fencekv.Token // each leadership's epoch, as its candidate got it
	var wg sync.WaitGroup
	for i := range 3 {
		cl, err := wire.DialCluster(ctxT(t, time.Minute), slices.Concat(addrs[i:], addrs[:i]), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Go(func() {
			for ctx.Err() == nil {
				l, err := cl.Campaign(ctx, "e", fmt.Sprintf("c%d", i), 2*time.Second, nil)
				if err != nil {
					continue // ended, or the cluster was unavailable: campaign again
				}
				mu.Lock()
				terms = append(terms, l.Token)
				mu.Unlock()
				for n := 0; n < 20 && l.Err() == nil; n++ {
					wctx, wcancel := context.WithTimeout(l.Context(), 2*time.Second)
					r, err := cl.Put(wctx, []byte("e/k"), []byte(fmt.Sprint(l.Token)), fencekv.WriteOptions{Lock: "e", Token: l.Token})
					wcancel()
					if err == nil {
						mu.Lock()
						accepted = append(accepted, write{r.Revision, r.Fence, l.Token})
						mu.Unlock()
					}
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				l.Resign(rctx)
				rcancel()
			}
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted)
	}
	fencekvtest.Eventually(t, 30*time.Second, "100 accepted writes", func() bool { return count() >= 100 })
	leader := c.Leader(t)
	c.Kill(leader)
	base := count()
	fencekvtest.Eventually(t, 60*time.Second, "100 more writes after the leader's kill -9", func() bool { return count() >= base+100 })
	c.Restart(leader)
	leader = c.Leader(t)
	c.Pause(leader)
	time.Sleep(3 * time.Second) // the pause lasts past the leaderships' TTL: the point of it
	c.Resume(leader)
	base = count()
	fencekvtest.Eventually(t, 60*time.Second, "100 more writes after the leader's pause", func() bool { return count() >= base+100 })
	cancel()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(accepted, func(a, b write) int { return int(a.rev) - int(b.rev) })
	var last fencekv.Token
	epochs := 0
	for _, w := range accepted {
		if w.fence != w.epoch {
			t.Fatalf("write at revision %d in epoch %d has fence %d", w.rev, w.epoch, w.fence)
		}
		if w.epoch < last {
			t.Fatalf("accepted write of epoch %d at revision %d after one of epoch %d: two leaders accepted out of order", w.epoch, w.rev, last)
		}
		if w.epoch != last {
			epochs++
		}
		last = w.epoch
	}
	t.Logf("%d accepted writes in %d epochs; %d leaderships", len(accepted), epochs, len(terms))
	if epochs < 3 {
		t.Fatalf("only %d epochs wrote: the election did not move", epochs)
	}
}
