package cluster

// Real raft instances on loopback NetworkTransports, each behind the real
// voteGuard, with in-memory stores that survive a restart (and a fresh
// marker that does, as freshFile does), to put a node that lost its data
// into the elections that used to lose an acknowledged entry. Written in
// review of the first version of the guard, which lost one in each.

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nopSnap{}, nil }
func (nopFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

type nopSnap struct{}

func (nopSnap) Persist(s raft.SnapshotSink) error { return s.Close() }
func (nopSnap) Release()                          {}

// failLogs fails StoreLogs of any batch holding an entry at index >= limit
// (when limit > 0): a catch-up cut short at that index.
type failLogs struct {
	*raft.InmemStore
	limit atomic.Uint64
}

func (f *failLogs) StoreLogs(ls []*raft.Log) error {
	if lim := f.limit.Load(); lim > 0 {
		for _, l := range ls {
			if l.Index >= lim {
				return errors.New("review: catch-up cut short")
			}
		}
	}
	return f.InmemStore.StoreLogs(ls)
}
func (f *failLogs) StoreLog(l *raft.Log) error { return f.StoreLogs([]*raft.Log{l}) }

type rvNode struct {
	id     string
	addr   string
	logs   *failLogs
	stable *raft.InmemStore
	snaps  *raft.InmemSnapshotStore
	r      *raft.Raft
	g      *voteGuard
	fresh  bool
	marker atomic.Bool // freshFile: kept across restarts, gone with the data
}

func rvConfig(id string) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(id)
	rc.HeartbeatTimeout = 300 * time.Millisecond
	rc.ElectionTimeout = 300 * time.Millisecond
	rc.LeaderLeaseTimeout = 150 * time.Millisecond
	rc.CommitTimeout = 20 * time.Millisecond
	rc.TrailingLogs = 2
	rc.MaxAppendEntries = 1 // one entry per AppendEntries: a catch-up can stop at any index
	rc.Logger = hclog.New(&hclog.LoggerOptions{Name: "raft-" + id, Level: hclog.Error, Output: os.Stderr})
	return rc
}

// start starts (or restarts) nd with its stores, as startRaft does: fresh
// iff raft.HasExistingState is false.
func (nd *rvNode) start(t *testing.T) {
	t.Helper()
	rc := rvConfig(nd.id)
	trans, err := raft.NewTCPTransport(nd.addr, nil, 3, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	nd.addr = string(trans.LocalAddr())
	has, err := raft.HasExistingState(nd.logs, nd.stable, nd.snaps)
	if err != nil {
		t.Fatal(err)
	}
	nd.fresh = !has || nd.marker.Load()
	nd.marker.Store(nd.fresh)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	logs, snaps, stable := nd.logs, nd.snaps, nd.stable
	nd.g = newVoteGuard(trans, nd.fresh, raft.RPCHeader{ProtocolVersion: rc.ProtocolVersion, ID: []byte(nd.id),
		Addr: trans.EncodePeer(raft.ServerID(nd.id), trans.LocalAddr())}, log,
		func(term, commit uint64) bool { return caughtUp(logs, snaps, term, commit) },
		func() uint64 { t, _ := stable.GetUint64([]byte("CurrentTerm")); return t },
		func() { nd.marker.Store(false) })
	go nd.g.run()
	nd.r, err = raft.NewRaft(rc, nopFSM{}, nd.logs, nd.stable, nd.snaps, nd.g)
	if err != nil {
		t.Fatal(err)
	}
}

func (nd *rvNode) stop() {
	if nd.r != nil {
		nd.r.Shutdown().Error()
		nd.r = nil
	}
}

// wipe gives nd empty stores: its data dir lost.
func (nd *rvNode) wipe() {
	nd.marker.Store(false)
	nd.logs = &failLogs{InmemStore: raft.NewInmemStore()}
	nd.stable = raft.NewInmemStore()
	nd.snaps = raft.NewInmemSnapshotStore()
}

func rvGroup(t *testing.T) []*rvNode {
	var nodes []*rvNode
	var servers []raft.Server
	for i := range 3 {
		nd := &rvNode{id: fmt.Sprintf("r%d", i), addr: "127.0.0.1:0"}
		nd.wipe()
		nd.start(t)
		nodes = append(nodes, nd)
		servers = append(servers, raft.Server{ID: raft.ServerID(nd.id), Address: raft.ServerAddress(nd.addr)})
	}
	for _, nd := range nodes {
		if err := nd.r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
			t.Fatal(err)
		}
		nd.g.bootstrapped()
	}
	t.Cleanup(func() {
		for _, nd := range nodes {
			nd.stop()
		}
	})
	return nodes
}

func rvLeader(t *testing.T, nodes []*rvNode, within time.Duration) *rvNode {
	t.Helper()
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, nd := range nodes {
			if nd.r != nil && nd.r.State() == raft.Leader {
				return nd
			}
		}
	}
	return nil
}

func rvApply(t *testing.T, l *rvNode, n int) uint64 {
	t.Helper()
	var idx uint64
	for i := range n {
		f := l.r.Apply([]byte(fmt.Sprint(i)), 5*time.Second)
		if err := f.Error(); err != nil {
			t.Fatal(err)
		}
		idx = f.Index()
	}
	return idx
}

func rvWait(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// rvRoles waits for the group's leader L, and names the others A and B.
func rvRoles(t *testing.T, nodes []*rvNode) (L, A, B *rvNode) {
	t.Helper()
	if L = rvLeader(t, nodes, 10*time.Second); L == nil {
		t.Fatal("no leader")
	}
	var others []*rvNode
	for _, nd := range nodes {
		if nd != L {
			others = append(others, nd)
		}
	}
	return L, others[0], others[1]
}

// rvNoLeaderWithout fails the test if A and B, without L (stopped), elect
// a leader whose log lacks L's acknowledged entry x.
func rvNoLeaderWithout(t *testing.T, L, A, B *rvNode, x uint64) {
	t.Helper()
	nl := rvLeader(t, []*rvNode{A, B}, 5*time.Second)
	if nl == nil {
		return // safe: no leader without L
	}
	rvApply(t, nl, 1)
	var e, orig raft.Log
	L.logs.GetLog(x, &orig)
	if err := nl.logs.GetLog(x, &e); err != nil || e.Term != orig.Term || e.Type != orig.Type {
		t.Errorf("%s leads (B fresh=%v); L's acknowledged entry %d (term %d %v) is now %+v, %v: LOST",
			nl.id, B.g.isFresh(), x, orig.Term, orig.Type, e, err)
	}
}

// setup: leader L, A lagging (stopped before X), X committed on L and B,
// B's data lost; B restarted fresh, and its catch-up from L stops before
// index limit(x).
func rvSetup(t *testing.T, limit func(x uint64) uint64) (nodes []*rvNode, L, A, B *rvNode, x uint64) {
	nodes = rvGroup(t)
	L, A, B = rvRoles(t, nodes)
	base := rvApply(t, L, 10)
	rvWait(t, "A has the first writes", 5*time.Second, func() bool { return A.r.AppliedIndex() >= base })
	A.stop()
	x = rvApply(t, L, 5) // X: committed by L and B
	aLast, _ := A.logs.LastIndex()
	t.Logf("A (stopped) last index %d; X acknowledged up to %d (L and B)", aLast, x)
	B.stop()
	B.wipe()
	B.logs.limit.Store(limit(x))
	B.start(t)
	if !B.fresh {
		t.Fatal("B should start fresh")
	}
	return nodes, L, A, B, x
}

// TestFreshNodeDoesNotCampaign: a fresh node whose catch-up was cut short
// (L died mid catch-up) has a configuration, so raft makes it campaign; it
// must get no vote but its own, or A (which lacks X) would grant it one
// and X would be lost.
func TestFreshNodeDoesNotCampaign(t *testing.T) {
	_, L, A, B, x := rvSetup(t, func(x uint64) uint64 { return x })
	rvWait(t, "B to hold everything before X's last entry", 10*time.Second, func() bool {
		li, _ := B.logs.LastIndex()
		return li == x-1
	})
	t.Logf("B fresh=%v last=%d (lacks %d)", B.g.isFresh(), B.r.LastIndex(), x)
	L.stop()
	B.logs.limit.Store(0)
	A.start(t)
	rvNoLeaderWithout(t, L, A, B, x)
}

// TestFreshAcrossRestart: a fresh node restarted before it caught up has
// raft state (the term of L's first AppendEntries), but stays fresh (its
// marker), and does not vote for A.
func TestFreshAcrossRestart(t *testing.T) {
	_, L, A, B, x := rvSetup(t, func(uint64) uint64 { return 1 }) // stores nothing
	rvWait(t, "B to take L's term", 10*time.Second, func() bool { return B.r.CurrentTerm() > 0 })
	B.stop() // a crash or restart before catching up
	B.logs.limit.Store(0)
	B.start(t)
	t.Logf("B restarted: fresh=%v", B.fresh)
	L.stop()
	A.start(t)
	rvNoLeaderWithout(t, L, A, B, x)
}

// TestFreshSnapshotShortOfCommit: the fresh node installs a snapshot of
// the leader's term whose index is below the leader's commit index, and
// its catch-up stops there (L dies): it has not caught up, and must not
// vote for A, which has more than the snapshot but lacks X.
func TestFreshSnapshotShortOfCommit(t *testing.T) {
	L, A, B := rvRoles(t, rvGroup(t))
	rvApply(t, L, 10)
	if err := L.r.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	s := L.r.AppliedIndex()
	a := rvApply(t, L, 5)
	rvWait(t, "A has the writes up to a", 5*time.Second, func() bool { li, _ := A.logs.LastIndex(); return li >= a })
	A.stop()
	x := rvApply(t, L, 5) // X: L and B only
	first, _ := L.logs.FirstIndex()
	t.Logf("L snapshot at %d (log from %d), A stopped at %d, X up to %d", s, first, a, x)
	B.stop()
	B.wipe()
	B.logs.limit.Store(s + 1) // its catch-up stops right after the snapshot
	B.start(t)
	rvWait(t, "B installs the snapshot, and hears of L's commit index past it", 10*time.Second, func() bool {
		B.g.mu.Lock()
		defer B.g.mu.Unlock()
		return B.r.LastIndex() >= s && B.g.commit > s
	})
	L.stop()
	B.logs.limit.Store(0)
	A.start(t)
	rvNoLeaderWithout(t, L, A, B, x)
}
