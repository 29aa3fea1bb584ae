package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// In-process raft groups on raft's in-memory transport: fast tests of the
// FSM (the engine's machine under raft) and of the leadership rules, with
// no sockets and no processes. The process tests (process_test.go) run
// the real thing.

type memNode struct {
	id    raft.ServerID
	m     *state.Machine
	fsm   *fsm
	raft  *raft.Raft
	logs  raft.LogStore
	trans *raft.InmemTransport
}

func memGroup(t *testing.T, n int) []*memNode {
	t.Helper()
	nodes := memNodes(t, n)
	bootMemGroup(t, nodes)
	return nodes
}

// memNodes makes n nodes, connected, not started: a test may set up their
// FSMs before bootMemGroup starts them.
func memNodes(t *testing.T, n int) []*memNode {
	t.Helper()
	var nodes []*memNode
	for i := range n {
		nodes = append(nodes, newMemNode(t, i))
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.trans.Connect(b.trans.LocalAddr(), b.trans)
			}
		}
	}
	return nodes
}

// bootMemGroup starts the nodes and bootstraps them as one group.
func bootMemGroup(t *testing.T, nodes []*memNode) {
	t.Helper()
	var servers []raft.Server
	for _, nd := range nodes {
		servers = append(servers, raft.Server{ID: nd.id, Address: nd.trans.LocalAddr()})
		nd.start(t)
	}
	if err := nodes[0].raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		t.Fatal(err)
	}
}

func newMemNode(t *testing.T, i int) *memNode {
	t.Helper()
	f := fileFSM(t)
	_, trans := raft.NewInmemTransport(raft.ServerAddress("mem" + strconv.Itoa(i)))
	return &memNode{id: raft.ServerID("n" + strconv.Itoa(i)), m: f.m, fsm: f, trans: trans}
}

func (nd *memNode) start(t *testing.T) {
	t.Helper()
	rc := raft.DefaultConfig()
	rc.LocalID = nd.id
	rc.HeartbeatTimeout = 50 * time.Millisecond
	rc.ElectionTimeout = 50 * time.Millisecond
	rc.LeaderLeaseTimeout = 50 * time.Millisecond
	rc.CommitTimeout = 5 * time.Millisecond
	rc.NoSnapshotRestoreOnStart = true
	rc.SnapshotThreshold = 1 << 30 // only when asked
	rc.TrailingLogs = 4
	rc.Logger = hclog.New(&hclog.LoggerOptions{Output: io.Discard})
	store := raft.NewInmemStore()
	nd.logs = store
	r, err := raft.NewRaft(rc, nd.fsm, store, store, raft.NewInmemSnapshotStore(), nd.trans)
	if err != nil {
		t.Fatal(err)
	}
	nd.raft = r
	t.Cleanup(func() { r.Shutdown().Error() }) // before the machine closes (fileFSM's cleanup, registered first)
}

func memLeader(t *testing.T, nodes []*memNode) *memNode {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, nd := range nodes {
			if nd.raft.State() == raft.Leader {
				return nd
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no leader")
	return nil
}

// propose applies commands as one entry through the leader and returns
// their results.
func propose(t *testing.T, nd *memNode, cmds ...state.Command) []state.Result {
	t.Helper()
	f := nd.raft.Apply(state.EncodeBatch(cmds), 5*time.Second)
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	res, ok := f.Response().([]state.Result)
	if !ok {
		t.Fatalf("response %#v", f.Response())
	}
	return res
}

func waitApplied(t *testing.T, nodes []*memNode, index uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, nd := range nodes {
		for {
			if i, _ := nd.fsm.appliedIndex(); i >= index {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not apply index %d", nd.id, index)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// TestFSMReplicates: a batch proposed on the leader is applied, in one
// entry, on every node: same values, same fences, same tokens.
func TestFSMReplicates(t *testing.T) {
	nodes := memGroup(t, 3)
	l := memLeader(t, nodes)
	res := propose(t, l,
		state.Command{Op: state.OpRearm, Term: 1},
		state.Command{Op: state.OpAcquire, Lease: state.LeaseRequest{Name: "L", TTL: time.Minute}},
		put("k", "v", 1),
		put("k", "stale", 0),
	)
	if res[1].Err != nil || res[1].Grant.Token != 1 || res[2].Err != nil {
		t.Fatalf("results %+v", res)
	}
	if !errors.Is(res[3].Err, fencekv.ErrStaleToken) {
		t.Fatalf("a tokenless write after token 1: %v; want stale_token", res[3].Err)
	}
	waitApplied(t, nodes, l.raft.LastIndex())
	for _, nd := range nodes {
		e, err := nd.m.Get([]byte("k"))
		if err != nil || string(e.Value) != "v" || e.Fence != 1 {
			t.Errorf("%s: k = %+v, %v; want v with fence 1", nd.id, e, err)
		}
	}
}

// rearmedTwice is a group whose leader re-armed in term 1, granted lock L
// (g) with a TTL of 1s, then re-armed in term 2, as a new leader would.
func rearmedTwice(t *testing.T) ([]*memNode, *memNode, state.Result) {
	t.Helper()
	nodes := memGroup(t, 3)
	l := memLeader(t, nodes)
	propose(t, l, state.Command{Op: state.OpRearm, Term: 1})
	g := propose(t, l, state.Command{Op: state.OpAcquire, Term: 1, Lease: state.LeaseRequest{Name: "L", TTL: time.Second}})[0]
	propose(t, l, state.Command{Op: state.OpRearm, Term: 2, Now: time.Millisecond})
	return nodes, l, g
}

// TestFSMOldLeaderExpiryIgnored: an expiry proposed with the term of a
// leader that has since been replaced (its rearm applied) changes nothing,
// on every node, however late the time it carries.
func TestFSMOldLeaderExpiryIgnored(t *testing.T) {
	nodes, l, g := rearmedTwice(t)
	r := propose(t, l, state.Command{Op: state.OpExpire, Term: 1, Now: time.Hour, Lease: state.LeaseRequest{Name: "L"}})[0]
	if !r.Noop {
		t.Fatalf("old-term expiry = %+v; want a no-op", r)
	}
	waitApplied(t, nodes, l.raft.LastIndex())
	for _, nd := range nodes {
		in, err := nd.m.LockInfo(500*time.Millisecond, "L")
		if err != nil || !in.Held || in.Token != g.Grant.Token {
			t.Errorf("%s: L = %+v, %v; want held by %d", nd.id, in, err, g.Grant.Token)
		}
	}
}

// TestFSMSnapshotInstall: a node that joins after the log was compacted
// gets the state by installing the leader's snapshot (the bbolt file).
func TestFSMSnapshotInstall(t *testing.T) {
	nodes := memGroup(t, 3)
	l := memLeader(t, nodes)
	var cmds []state.Command
	for i := range 200 {
		cmds = append(cmds, put(fmt.Sprintf("k%03d", i), "v", fencekv.Token(i)))
	}
	for i := 0; i < len(cmds); i += 20 {
		propose(t, l, cmds[i:i+20]...)
	}
	if err := l.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	propose(t, l, state.Command{Op: state.OpPut, Key: []byte("after"), Value: []byte("v")})

	late := newMemNode(t, 3)
	for _, nd := range nodes {
		nd.trans.Connect(late.trans.LocalAddr(), late.trans)
		late.trans.Connect(nd.trans.LocalAddr(), nd.trans)
	}
	late.start(t)
	if err := l.raft.AddVoter(late.id, late.trans.LocalAddr(), 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, []*memNode{late}, l.raft.LastIndex())
	for _, key := range []string{"k000", "k199", "after"} {
		e, err := late.m.Get([]byte(key))
		if err != nil || !e.Found {
			t.Errorf("late node: %s = %+v, %v; want found", key, e, err)
		}
	}
	if e, _ := late.m.Get([]byte("k199")); e.Fence != 199 {
		t.Errorf("late node: k199 fence %d; want 199", e.Fence)
	}
}

func put(key, value string, token fencekv.Token) state.Command {
	c := state.Command{Op: state.OpPut, Key: []byte(key), Value: []byte(value)}
	c.Write.Token = token
	return c
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct{ bytes.Buffer }

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }

func fileFSM(t *testing.T) *fsm {
	t.Helper()
	m, err := state.OpenMachine(filepath.Join(t.TempDir(), fencekv.DataFile), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return newFSM(m, slog.New(slog.DiscardHandler), nil)
}

func putEntry(index uint64, key string) *raft.Log {
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: state.EncodeBatch([]state.Command{put(key, "v", 0)})}
}

// TestFSMRestoreWithSnapshotPending: raft holds a snapshot of the FSM,
// not yet persisted, while it waits for its main goroutine (for the
// configuration), and that goroutine may be installing a snapshot from
// the leader, waiting for the FSM's Restore. The FSM's snapshot must not
// hold the data file meanwhile: it held a bbolt read transaction, which
// Restore's close of the file waited for, and the node hung for good
// (found in review). The snapshot persisted after the Restore holds the
// restored state.
func TestFSMRestoreWithSnapshotPending(t *testing.T) {
	leader := fileFSM(t)
	leader.ApplyBatch([]*raft.Log{putEntry(1, "a"), putEntry(2, "b"), putEntry(3, "c")})
	ls, err := leader.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var image memSink
	if err := ls.Persist(&image); err != nil {
		t.Fatal(err)
	}
	ls.Release()

	f := fileFSM(t)
	f.ApplyBatch([]*raft.Log{putEntry(1, "a")})
	pending, err := f.Snapshot() // raft's, before Persist
	if err != nil {
		t.Fatal(err)
	}
	defer pending.Release()
	done := make(chan error, 1)
	go func() { done <- f.Restore(io.NopCloser(bytes.NewReader(image.Bytes()))) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Restore waits for a snapshot raft has not persisted yet")
	}
	var out memSink
	if err := pending.Persist(&out); err != nil {
		t.Fatal(err)
	}
	check := fileFSM(t)
	if err := check.Restore(io.NopCloser(bytes.NewReader(out.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if e, err := check.m.Get([]byte("c")); err != nil || !e.Found {
		t.Fatalf("the snapshot persisted after the restore: c = %+v, %v; want the restored state", e, err)
	}
}

// TestFSMOldTermCommandRefused: a command stamped with a term older than
// the last rearm (its leader still stamping its old term, and its own
// clock, after losing the leadership, and appending it once leader again
// before its own rearm) is refused on every node, and changes nothing: it
// could otherwise take a lock whose lease was re-armed on another clock
// (found in review). Commands of the rearm's term, and a single node's
// (no term), are applied.
func TestFSMOldTermCommandRefused(t *testing.T) {
	nodes, l, g := rearmedTwice(t)
	// Term 1's clock says the lease ran out long ago.
	r := propose(t, l, state.Command{Op: state.OpAcquire, Term: 1, Now: time.Hour, Lease: state.LeaseRequest{Name: "L", TTL: time.Second}})[0]
	if !errors.Is(r.Err, fencekv.ErrUnavailable) {
		t.Fatalf("an acquire of term 1 after the rearm of term 2 = %+v; want refused unavailable", r)
	}
	if r := propose(t, l, put("k", "old", 0), state.Command{Op: state.OpPut, Term: 1, Key: []byte("k"), Value: []byte("stale")})[1]; !errors.Is(r.Err, fencekv.ErrUnavailable) {
		t.Fatalf("a put of term 1 after the rearm of term 2 = %+v; want refused", r)
	}
	if r := propose(t, l, state.Command{Op: state.OpPut, Term: 2, Key: []byte("k2"), Value: []byte("v")})[0]; r.Err != nil {
		t.Fatalf("a put of term 2: %v", r.Err)
	}
	waitApplied(t, nodes, l.raft.LastIndex())
	for _, nd := range nodes {
		in, err := nd.m.LockInfo(500*time.Millisecond, "L")
		if err != nil || !in.Held || in.Token != g.Grant.Token {
			t.Errorf("%s: L = %+v, %v; want still held by %d", nd.id, in, err, g.Grant.Token)
		}
		if e, err := nd.m.Get([]byte("k")); err != nil || string(e.Value) != "old" {
			t.Errorf("%s: k = %q, %v; want old", nd.id, e.Value, err)
		}
	}
}

// TestFSMFreedAfterPublish: the FSM tells the leader's hand-off that a
// lock was freed only once the batch that freed it is published, so that
// the hand-off, reading the lock as readers do, finds it free. Told
// during the apply, it read the lock as still held and gave up until a
// next kick that never came: a queued acquire then waited out its whole
// wait with the lock free (found by TestClockDriftBound run after
// TestQueuedAcquireCutDuringHandOff under -race; this is the targeted
// form of it).
func TestFSMFreedAfterPublish(t *testing.T) {
	m, err := state.OpenMachine(filepath.Join(t.TempDir(), fencekv.DataFile), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	var seen []state.LockInfo
	f := newFSM(m, slog.New(slog.DiscardHandler), func(name string) {
		in, err := m.LockInfo(0, name)
		if err != nil {
			t.Errorf("LockInfo(%s) in the freed callback: %v", name, err)
		}
		seen = append(seen, in)
	})
	entry := func(index uint64, c state.Command) *raft.Log {
		return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: state.EncodeBatch([]state.Command{c})}
	}
	out := f.ApplyBatch([]*raft.Log{entry(1, state.Command{Op: state.OpAcquire, Lease: state.LeaseRequest{Name: "L", TTL: time.Minute}})})
	rs, ok := out[0].([]state.Result)
	if !ok || rs[0].Err != nil {
		t.Fatalf("acquire: %v", out[0])
	}
	// The release and an unrelated put in one batch, the release first:
	// the hand-off must see the whole batch, not the release alone.
	out = f.ApplyBatch([]*raft.Log{
		entry(2, state.Command{Op: state.OpRelease, Lease: state.LeaseRequest{Name: "L"}, Token: rs[0].Grant.Token}),
		putEntry(3, "k"),
	})
	if rs, ok := out[0].([]state.Result); !ok || rs[0].Err != nil || !rs[0].Freed {
		t.Fatalf("release: %v", out[0])
	}
	if len(seen) != 1 {
		t.Fatalf("the freed callback ran %d times; want once", len(seen))
	}
	if seen[0].Held {
		t.Fatalf("the freed callback read L as %+v: still held, the batch not yet published", seen[0])
	}
	if got := m.Applied(); got != 3 {
		t.Fatalf("applied %d after the batch; want 3", got)
	}
}

// TestAppliedToWaitsForTheFSM: raft moves a follower's AppliedIndex when it
// hands entries to the FSM's goroutine, before the FSM has applied them.
// A read that waits for an index must wait for the FSM: taking raft's
// word, a follower read answered from a state without a write that was
// acknowledged before the read began (TestLinearizableCluster found it).
// Here the follower's FSM is held inside one batch (the release's freed
// callback) while raft hands it the next entry, a put.
func TestAppliedToWaitsForTheFSM(t *testing.T) {
	nodes := memNodes(t, 3)
	type gate struct{ entered, release chan struct{} }
	gates := make([]atomic.Pointer[gate], len(nodes))
	for i, nd := range nodes {
		nd.fsm.freed = func(string) {
			if g := gates[i].Load(); g != nil {
				close(g.entered)
				<-g.release
			}
		}
	}
	bootMemGroup(t, nodes)
	l := memLeader(t, nodes)
	fi := 0
	for nodes[fi] == l {
		fi++
	}
	f := nodes[fi]
	acq := propose(t, l, state.Command{Op: state.OpAcquire, Lease: state.LeaseRequest{Name: "L", TTL: time.Minute}})
	if acq[0].Err != nil {
		t.Fatal(acq[0].Err)
	}
	waitApplied(t, nodes, l.raft.LastIndex())

	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	gates[fi].Store(g)
	released := false
	defer func() {
		if !released {
			close(g.release)
		}
	}()
	propose(t, l, state.Command{Op: state.OpRelease, Lease: state.LeaseRequest{Name: "L"}, Token: acq[0].Grant.Token})
	<-g.entered // the follower's FSM is inside the release's batch
	fut := l.raft.Apply(state.EncodeBatch([]state.Command{put("k", "v", 0)}), 5*time.Second)
	if err := fut.Error(); err != nil {
		t.Fatal(err)
	}
	index := fut.Index()
	for deadline := time.Now().Add(10 * time.Second); f.raft.AppliedIndex() < index; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the follower's raft did not hand on index %d", index)
		}
	}
	if e, err := f.m.Get([]byte("k")); err != nil || e.Value != nil {
		t.Fatalf("the follower's k = %+v, %v while its FSM is held: the test does not hold it", e, err)
	}
	if appliedTo(fsmApplied(f), f.raft, f.logs, index) {
		t.Fatalf("appliedTo(%d) on the follower while its FSM is held before the put; raft's AppliedIndex is %d", index, f.raft.AppliedIndex())
	}

	close(g.release)
	released = true
	waitApplied(t, []*memNode{f}, index)
	if !appliedTo(fsmApplied(f), f.raft, f.logs, index) {
		t.Fatalf("appliedTo(%d) false once the follower applied it", index)
	}
	if e, err := f.m.Get([]byte("k")); err != nil || string(e.Value) != "v" {
		t.Fatalf("the follower's k = %+v, %v after it applied the put", e, err)
	}

	// A barrier is never given to the FSM: the leader's state covers its
	// index once raft has handed it on.
	if err := l.raft.Barrier(5 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	barrier := l.raft.AppliedIndex()
	if applied, _ := l.fsm.appliedIndex(); applied >= barrier {
		t.Fatalf("the FSM's applied index %d is the barrier's %d: the case is not exercised", applied, barrier)
	}
	if !appliedTo(fsmApplied(l), l.raft, l.logs, barrier) {
		t.Fatalf("appliedTo(%d), a barrier after the FSM's last entry, is false", barrier)
	}
}

func fsmApplied(nd *memNode) uint64 {
	i, _ := nd.fsm.appliedIndex()
	return i
}
