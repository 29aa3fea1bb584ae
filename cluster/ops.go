package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/hashicorp/raft"
)

// What operations read from a node: readiness, raft's view for metrics,
// online backups, and seeding a new cluster from a restored backup.

// Ready reports whether the node serves: nil when its state machine and
// raft's log work, a leader is known, and it has applied everything it knew committed when
// asked (it waits for that within ctx); else why not.
func (n *Node) Ready(ctx context.Context) error {
	if err := n.m.Failed(); err != nil {
		return fmt.Errorf("the state machine failed and applies nothing until restart: %v", err)
	}
	if err := n.logs.Failed(); err != nil {
		return fmt.Errorf("raft's log failed: this node takes no entries until restart: %v", err)
	}
	if d := n.logs.busy.running(); d > n.cfg.HeartbeatTimeout {
		return fmt.Errorf("raft's log has not finished a write for %v: the disk hangs, and this node lets another lead", d.Round(time.Millisecond))
	}
	if _, id := n.raft.LeaderWithID(); id == "" {
		return fmt.Errorf("no leader known (this node is %s in term %d)", role(n.raft.State()), n.raft.CurrentTerm())
	}
	commit := n.raft.CommitIndex()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		applied := n.raft.AppliedIndex()
		if applied >= commit {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("this node has applied index %d of the %d it knows committed", applied, commit)
		}
	}
}

// LeaderChanges counts the changes of leader raft has reported on this
// node (including to no leader).
func (n *Node) LeaderChanges() uint64 { return n.leaderChanges.Load() }

// FollowerReads counts the linearizable reads this node answered from its
// own state as a follower (followerread.go), for metrics.
func (n *Node) FollowerReads() uint64 { return n.followerReads.Load() }

// LastContact is the time since this node last heard from the leader: 0
// on the leader, false if it never has.
func (n *Node) LastContact() (time.Duration, bool) {
	if n.raft.State() == raft.Leader {
		return 0, true
	}
	t := n.raft.LastContact()
	if t.IsZero() {
		return 0, false
	}
	return time.Since(t), true
}

// Backup takes a consistent copy of the store on this node, while it keeps
// serving: every write acknowledged (by any node) before the call is in
// it. The node first catches up: on the leader, as for a linearizable
// read; on another node, it asks the leader (a linearizable read there,
// then its applied index) and waits until it has applied that much. Then
// raft takes a snapshot (the engine's data file, written to the node's
// snapshot store, which also compacts the raft log), and the backup reads
// that file.
func (n *Node) Backup(ctx context.Context) (*fencekv.Backup, error) {
	target, err := n.catchUp(ctx)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(n.cfg.HoldTimeout)
	for {
		before, _ := n.fsm.lastSnapshot()
		f := n.raft.Snapshot()
		if err := f.Error(); err != nil {
			if errors.Is(err, raft.ErrNothingNewToSnapshot) {
				return nil, &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "backup: this node has applied nothing since it started; try again after a write"}
			}
			return nil, &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "backup: raft snapshot: " + err.Error()}
		}
		meta, rc, err := f.Open()
		if err != nil {
			return nil, &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "backup: opening the raft snapshot: " + err.Error()}
		}
		after, st := n.fsm.lastSnapshot()
		switch {
		case after == before+1 && meta.Index >= target:
			return &fencekv.Backup{Index: meta.Index, LastToken: st.LastToken, Revision: st.Revision, Size: meta.Size, ReadCloser: rc}, nil
		case time.Now().After(deadline):
			rc.Close()
			return nil, &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "backup: raft kept taking snapshots, or this node's state machine stayed behind; try again"}
		}
		// Raft took another snapshot between ours and reading its
		// counters, or the state machine had not applied what raft had
		// handed it (a follower's raft counts entries applied once
		// queued for the state machine, and took the snapshot first):
		// take ours again.
		rc.Close()
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// catchUp returns once this node has applied every write acknowledged
// before the call: on the leader, as for a linearizable read (it returns
// 0); on another node, it asks the leader for its applied index (after a
// linearizable read there) and waits for raft to have applied that much,
// which it returns: the state machine may still have entries up to it
// queued, so a snapshot must reach it (Backup).
func (n *Node) catchUp(ctx context.Context) (uint64, error) {
	err := n.readIndex(ctx)
	var fw errForward
	if !errors.As(err, &fw) {
		return 0, err
	}
	for {
		c, err := n.fwd.client(ctx, fw.addr)
		if err != nil {
			return 0, err
		}
		// A linearizable read on the leader returns once it has applied
		// everything committed when the read arrived; its applied index
		// then covers every acknowledged write. The node asked must have
		// led throughout, in one term (it cannot lead twice in a term),
		// so that the read ran on it, not forwarded: the applied index of
		// a node that no longer leads may be behind.
		before, err := c.Status(ctx)
		if err != nil {
			return 0, n.fwd.forwardError(c, err, false)
		}
		moved := false // the node no longer leads: it does not forward the read (one hop)
		var fe *fencekv.Error
		if _, err := c.LockInfo(ctx, "fencekv/backup"); errors.As(err, &fe) && fe.Code == fencekv.CodeNotLeader {
			moved = true
		} else if err != nil {
			return 0, n.fwd.forwardError(c, err, false)
		}
		st, err := c.Status(ctx)
		if err != nil {
			return 0, n.fwd.forwardError(c, err, false)
		}
		if !moved && before.Role == "leader" && st.Role == "leader" && before.Term == st.Term {
			return st.AppliedIndex, n.awaitApplied(ctx, st.AppliedIndex)
		}
		// The leadership moved: ask the new leader.
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if err := n.readIndex(ctx); !errors.As(err, &fw) {
			return 0, err
		}
	}
}

// seedState is a store restored from a backup (fencekv.Restore) that has
// yet to seed its new cluster.
type seedState struct {
	marker string // the restored file; removed once seeded
}

// checkSeed looks for a store restored from a backup. Its state must
// reach every other node as a raft snapshot, never by replaying the log
// from its start on an empty node, so such a node must bootstrap alone
// (the others join it, empty) and, once it leads, seeds the raft log with
// its state (seed).
//
// A store without raft state and without that marker is refused: a single
// node's data dir (or a node's whose raft files are gone). Its state would
// reach no other node, which would replay the log from its start on empty
// stores, and the tokens it issued would be issued again (G1).
func (n *Node) checkSeed() error {
	hasState, err := raft.HasExistingState(n.logs, n.store, nopSnapshots{})
	if err != nil {
		return err
	}
	marker := filepath.Join(n.cfg.Dir, fencekv.RestoredFile)
	if _, err := os.Stat(marker); err != nil {
		if hasState {
			return nil
		}
		if n.m.Applied() > 0 {
			return errForeignStore(n.cfg.Dir)
		}
		return nil
	}
	if !hasState && n.cfg.BootstrapExpect != 1 {
		return fmt.Errorf("cluster: data dir %s was restored from a backup: start this node alone with --bootstrap-expect 1 to seed a new cluster, then start the other nodes on empty data dirs with --join", n.cfg.Dir)
	}
	n.seeds = &seedState{marker: marker}
	return nil
}

// errForeignStore refuses a data dir that holds a store no raft state
// goes with (see checkSeed).
func errForeignStore(dir string) error {
	return fmt.Errorf("cluster: data dir %s holds a store but no raft state: a single node's data dir, or a cluster node's whose raft files are gone. A cluster node cannot start on it: its state would reach no other node, and the tokens it issued would be issued again. To move a single node's store into a cluster, back it up (fencekv backup), restore the backup into an empty dir (fencekv restore), and start the first node on that dir alone with --bootstrap-expect 1 (README: Backup and restore)", dir)
}

func (n *Node) seeding() bool { return n.seeds != nil }

// seed puts the restored state into the raft log: a snapshot of it, which
// raft restores with a hole in the log after it, so that every node that
// joins installs the snapshot instead of replaying the log on an empty
// store. Called by the leader before it takes commands.
func (n *Node) seed() error {
	f := n.raft.Snapshot()
	if err := f.Error(); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	meta, rc, err := f.Open()
	if err != nil {
		return fmt.Errorf("opening the snapshot: %w", err)
	}
	defer rc.Close()
	if err := n.raft.Restore(meta, rc, n.cfg.HoldTimeout); err != nil {
		return fmt.Errorf("raft restore: %w", err)
	}
	if err := os.Remove(n.seeds.marker); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if d, err := os.Open(n.cfg.Dir); err == nil {
		d.Sync()
		d.Close()
	}
	n.log.Info("seeded the new cluster with the store restored from a backup", "snapshot_index", meta.Index, "bytes", meta.Size)
	n.seeds = nil
	return nil
}
