package cluster_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
)

// readyz returns a node's /readyz status and body.
func readyz(nd *clustertest.Node) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + nd.HTTP + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// metric reads one series ("name{labels}") of a node's /metrics.
func metric(t *testing.T, nd *clustertest.Node, series string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + nd.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f, true
		}
	}
	return 0, false
}

// TestClusterOps: every node is ready and reports its role; a backup taken
// from a follower holds every write acknowledged before it; a node without
// a leader is not ready; and a new cluster seeded from the backup has the
// data on every node and issues tokens above every token the old cluster
// issued, after the backup too.
func TestClusterOps(t *testing.T) {
	c := clustertest.Start(t, bin(t), 3, nil)
	leader := c.Leader(t)
	follower := c.Others(leader)[0]
	for _, nd := range c.Nodes {
		eventually(t, nd.Name+" /readyz", 10*time.Second, func() error {
			code, body, err := readyz(nd)
			if err == nil && code != 200 {
				err = fmt.Errorf("%d %s", code, body)
			}
			return err
		})
	}
	if v, ok := metric(t, follower, `fencekv_cluster_role{role="follower"}`); !ok || v != 1 {
		t.Fatalf("follower's fencekv_cluster_role{role=\"follower\"} = %v (present %v); want 1", v, ok)
	}
	if v, _ := metric(t, leader, `fencekv_cluster_role{role="leader"}`); v != 1 {
		t.Fatalf("leader's fencekv_cluster_role{role=\"leader\"} = %v; want 1", v)
	}

	ctx := ctxT(t, 60*time.Second)
	cl := c.Dial(t, follower)
	const keys = 50
	for i := range keys {
		if _, err := cl.Put(ctx, []byte(fmt.Sprintf("k/%03d", i)), []byte(strconv.Itoa(i)), fencekv.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := cl.Acquire(ctx, "jobs", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Put(ctx, []byte("fenced"), []byte("x"), fencekv.WriteOptions{Token: l.Token}); err != nil {
		t.Fatal(err)
	}

	// The backup, from a follower: every write above was acknowledged
	// before it started.
	bcl := c.Dial(t, follower)
	b, err := bcl.Backup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "cluster.fkvb")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := fencekv.WriteBackup(f, fencekv.BackupInfo{Index: b.Index, LastToken: b.LastToken, Revision: b.Revision, Size: b.Size}, b); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if b.LastToken < l.Token {
		t.Fatalf("backup's last token %d is below a token granted before it, %d", b.LastToken, l.Token)
	}
	// Tokens after the backup.
	if err := cl.Release(ctx, "jobs", l.Token); err != nil {
		t.Fatal(err)
	}
	var last fencekv.Token
	for range 5 {
		l, err := cl.Acquire(ctx, "jobs", 10*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		last = l.Token
		if err := cl.Release(ctx, "jobs", l.Token); err != nil {
			t.Fatal(err)
		}
	}

	// Without a leader, the survivor is not ready, and says why.
	survivor := follower
	for _, nd := range c.Others(survivor) {
		c.Kill(nd)
	}
	eventually(t, "the survivor's /readyz without a leader", 20*time.Second, func() error {
		code, body, err := readyz(survivor)
		if err != nil {
			return err
		}
		if code != 503 || !strings.Contains(body, "no leader") {
			return fmt.Errorf("/readyz = %d %q; want 503 saying there is no leader", code, body)
		}
		return nil
	})
	if v, _ := metric(t, survivor, "fencekv_cluster_has_leader"); v != 0 {
		t.Errorf("fencekv_cluster_has_leader = %v without a leader; want 0", v)
	}
	if v, _ := metric(t, survivor, "fencekv_raft_leader_changes_total"); v < 2 {
		t.Errorf("fencekv_raft_leader_changes_total = %v after the leader died; want at least 2", v)
	}
	// The quorum's margin, spent: two of three voters dead.
	eventually(t, "the survivor's voters by state", 30*time.Second, func() error {
		alive, _ := metric(t, survivor, `fencekv_cluster_voters{state="alive"}`)
		dead, _ := metric(t, survivor, `fencekv_cluster_voters{state="dead"}`)
		if alive != 1 || dead != 2 {
			return fmt.Errorf("voters: %v alive, %v dead; want 1 and 2", alive, dead)
		}
		return nil
	})

	// A new cluster, seeded from the backup.
	var restoredLast fencekv.Token
	n := clustertest.Seed(t, bin(t), 3, nil, func(dir string) {
		res, err := fencekv.Restore(file, dir, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		restoredLast = res.LastToken
	})
	if restoredLast != b.LastToken+1<<20 {
		t.Fatalf("restored last token %d; want the backup's %d plus the gap", restoredLast, b.LastToken)
	}
	if _, err := os.Stat(filepath.Join(n.Nodes[0].Dir, fencekv.RestoredFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the seed node still has its %s file after seeding (%v)", fencekv.RestoredFile, err)
	}
	stale := fencekv.WithStaleReads(ctx)
	for _, nd := range n.Nodes {
		ncl := n.Dial(t, nd)
		eventually(t, nd.Name+" has the restored data", 30*time.Second, func() error {
			for i := range keys {
				e, err := ncl.Get(stale, []byte(fmt.Sprintf("k/%03d", i)))
				if err != nil {
					return err
				}
				if !e.Found || string(e.Value) != strconv.Itoa(i) {
					return fmt.Errorf("k/%03d = %+v", i, e)
				}
			}
			e, err := ncl.Get(stale, []byte("fenced"))
			if err == nil && e.Fence != l.Token {
				err = fmt.Errorf("fenced: fence %d; want %d", e.Fence, l.Token)
			}
			return err
		})
	}
	ncl := n.Dial(t, n.Nodes[len(n.Nodes)-1])
	// A lock held when the backup was taken is held again after the
	// restore, with its full TTL (G7, as after a restart).
	if _, err := ncl.Acquire(ctx, "jobs", 10*time.Second, nil); !errors.Is(err, fencekv.ErrLockHeld) {
		t.Fatalf("acquire of a lock held in the backup: %v; want lock_held", err)
	}
	nl, err := ncl.Acquire(ctx, "other", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if nl.Token <= last {
		t.Fatalf("the seeded cluster issued token %d; the old one had issued up to %d", nl.Token, last)
	}
	// Fencing carried over: a token from before the backup is still below
	// the fence.
	if _, err := ncl.Put(ctx, []byte("fenced"), []byte("y"), fencekv.WriteOptions{Token: l.Token - 1}); !errors.Is(err, fencekv.ErrStaleToken) {
		t.Fatalf("a stale write on the seeded cluster: %v; want stale_token", err)
	}
}
