package cluster

import (
	"context"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
)

// Linearizable reads (read index). The leader answers a read only after
//
//  1. it is the ready leader of its term (its rearm, and so everything
//     committed before its term, is applied);
//  2. a quorum round that started after the read arrived confirmed it is
//     still the leader (raft's VerifyLeader: heartbeats, no log write). A
//     paused old leader cannot pass it: a newer leader's term wins the
//     quorum's answers. No clock-based lease is trusted;
//  3. it has applied everything that was committed when the read arrived.
//
// Concurrent reads share rounds: a read joins the next round to start,
// never one already in flight (which may predate it).

// verifier runs the leader's confirmation rounds for reads.
type verifier struct {
	n       *Node
	mu      sync.Mutex
	waiting []chan error // reads waiting for the next round
	running bool         // a goroutine runs rounds
}

// verify waits for a confirmation round that starts after the call.
func (v *verifier) verify(ctx context.Context) error {
	ch := make(chan error, 1)
	v.mu.Lock()
	v.waiting = append(v.waiting, ch)
	if !v.running {
		v.running = true
		v.n.wg.Add(1)
		go v.run()
	}
	v.mu.Unlock()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (v *verifier) run() {
	defer v.n.wg.Done()
	for {
		v.mu.Lock()
		batch := v.waiting
		v.waiting = nil
		if len(batch) == 0 {
			v.running = false
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
		var err error
		if e := v.n.raft.VerifyLeader().Error(); e != nil {
			err = &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "leadership not confirmed: " + e.Error()}
		}
		for _, ch := range batch {
			ch <- err
		}
	}
}

// readIndex returns once a read that arrived now may be answered from this
// node's state, or errForward, or an error.
func (n *Node) readIndex(ctx context.Context) error {
	if _, err := n.awaitReady(ctx); err != nil {
		return err
	}
	index := n.raft.CommitIndex()
	if err := n.reads.verify(ctx); err != nil {
		return err
	}
	return n.awaitApplied(ctx, index)
}

// awaitApplied waits until this node has applied index.
func (n *Node) awaitApplied(ctx context.Context, index uint64) error {
	timer := time.NewTimer(n.cfg.HoldTimeout)
	defer timer.Stop()
	for {
		applied, change := n.fsm.appliedIndex()
		if applied >= index || n.raft.AppliedIndex() >= index {
			return nil
		}
		select {
		case <-change:
		case <-time.After(5 * time.Millisecond): // entries the FSM never sees (barriers) move only raft's index
		case <-timer.C:
			return &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "this node is behind the log"}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
