package diskfault_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
)

// faultCluster starts n nodes, each with its own failpoints file
// (fps[name]).
func faultCluster(t *testing.T, n int) (*clustertest.Cluster, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	fps := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("n%d", i)
		fps[name] = filepath.Join(dir, name+".fp")
	}
	c := clustertest.Start(t, failpointsBin(t), n, &clustertest.Options{
		Env: func(name string) []string { return []string{"FENCEKV_FAILPOINTS_FILE=" + fps[name]} },
	})
	return c, fps
}

// history is what clients were told: the writes acknowledged, and the
// tokens granted.
type history struct {
	mu     sync.Mutex
	acked  map[string]string
	tokens map[fencekv.Token]string // token -> lock it was granted for
	dupes  []string
}

// load runs a writer per node, through that node (a follower forwards to
// the leader), each putting its own keys and taking its own locks, until
// stop is closed.
func load(t *testing.T, c *clustertest.Cluster, h *history, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for wi, nd := range c.Nodes {
		cl := c.Dial(t, nd)
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%04d", wi, i), fmt.Sprintf("v%d", i)
				cx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				_, err := cl.Put(cx, []byte(k), []byte(v), fencekv.WriteOptions{})
				if err == nil {
					h.mu.Lock()
					h.acked[k] = v
					h.mu.Unlock()
				}
				name := fmt.Sprintf("lock-w%d-%04d", wi, i)
				l, err := cl.Acquire(cx, name, time.Minute, nil)
				cancel()
				if err == nil {
					h.mu.Lock()
					if prev, ok := h.tokens[l.Token]; ok {
						h.dupes = append(h.dupes, fmt.Sprintf("token %d granted for %s and %s", l.Token, prev, name))
					}
					h.tokens[l.Token] = name
					h.mu.Unlock()
				}
				if err != nil {
					time.Sleep(10 * time.Millisecond) // no leader: do not spin
				}
			}
		})
	}
	return &wg
}

// check reads every acknowledged write back through nd and checks that
// no token was granted twice.
func (h *history) check(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.dupes {
		t.Error(d)
	}
	var nd *clustertest.Node
	for _, n := range c.Nodes {
		if n.Running() {
			nd = n
			break
		}
	}
	cl := c.Dial(t, nd)
	for k, v := range h.acked {
		e, err := cl.Get(ctx(t), []byte(k))
		if err != nil || string(e.Value) != v {
			t.Errorf("acknowledged %s=%s reads %q, %v", k, v, e.Value, err)
		}
	}
	for tok, name := range h.tokens {
		in, err := cl.LockInfo(ctx(t), name)
		if err != nil || in.Token != tok {
			t.Errorf("lock %s was granted with token %d; it reads %+v, %v", name, tok, in, err)
		}
	}
	t.Logf("history: %d writes and %d grants acknowledged, all read back", len(h.acked), len(h.tokens))
	if len(h.acked) == 0 || len(h.tokens) == 0 {
		t.Errorf("the history is empty: %d writes, %d grants acknowledged", len(h.acked), len(h.tokens))
	}
}

// TestLeaderRaftLogStall: the leader's raft log fsync hangs for 5s, ten
// election timeouts. A new leader must take over while it hangs; once its
// disk returns, the old leader acknowledges nothing that was not
// committed (every acknowledged write reads back, no token is granted
// twice), and it rejoins as a follower.
func TestLeaderRaftLogStall(t *testing.T) {
	c, fps := faultCluster(t, 3)
	old := c.Leader(t)
	st0, err := c.Status(old)
	if err != nil {
		t.Fatal(err)
	}
	h := &history{acked: map[string]string{}, tokens: map[fencekv.Token]string{}}
	stop := make(chan struct{})
	wg := load(t, c, h, stop)
	defer func() { close(stop); wg.Wait() }()
	waitFor(t, 10*time.Second, "writes before the fault", func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.acked) < 20 {
			return fmt.Errorf("%d writes acknowledged", len(h.acked))
		}
		return nil
	})

	const stall = 5 * time.Second
	arm(t, fps[old.Name], fmt.Sprintf("raftlog.sync=stall:%v@1", stall))
	armed := time.Now()
	waitFor(t, 5*time.Second, "the stall", func() error {
		if !strings.Contains(old.Log(), "raftlog.sync hit 1: stalling") {
			return fmt.Errorf("not stalled yet")
		}
		return nil
	})
	// While the old leader's disk hangs, another node takes over.
	var next *clustertest.Node
	waitFor(t, stall-500*time.Millisecond, "a new leader while the old one's disk hangs", func() error {
		for _, nd := range c.Others(old) {
			st, err := c.Status(nd)
			if err == nil && st.Role == "leader" && st.Term > st0.Term {
				next = nd
				return nil
			}
		}
		return fmt.Errorf("none of %v leads in a term after %d", names(c.Others(old)), st0.Term)
	})
	if time.Since(armed) >= stall {
		t.Fatalf("the new leader came only after the stall could have ended (%v after it was armed)", time.Since(armed))
	}
	t.Logf("%s leads %v after the stall began", next.Name, time.Since(armed))
	// The old leader's disk returns; it follows the new leader.
	waitFor(t, 20*time.Second, "the old leader to follow", func() error {
		st, err := c.Status(old)
		if err != nil {
			return err
		}
		if st.Role != "follower" || st.Leader == "" {
			return fmt.Errorf("%s is %s (leader %q)", old.Name, st.Role, st.Leader)
		}
		return nil
	})
	t.Logf("%s follows %v after the stall began", old.Name, time.Since(armed))
	if os.Getenv("DISKFAULT_SHOW") != "" {
		t.Logf("--- %s ---\n%s", old.Name, old.Log())
	}
	// Once its disk is back, it is a ready follower again.
	waitFor(t, stall+5*time.Second, "the end of the stall", func() error {
		if !strings.Contains(old.Log(), "raftlog.sync hit 1: stall over") {
			return fmt.Errorf("still stalled")
		}
		return nil
	})
	waitFor(t, 20*time.Second, "the old leader to be a ready follower", func() error {
		st, err := c.Status(old)
		if err != nil {
			return err
		}
		code, body, err := readyz(old.HTTP)
		if err != nil || code != 200 || st.Role != "follower" {
			return fmt.Errorf("%s is %s; /readyz %d %q %v", old.Name, st.Role, code, body, err)
		}
		return nil
	})
	// Writes go on after it.
	n := func() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.acked) }
	before := n()
	waitFor(t, 10*time.Second, "writes after the stall", func() error {
		if n() < before+20 {
			return fmt.Errorf("%d more writes acknowledged", n()-before)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	wg = &sync.WaitGroup{}
	h.check(t, c)
}

func names(nds []*clustertest.Node) []string {
	var s []string
	for _, nd := range nds {
		s = append(s, nd.Name)
	}
	return s
}

// TestRaftLogSyncEIO: the leader's raft log fsync fails with EIO (once).
// The node syncs nothing more, takes no part but forwarding, and says why
// in its log and /readyz; the other two elect a leader and go on taking
// writes; a restart without the fault recovers it as a follower; nothing
// acknowledged is lost and no token is granted twice.
func TestRaftLogSyncEIO(t *testing.T) {
	c, fps := faultCluster(t, 3)
	old := c.Leader(t)
	st0, err := c.Status(old)
	if err != nil {
		t.Fatal(err)
	}
	h := &history{acked: map[string]string{}, tokens: map[fencekv.Token]string{}}
	stop := make(chan struct{})
	wg := load(t, c, h, stop)
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			wg.Wait()
		}
	}()
	n := func() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.acked) }
	more := func(what string, k int) {
		t.Helper()
		before := n()
		waitFor(t, 15*time.Second, what, func() error {
			if n() < before+k {
				return fmt.Errorf("%d more writes acknowledged", n()-before)
			}
			return nil
		})
	}
	more("writes before the fault", 20)

	arm(t, fps[old.Name], "raftlog.sync=eio@1")
	waitFor(t, 10*time.Second, "the failed fsync", func() error {
		if !strings.Contains(old.Log(), "raftlog.sync hit 1: injected EIO") {
			return fmt.Errorf("not failed yet")
		}
		return nil
	})
	waitFor(t, 10*time.Second, "another leader", func() error {
		for _, nd := range c.Others(old) {
			st, err := c.Status(nd)
			if err == nil && st.Role == "leader" && st.Term > st0.Term {
				return nil
			}
		}
		return fmt.Errorf("none of %v leads in a term after %d", names(c.Others(old)), st0.Term)
	})
	more("writes after the fault", 20)
	code, body, err := readyz(old.HTTP)
	if err != nil || code != 503 || !strings.Contains(body, "raft's log failed") || !strings.Contains(body, "input/output error") {
		t.Errorf("/readyz of the failed node: %d %q %v, want 503 saying raft's log failed with an I/O error", code, body, err)
	}
	if st, err := c.Status(old); err != nil || st.Role == "leader" {
		t.Errorf("the failed node: %+v, %v; want it not leading", st, err)
	}
	waitLog(t, old.Log, "raft log failed; restart the node")
	log := old.Log()
	if os.Getenv("DISKFAULT_SHOW") != "" {
		t.Logf("--- %s ---\n%s", old.Name, log)
	}
	if !strings.Contains(log, "raft log failed; restart the node") {
		t.Errorf("the failed node's log does not say its raft log failed")
	}
	// It lost the leadership once, and, asking for no votes, never led
	// again to fail once more.
	if k := strings.Count(log, "failed to commit logs"); k != 1 {
		t.Errorf("the failed node failed to commit as leader %d times, want once", k)
	}
	if strings.Contains(log, "raftlog.sync hit 2") {
		t.Errorf("the failed node synced its raft log again after the failed fsync")
	}
	close(stop)
	wg.Wait()
	stopped = true

	c.Kill(old)
	arm(t, fps[old.Name], "")
	c.Restart(old)
	waitFor(t, 30*time.Second, "the restarted node to follow and be ready", func() error {
		st, err := c.Status(old)
		if err != nil {
			return err
		}
		code, body, err := readyz(old.HTTP)
		if err != nil || code != 200 || st.Role != "follower" {
			return fmt.Errorf("%s is %s; /readyz %d %q %v", old.Name, st.Role, code, body, err)
		}
		return nil
	})
	h.check(t, c)
}
