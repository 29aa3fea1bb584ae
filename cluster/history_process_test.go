package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// TestWatchHistoryClusterRestarts: wire watches on a three-node cluster,
// under put and lock load through the third node, resume with no gap and
// no repeat (fencekvtest.CheckHistory) across a kill -9 and restart of
// the node one watches (it resumes on that node, from the history its
// data file and raft log kept), and across a kill -9 of the leader the
// other watches (it resumes on another node, from that node's history).
// A watch from revision 1 on each restarted node replays exactly what
// the first watch got: every node keeps the same history, durably.
func TestWatchHistoryClusterRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts cluster processes")
	}
	c := clustertest.Start(t, bin(t), 3, nil)
	ctx := ctxT(t, 3*time.Minute)
	leader := c.Leader(t)
	others := c.Others(leader)
	watched, writer := others[0], others[1]

	// Both from revision 1 (the cluster's first put, clustertest's own):
	// a watch from now starts where its node is, and a follower may lag.
	onNode, err := wire.Watch(ctx, []string{watched.Client}, fencekv.WatchOptions{Locks: true, StartRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer onNode.Close()
	onLeader, err := wire.Watch(ctx, []string{leader.Client, watched.Client}, fencekv.WatchOptions{Locks: true, StartRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer onLeader.Close()
	nodeLog, leaderLog := fencekvtest.CollectEvents(onNode), fencekvtest.CollectEvents(onLeader)
	cl := c.Dial(t, writer)
	wr := fencekvtest.StartHistoryWriter(cl, "h/")
	stopped := false
	defer func() {
		if !stopped {
			wr.Stop()
		}
	}()

	wr.WaitPuts(t, 150, time.Minute)
	c.Kill(watched) // in the middle of the load
	n := wr.Puts()
	wr.WaitPuts(t, n+100, time.Minute)
	c.Restart(watched)
	// The restarted node serves the whole history, not only what its raft
	// log replayed after the data file's last checkpoint.
	fromOne := watchFromOne(t, ctx, watched)
	defer fromOne.Close()
	restartedLog := fencekvtest.CollectEvents(fromOne)
	n = wr.Puts()
	wr.WaitPuts(t, n+100, time.Minute)
	c.Kill(leader) // a failover: the watch on it moves to the watched node
	n = wr.Puts()
	wr.WaitPuts(t, n+150, time.Minute)
	acked := wr.Stop()
	stopped = true

	eventually(t, "a put of mark", 30*time.Second, func() error {
		_, err := cl.Put(ctx, []byte("mark"), nil, fencekv.WriteOptions{})
		return err
	})
	got := nodeLog.UntilKey(t, "mark", time.Minute)
	if err := fencekvtest.CheckHistory(got, acked, 1); err != nil {
		t.Fatalf("the watch on %s, across its kill -9 and restart: %v", watched.Name, err)
	}
	if err := onNode.Err(); err != nil {
		t.Fatalf("the watch on %s failed: %v", watched.Name, err)
	}
	fromLeader := leaderLog.UntilKey(t, "mark", time.Minute)
	if err := fencekvtest.SameEvents(fromLeader, got); err != nil {
		t.Fatalf("the watch on the leader %s, across its kill -9 (resumed on %s): %v", leader.Name, watched.Name, err)
	}
	if err := onLeader.Err(); err != nil {
		t.Fatalf("the watch on the leader failed: %v", err)
	}
	if err := fencekvtest.SameEvents(restartedLog.UntilKey(t, "mark", time.Minute), got); err != nil {
		t.Fatalf("a watch from revision 1 on %s, restarted: %v", watched.Name, err)
	}

	// The killed leader, restarted, catches up and replays the same.
	c.Restart(leader)
	r := watchFromOne(t, ctx, leader)
	defer r.Close()
	if err := fencekvtest.SameEvents(fencekvtest.CollectEvents(r).UntilKey(t, "mark", time.Minute), got); err != nil {
		t.Fatalf("a watch from revision 1 on the restarted %s: %v", leader.Name, err)
	}
	t.Logf("%d events, %d changes acknowledged", len(got), len(acked))
}

// watchFromOne starts a watch from revision 1 on nd alone, once it
// answers.
func watchFromOne(t *testing.T, ctx context.Context, nd *clustertest.Node) *wire.Watcher {
	t.Helper()
	var w *wire.Watcher
	eventually(t, "a watch from revision 1 on "+nd.Name, 30*time.Second, func() (err error) {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		w, err = wire.Watch(wctx, []string{nd.Client}, fencekv.WatchOptions{Locks: true, StartRevision: 1})
		return err
	})
	return w
}
