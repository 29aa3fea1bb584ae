package cluster

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/fencekv/fencekv/cluster/clustertest"
)

// TestOpenValidatesEngineOptions: a cluster node refuses the engine limits
// a single node refuses, before it creates anything.
func TestOpenValidatesEngineOptions(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Name = "n0"
	cfg.Dir = t.TempDir() + "/n0"
	cfg.ClientAddr, cfg.RaftAddr, cfg.GossipAddr = clustertest.FreeAddr(t), clustertest.FreeAddr(t), clustertest.FreeAddr(t)
	cfg.BootstrapExpect = 1
	cfg.Engine.MaxKeySize = 0
	nd, err := Open(cfg)
	if err == nil {
		nd.Close()
		t.Fatal("Open with MaxKeySize 0 succeeded")
	}
	if !strings.Contains(err.Error(), "size limits must be positive") {
		t.Fatalf("Open: %v; want the engine's limits refused", err)
	}
	if _, err := os.Stat(cfg.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused node made its data dir: %v", err)
	}
}
