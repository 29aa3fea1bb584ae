package cluster

import (
	"context"
	"testing"
	"time"
)

// TestMembersShowLeft: a node stopped gracefully is shown as left by the
// others, not as dead (memberlist hands NotifyLeave a node record that
// still says alive, so every departure read as a death; found by an
// operator's walk-through).
func TestMembersShowLeft(t *testing.T) {
	nodes := inProcessCluster(t, 3)
	leaderOf(t, nodes, nil)
	gone, watcher := nodes[2], nodes[0]
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ms, err := watcher.Members(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		state := ""
		for _, m := range ms {
			if m.Node == gone.cfg.Name {
				state = m.State
			}
		}
		if state == "left" {
			return
		}
		if state == "dead" || time.Now().After(deadline) {
			t.Fatalf("%s after a graceful stop: %q; want left", gone.cfg.Name, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
