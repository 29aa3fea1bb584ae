package diskfault_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/diskfault"
)

// TestPowerLossCluster: the power goes off under all three nodes of a
// cluster at once. Under load (puts and grants through every node), the
// followers' next raft log fsync hangs (the entries they were sent are in
// their page cache, unsynced: at least one follower's), and the leader's
// second one (its next entries too, if a write comes in time); then every node is stopped
// (SIGSTOP, all, then SIGKILL) and its files rebuilt as a power cut
// leaves them: each raft log segment as its fsyncs left it, with its
// unsynced writes dropped, partly kept or torn; each state file as its
// last commit. raft.db (term and vote: raft-boltdb, a synced bbolt commit
// per change) and the snapshots are left as the kill left them. `fencekv
// check` finds every dir sound; the three restart, elect a leader and
// serve; every acknowledged write and grant is there, and the next grant's
// token is above every one granted.
func TestPowerLossCluster(t *testing.T) {
	for _, mode := range []diskfault.Mode{diskfault.Clean, diskfault.Partial, diskfault.Torn} {
		t.Run(string(mode), func(t *testing.T) { powerLossCluster(t, mode) })
	}
}

func powerLossCluster(t *testing.T, mode diskfault.Mode) {
	dir := t.TempDir()
	fps, recs := map[string]string{}, map[string]string{}
	for i := range 3 {
		name := fmt.Sprintf("n%d", i)
		fps[name] = filepath.Join(dir, name+".fp")
		recs[name] = filepath.Join(dir, name+".power")
	}
	c := clustertest.Start(t, failpointsBin(t), 3, &clustertest.Options{
		Env: func(name string) []string {
			return []string{"FENCEKV_FAILPOINTS_FILE=" + fps[name], diskfault.PowerLossEnv + "=" + recs[name]}
		},
	})
	leader := c.Leader(t)
	h := newHistory()
	stop := make(chan struct{})
	// Two writers per node: while some wait for a commit, others bring
	// the leader new entries.
	wg1, wg2 := load(t, c, h, stop), load(t, c, h, stop)
	defer func() { close(stop); wg1.Wait(); wg2.Wait() }()
	waitFor(t, 30*time.Second, "load and checkpoints", func() error {
		w, g := h.counts()
		if w < 100 || g < 100 {
			return fmt.Errorf("%d writes, %d grants acknowledged", w, g)
		}
		for _, nd := range c.Nodes {
			b, _ := os.ReadFile(filepath.Join(recs[nd.Name], "journal"))
			if k := strings.Count(string(b), "\nd "); k < 3 {
				return fmt.Errorf("%s: %d state file commits recorded", nd.Name, k)
			}
		}
		return nil
	})

	// The followers first: the entries of the leader's next sync reach
	// them armed.
	for _, nd := range c.Others(leader) {
		arm(t, fps[nd.Name], "raftlog.sync=stall:1m@1")
	}
	arm(t, fps[leader.Name], "raftlog.sync=stall:1m@2")
	stalled := func() (names []string) {
		for _, nd := range c.Nodes {
			want := "raftlog.sync hit 1: stalling"
			if nd == leader {
				want = "raftlog.sync hit 2: stalling"
			}
			if strings.Contains(nd.Log(), want) {
				names = append(names, nd.Name)
			}
		}
		return names
	}
	// A follower behind the others may get nothing more before the
	// leader's fsync hangs too: one is enough, all three are waited for
	// a little.
	waitFor(t, 10*time.Second, "a follower's fsync to hang", func() error {
		for _, nd := range c.Others(leader) {
			if strings.Contains(nd.Log(), "raftlog.sync hit 1: stalling") {
				return nil
			}
		}
		return fmt.Errorf("the followers' fsyncs do not hang yet")
	})
	for deadline := time.Now().Add(2 * time.Second); len(stalled()) < 3 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%s leads; the fsyncs of %v hang (unsynced writes in their page cache)", leader.Name, stalled())
	for _, nd := range c.Nodes {
		c.Pause(nd)
	}
	for _, nd := range c.Nodes {
		c.Kill(nd)
	}

	unsynced, torn := 0, 0
	for _, nd := range c.Nodes {
		cut, err := diskfault.PowerCut(nd.Dir, recs[nd.Name], mode)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", nd.Name, cut)
		unsynced += cut.Unsynced()
		torn += cut.Torn()
		r, status, out := fencekvCheck(t, c.Bin, nd.Dir)
		if status != 0 || !r.OK || r.RaftLog == nil || !r.RaftLog.OK || r.RaftLog.Torn != (cut.Torn() > 0) {
			t.Errorf("fencekv check of %s after a %s power cut: exit %d: %s\nwant exit 0, the raft log sound, torn %v", nd.Name, mode, status, out, cut.Torn() > 0)
		} else {
			t.Logf("%s: fencekv check: raft log entries to %d, torn %v", nd.Name, r.RaftLog.Last, r.RaftLog.Torn)
		}
		arm(t, fps[nd.Name], "")
	}
	if unsynced < 1 {
		t.Fatalf("the kill left no unsynced write to lose")
	}
	if mode == diskfault.Torn && torn < 1 {
		t.Fatalf("no log torn")
	}

	for _, nd := range c.Nodes {
		c.Restart(nd)
	}
	next := c.Leader(t)
	c.WaitWritable(t, 30*time.Second)
	t.Logf("%s leads after the power cut", next.Name)
	h.check(t, c)
	var top fencekv.Token
	h.mu.Lock()
	for tok := range h.tokens {
		top = max(top, tok)
	}
	h.mu.Unlock()
	l, err := c.Dial(t, next).Acquire(ctx(t), "after-the-power-cut", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= top {
		t.Errorf("after the power cut, token %d was issued; %d was granted before", l.Token, top)
	}
	t.Logf("the next token is %d (top granted %d)", l.Token, top)
}
