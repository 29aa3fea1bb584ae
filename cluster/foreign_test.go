package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
)

// TestOpenRefusesForeignStore: a node does not start on a data dir that
// holds a store without raft state: a single node's (before anything is
// written in the dir), or a node's whose raft files are gone. Its state
// would reach no other node, which would replay the log from its start on
// empty stores, and the tokens it issued would be issued again (G1).
func TestOpenRefusesForeignStore(t *testing.T) {
	config := func(dir string) Config {
		cfg := DefaultConfig()
		cfg.Name = "n0"
		cfg.Dir = dir
		cfg.ClientAddr, cfg.RaftAddr, cfg.GossipAddr = clustertest.FreeAddr(t), clustertest.FreeAddr(t), clustertest.FreeAddr(t)
		cfg.BootstrapExpect = 1
		cfg.Engine.NoSync = true
		return cfg
	}
	refused := func(t *testing.T, cfg Config) {
		t.Helper()
		nd, err := Open(cfg)
		if err == nil {
			nd.Close()
			t.Fatal("a node started on a store without raft state")
		}
		if !strings.Contains(err.Error(), "holds a store but no raft state") {
			t.Fatalf("Open: %v; want the store refused", err)
		}
	}

	t.Run("single node", func(t *testing.T) {
		dir := t.TempDir()
		db, err := fencekv.Open(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Acquire(context.Background(), "L", time.Second, nil); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		before := listDir(t, dir)
		refused(t, config(dir))
		if after := listDir(t, dir); after != before {
			t.Fatalf("the refused start changed the dir: %s, then %s", before, after)
		}
		// The single node still opens it, its token sequence intact.
		db, err = fencekv.Open(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if l, err := db.Acquire(context.Background(), "M", time.Second, nil); err != nil || l.Token != 2 {
			t.Fatalf("acquire on the single node after the refusal = %+v, %v; want token 2", l, err)
		}
	})

	t.Run("raft files gone", func(t *testing.T) {
		nodes := inProcessCluster(t, 1)
		ctx := context.Background()
		if _, err := nodes[0].Acquire(ctx, "L", time.Second, nil); err != nil {
			t.Fatal(err)
		}
		dir := nodes[0].cfg.Dir
		if err := nodes[0].Close(); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{raftFile, "raft-log", snapshotsDir} {
			if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		cfg := config(dir)
		cfg.Name = nodes[0].cfg.Name
		refused(t, cfg)
	})
}

// TestSingleNodeRefusesNodeDir: a single node does not open a cluster
// node's data dir: its state is a replica's, perhaps behind the cluster's,
// and the single node would issue the cluster's tokens again (G1).
func TestSingleNodeRefusesNodeDir(t *testing.T) {
	nodes := inProcessCluster(t, 1)
	if _, err := nodes[0].Acquire(context.Background(), "L", time.Second, nil); err != nil {
		t.Fatal(err)
	}
	dir := nodes[0].cfg.Dir
	if err := nodes[0].Close(); err != nil {
		t.Fatal(err)
	}
	db, err := fencekv.Open(dir, nil)
	if err == nil {
		db.Close()
		t.Fatal("a single node opened a cluster node's data dir")
	}
	if !strings.Contains(err.Error(), "belongs to a cluster node") {
		t.Fatalf("Open: %v; want the dir refused", err)
	}
}

// TestOpenRestoredNotAlone: a restored dir started as a node that would not
// bootstrap alone is refused with an error (Open's clean-up once panicked
// on it).
func TestOpenRestoredNotAlone(t *testing.T) {
	src := t.TempDir()
	db, err := fencekv.Open(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := db.Acquire(ctx, "L", time.Second, nil); err != nil {
		t.Fatal(err)
	}
	b, err := db.Backup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "b.fkvb")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	err = fencekv.WriteBackup(f, fencekv.BackupInfo{Index: b.Index, LastToken: b.LastToken, Revision: b.Revision, Size: b.Size}, b)
	b.Close()
	f.Close()
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "restored")
	if _, err := fencekv.Restore(file, dir, 1000); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Name, cfg.Dir, cfg.BootstrapExpect = "n0", dir, 3
	cfg.ClientAddr, cfg.RaftAddr, cfg.GossipAddr = clustertest.FreeAddr(t), clustertest.FreeAddr(t), clustertest.FreeAddr(t)
	cfg.Engine.NoSync = true
	nd, err := Open(cfg)
	if err == nil {
		nd.Close()
		t.Fatal("a restored dir started with --bootstrap-expect 3")
	}
	if !strings.Contains(err.Error(), "restored from a backup") {
		t.Fatalf("Open: %v; want the restored dir refused", err)
	}
}

func listDir(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return strings.Join(names, ",")
}
