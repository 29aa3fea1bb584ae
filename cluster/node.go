package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wal"
	"github.com/fencekv/fencekv/wire"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
)

// Files of a node's data dir, beside the engine's data file.
const (
	nameFile      = fencekv.NodeFile // the node's name, fixed at its first start
	raftFile      = "raft.db"        // raft's term and vote (raft-boltdb); its log, before raftLogDir
	raftLogDir    = "raft-log"       // raft's log (logstore.go)
	snapshotsDir  = "snapshots"      // raft's snapshots of the data file
	keepSnapshots = 2
	logCacheSize  = 1024 // raft entries kept in memory (raft.LogCache)
)

// Node is one member of a cluster. It serves the same methods as a
// single-node fencekv.DB (wire.Engine), on every node: the leader
// proposes writes and lock commands through raft and answers reads after
// a quorum round; the others forward to it.
//
// Its methods are safe for concurrent use.
type Node struct {
	cfg   Config
	opts  *fencekv.Options
	log   *slog.Logger
	clock fencekv.Clock // lease time: cfg.Engine.Clock, or the real one
	epoch time.Time

	m      *state.Machine // write side owned by raft's FSM goroutine
	queues *state.Queues  // callers waiting for locks, served while this node leads (leader.go)
	fsm    *fsm
	raft   *raft.Raft
	trans  *raft.NetworkTransport
	votes  *voteGuard            // raft's transport: trans, without the votes of a node that has not caught up (votes.go)
	store  *raftboltdb.BoltStore // raft's stable store
	logs   *logStore             // raft's log
	ml     *memberlist.Memberlist
	mdel   *members

	mu     sync.Mutex    // guards ready, term, change
	ready  bool          // this node leads, and its rearm has been applied
	term   uint64        // the term in which it became ready
	change chan struct{} // closed (and replaced) when leadership or readiness changes

	notify   chan bool // raft's leadership notifications
	observer *raft.Observer

	leaderChanges atomic.Uint64 // leader observations (metrics)
	followerReads atomic.Uint64 // linearizable reads answered here as a follower (followerread.go)
	seeds         *seedState    // set while the store restored from a backup has yet to seed the cluster (ops.go)

	hmu    sync.Mutex          // guards kicked
	kicked map[string]struct{} // locks freed (or with a new waiter) for the hand-off loop to look at
	hwake  chan struct{}       // wakes the hand-off loop

	reads    verifier
	asker    indexAsker // a follower's read indexes (followerread.go)
	fwd      forwarder
	props    *proposer
	refusals *fencekv.RefusalLog

	stop chan struct{} // closed by Close
	wg   sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

var _ wire.Engine = (*Node)(nil)

// Open starts a node: its state machine, raft and gossip. It returns once
// the node is serving (it may not have a leader yet; requests wait for one
// up to HoldTimeout).
func Open(cfg Config) (n *Node, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	_, statErr := os.Stat(cfg.Dir)
	created := errors.Is(statErr, os.ErrNotExist)
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: data dir: %w", err)
	}
	if singleNodeDir(cfg.Dir) {
		return nil, errForeignStore(cfg.Dir) // before anything is written in it
	}
	if err := checkName(cfg.Dir, cfg.Name); err != nil {
		return nil, err
	}
	n = &Node{
		cfg:    cfg,
		opts:   &cfg.Engine,
		log:    cfg.Engine.Logger,
		change: make(chan struct{}),
		stop:   make(chan struct{}),
		hwake:  make(chan struct{}, 1),
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	n.log = n.log.With("node", cfg.Name)
	n.refusals = fencekv.NewRefusalLog(cfg.Engine.MaxRefusals, n.log)
	n.clock = cfg.Engine.Clock
	if n.clock == nil {
		n.clock = fencekv.RealClock()
	}
	n.epoch = n.clock.Now()
	var closers []io.Closer
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i].Close()
			}
		}
	}()

	n.m, err = state.OpenMachine(filepath.Join(cfg.Dir, fencekv.DataFile), cfg.Engine.NoSync)
	if err != nil {
		return nil, err
	}
	n.queues = state.NewQueues()
	n.m.SetQueues(n.queues)
	closers = append(closers, n.m)
	n.m.LogUpgrade(n.log)
	if err := n.m.EnableWatch(cfg.Engine.WatchHistory, cfg.Engine.WatchHistoryBytes, cfg.Engine.MaxWatchers); err != nil {
		return nil, err
	}
	n.fsm = newFSM(n.m, n.log, n.freed)
	n.fsm.failed = n.machineFailed

	if err := n.startRaft(created); err != nil {
		return nil, err
	}
	// The closers must not use n: a failed Open returns, and so sets, a
	// nil n before they run.
	r := n.raft
	closers = append(closers, closerFunc(func() error { return r.Shutdown().Error() }), n.votes, n.logs, n.store)
	if err := n.checkSeed(); err != nil {
		return nil, err
	}

	n.reads.n = n
	n.asker.n = n
	n.fwd.n = n
	n.props = newProposer(n)
	n.wg.Go(n.props.run)
	stop := n.stop
	closers = append(closers, closerFunc(func() error { close(stop); return nil }))
	if err := n.startGossip(); err != nil {
		return nil, err
	}
	obs := make(chan raft.Observation, 16)
	n.observer = raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.raft.RegisterObserver(n.observer)
	n.wg.Go(n.watchLeadership)
	n.wg.Go(func() { n.watchLeader(obs) })
	return n, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// checkName records the node's name in its data dir at first start, and
// refuses a data dir that belongs to another node.
func checkName(dir, name string) error {
	path := filepath.Join(dir, nameFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.WriteFile(path, []byte(name+"\n"), 0o600)
	case err != nil:
		return fmt.Errorf("cluster: %w", err)
	case strings.TrimSpace(string(b)) != name:
		return fmt.Errorf("cluster: data dir %s belongs to node %q, not %q", dir, strings.TrimSpace(string(b)), name)
	}
	return nil
}

// singleNodeDir reports whether dir holds a single node's store: its
// write-ahead log, and no raft state.
func singleNodeDir(dir string) bool {
	_, walErr := os.Stat(filepath.Join(dir, fencekv.LogFile))
	_, raftErr := os.Stat(filepath.Join(dir, raftFile))
	return walErr == nil && errors.Is(raftErr, os.ErrNotExist)
}

func (n *Node) startRaft(created bool) error {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(n.cfg.Name)
	rc.HeartbeatTimeout = n.cfg.HeartbeatTimeout
	rc.ElectionTimeout = n.cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = n.cfg.HeartbeatTimeout / 2
	rc.SnapshotThreshold = n.cfg.SnapshotThreshold
	rc.SnapshotInterval = n.cfg.SnapshotInterval
	rc.TrailingLogs = n.cfg.TrailingLogs
	rc.NoSnapshotRestoreOnStart = true // the machine keeps its own state (fsm.go)
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 256
	notify := make(chan bool, 16)
	rc.NotifyCh = notify
	n.notify = notify
	rc.Logger = hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       hclog.Warn,
		Output:      slogWriter{n.log},
		DisableTime: true, // the node's log has its own
	})

	var err error
	n.store, err = raftboltdb.New(raftboltdb.Options{Path: filepath.Join(n.cfg.Dir, raftFile), NoSync: n.cfg.Engine.NoSync,
		BoltOptions: &bbolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType}})
	if err != nil {
		return fmt.Errorf("cluster: raft log: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(n.cfg.Dir, snapshotsDir), keepSnapshots, rc.Logger)
	if err != nil {
		n.store.Close()
		return fmt.Errorf("cluster: raft snapshots: %w", err)
	}
	addr, err := net.ResolveTCPAddr("tcp", n.cfg.raftAdvertise())
	if err != nil {
		n.store.Close()
		return fmt.Errorf("cluster: raft address: %w", err)
	}
	if n.cfg.RaftTLS != nil {
		// Mutual TLS between peers (tls.go).
		var stream *tlsStream
		if stream, err = newTLSStream(n.cfg.RaftAddr, addr, n.cfg.RaftTLS); err == nil {
			n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
				Stream: stream, MaxPool: 3, Timeout: 10 * time.Second, Logger: rc.Logger})
		}
	} else {
		n.trans, err = raft.NewTCPTransportWithLogger(n.cfg.RaftAddr, addr, 3, 10*time.Second, rc.Logger)
	}
	if err != nil {
		n.store.Close()
		return fmt.Errorf("cluster: raft transport: %w", err)
	}
	logDir := filepath.Join(n.cfg.Dir, raftLogDir)
	if err := moveLog(n.store, logDir, n.cfg.Engine.NoSync, n.log); err != nil {
		n.trans.Close()
		n.store.Close()
		return err
	}
	if n.logs, err = openLogStore(logDir, n.cfg.Engine.NoSync); err != nil {
		n.trans.Close()
		n.store.Close()
		return err
	}
	if err := n.finishInstall(snaps); err != nil {
		n.trans.Close()
		n.logs.Close()
		n.store.Close()
		return err
	}
	// Keep the newest entries in memory: the leader reads each entry it
	// sends to followers and the FSM each entry it applies, and would
	// otherwise read them back from the files.
	logs, err := raft.NewLogCache(logCacheSize, n.logs)
	if err != nil {
		n.trans.Close()
		n.logs.Close()
		n.store.Close()
		return fmt.Errorf("cluster: raft log cache: %w", err)
	}
	// The names of the files just created (the data file, raft.db with
	// the term and vote, raft-log/) must be durable before raft
	// acknowledges anything in them; so must a data dir just created.
	if !n.cfg.Engine.NoSync {
		err := wal.SyncDir(n.cfg.Dir)
		if err == nil && created {
			err = wal.SyncDir(filepath.Dir(filepath.Clean(n.cfg.Dir)))
		}
		if err != nil {
			n.trans.Close()
			n.logs.Close()
			n.store.Close()
			return fmt.Errorf("cluster: data dir: %w", err)
		}
	}
	hasState, err := raft.HasExistingState(logs, n.store, snaps)
	if err != nil {
		n.trans.Close()
		n.logs.Close()
		n.store.Close()
		return fmt.Errorf("cluster: raft state: %w", err)
	}
	fresh, done, err := n.freshness(hasState)
	if err != nil {
		n.trans.Close()
		n.logs.Close()
		n.store.Close()
		return err
	}
	store := n.store
	n.votes = newVoteGuard(n.trans, fresh, raft.RPCHeader{ProtocolVersion: rc.ProtocolVersion,
		ID: []byte(n.cfg.Name), Addr: n.trans.EncodePeer(raft.ServerID(n.cfg.Name), n.trans.LocalAddr())}, n.log,
		func(term, commit uint64) bool { return caughtUp(logs, snaps, term, commit) },
		func() uint64 { t, _ := store.GetUint64([]byte("CurrentTerm")); return t }, // raft's key for it
		done)
	go n.votes.run()
	n.raft, err = raft.NewRaft(rc, n.fsm, logs, n.store, snaps, newDiskGate(n.votes, &n.logs.busy, n.cfg.HeartbeatTimeout, n.logs.Failed, n.log))
	if err != nil {
		n.votes.Close()
		n.logs.Close()
		n.store.Close()
		return fmt.Errorf("cluster: raft: %w", err)
	}
	return nil
}

// freshFile marks a data dir whose node has not caught up since it
// started without raft state (votes.go): the first entries it gets give
// it raft state long before it has caught up, and a restart must not end
// its freshness.
const freshFile = "raft-fresh"

// freshness reports whether the node starts fresh (votes.go), making the
// marker if it starts without raft state, and returns what removes it.
func (n *Node) freshness(hasState bool) (fresh bool, done func(), err error) {
	marker := filepath.Join(n.cfg.Dir, freshFile)
	sync := func() error {
		if n.cfg.Engine.NoSync {
			return nil
		}
		return wal.SyncDir(n.cfg.Dir)
	}
	done = func() {
		if err := os.Remove(marker); err != nil && !errors.Is(err, fs.ErrNotExist) {
			n.log.Error("removing the fresh-node marker", "file", marker, "err", err)
			return
		}
		if err := sync(); err != nil {
			n.log.Error("syncing the data dir", "err", err)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		return true, done, nil
	}
	if hasState {
		return false, done, nil
	}
	if err := os.WriteFile(marker, []byte("this node has not caught up with a leader since it started without raft state\n"), 0o644); err != nil {
		return false, nil, fmt.Errorf("cluster: %w", err)
	}
	if err := sync(); err != nil {
		return false, nil, fmt.Errorf("cluster: data dir: %w", err)
	}
	return true, done, nil
}

// caughtUp reports whether the log holds the entry at index commit, of
// the given term, or a snapshot of that term at or past commit (see
// voteGuard).
func caughtUp(logs raft.LogStore, snaps raft.SnapshotStore, term, commit uint64) bool {
	if last, err := logs.LastIndex(); err == nil && last >= commit {
		var l raft.Log
		if err := logs.GetLog(commit, &l); err == nil {
			return l.Term == term
		}
	}
	metas, err := snaps.List()
	return err == nil && len(metas) > 0 && metas[0].Term == term && metas[0].Index >= commit
}

// finishInstall finishes what a crash may have cut short when raft
// installed a snapshot from the leader (or restored one): raft writes the
// snapshot to its store, then has the engine load it, then deletes the
// whole log. Raft starts again from its newest snapshot's index, trusting
// the engine to hold that state (NoSnapshotRestoreOnStart: the engine
// keeps its own), and applies only the entries after it. So an engine
// behind the snapshot loads it now: else it would never get the entries
// up to the snapshot's index, and answer without them for good. And a log
// that ends below the snapshot, wholly covered by it, is deleted: else no
// entry after the snapshot could follow it. (The node's own snapshots
// never get ahead of the engine: the engine checkpoints before each.)
func (n *Node) finishInstall(snaps raft.SnapshotStore) error {
	metas, err := snaps.List()
	if err != nil {
		return fmt.Errorf("cluster: raft snapshots: %w", err)
	}
	if len(metas) == 0 {
		return nil
	}
	meta := metas[0] // the newest: the one raft starts from
	if applied := n.m.Applied(); applied < meta.Index {
		_, rc, err := snaps.Open(meta.ID)
		if err != nil {
			return fmt.Errorf("cluster: raft snapshot %s: %w", meta.ID, err)
		}
		err = n.fsm.Restore(rc) // closes rc
		if err != nil {
			return fmt.Errorf("cluster: loading raft snapshot %s (the engine is behind it, at %d): %w", meta.ID, applied, err)
		}
		n.log.Warn("loaded the raft snapshot whose install a crash interrupted", "snapshot", meta.ID, "snapshot_index", meta.Index, "applied_before", applied)
	}
	first, _ := n.logs.FirstIndex()
	last, _ := n.logs.LastIndex()
	if last != 0 && last < meta.Index {
		if err := n.logs.DeleteRange(first, last); err != nil {
			return err
		}
		n.log.Warn("deleted raft log entries the newest snapshot covers (a crash interrupted their deletion)", "first", first, "last", last, "snapshot_index", meta.Index)
	}
	return nil
}

// slogWriter carries raft's and memberlist's log lines into the node's
// logger.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level, msg := slog.LevelInfo, line
	// Both tag a line with its level: "[WARN]  raft: ...", "[ERR]
	// memberlist: ..." (without their own timestamps: see their set-up).
	if i := strings.IndexByte(line, '['); i >= 0 {
		if j := strings.IndexByte(line[i:], ']'); j > 0 {
			known := true
			switch line[i+1 : i+j] {
			case "ERR", "ERROR":
				level = slog.LevelError
			case "WARN":
				level = slog.LevelWarn
			case "INFO":
			case "DEBUG", "TRACE":
				level = slog.LevelDebug
			default:
				known = false
			}
			if known {
				msg = strings.TrimSpace(line[:i] + line[i+j+1:])
			}
		}
	}
	switch {
	case strings.Contains(msg, "failed to heartbeat"), strings.Contains(msg, "failed to appendEntries"),
		strings.Contains(msg, "failed to pipeline appendEntries"), strings.Contains(msg, "failed to contact"):
		// Every few hundred milliseconds while a peer is down (or as it
		// restarts): gossip reports the peer's death once, at info.
		level = slog.LevelDebug
	case strings.Contains(msg, "transport shutdown"):
		level = slog.LevelDebug // this node stopping: it says so itself
	case strings.Contains(msg, "Refuting a dead message"):
		level = min(level, slog.LevelInfo) // a node restarted faster than gossip noticed it went
	}
	w.log.Log(context.Background(), level, msg)
	return len(p), nil
}

// Close leaves gracefully: a leader hands leadership to another server
// first, gossip is told the node left, and raft and the files are closed.
// The node stays a raft voter: started again, it rejoins. Close is safe to
// call more than once; later calls return the first call's result.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		if n.raft.State() == raft.Leader && n.voters() > 1 {
			if err := n.raft.LeadershipTransfer().Error(); err != nil {
				n.log.Warn("leadership transfer before shutdown failed", "err", err)
			}
		}
		var errs []error
		if n.ml != nil {
			// Say it is leaving first: memberlist tells the others of a
			// node that left as of a dead one (NotifyLeave's node
			// keeps its old state), so they tell the two apart by this.
			n.mdel.mu.Lock()
			n.mdel.self.Leaving = true
			n.mdel.mu.Unlock()
			if err := n.ml.UpdateNode(500 * time.Millisecond); err != nil {
				n.log.Debug("gossip update before leaving", "err", err)
			}
			if err := n.ml.Leave(time.Second); err != nil {
				n.log.Warn("gossip leave", "err", err)
			}
			errs = append(errs, n.ml.Shutdown())
		}
		close(n.stop)
		n.raft.DeregisterObserver(n.observer)
		errs = append(errs, n.raft.Shutdown().Error())
		n.wg.Wait()
		n.fwd.close()
		n.reads.close()
		n.setLeadership(false, 0)
		n.drainWaiters(errClosed)
		if n.m.Failed() == nil {
			errs = append(errs, n.m.Checkpoint())
		}
		errs = append(errs, n.trans.Close(), n.logs.Close(), n.store.Close(), n.m.Close())
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

func (n *Node) voters() int {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	c := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			c++
		}
	}
	return c
}

// now is the node's monotonic time, which it stamps on the commands it
// proposes as leader.
func (n *Node) now() time.Duration { return n.clock.Now().Sub(n.epoch) }

var errClosed = &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "the node is shutting down"}
