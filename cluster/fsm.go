package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/hashicorp/raft"
)

// fsm is raft's state machine: the engine's Machine, applied one batch of
// committed log entries at a time. Each command entry holds a batch of
// commands (state.EncodeBatch); their results go back to the proposer
// through raft's ApplyFuture.
//
// The Machine keeps its state in its own bbolt file, with the last raft
// index it applied, so a restarted node does not need raft to restore a
// snapshot (NoSnapshotRestoreOnStart): entries at or below that index are
// skipped on replay.
//
// Threading (raft's contract): ApplyBatch, Snapshot and Restore are called
// from raft's FSM goroutine, one at a time; a snapshot's Persist runs
// concurrently with later ApplyBatch calls.
type fsm struct {
	m   *state.Machine
	log *slog.Logger

	// freed receives the names of locks that a command freed (a release
	// or an expiry), for the leader's hand-off to waiters: once the batch
	// is published, so that the hand-off reads the lock as freed.
	freed      func(name string)
	freedNames []string // the batch's, until it is published (FSM goroutine)
	// failed is called once, from ApplyBatch, when the machine has failed.
	failed     func(error)
	failedOnce sync.Once
	// failNext, set by tests, fails the machine (on the FSM's goroutine,
	// its owner) before the next batch, as a storage error would.
	failNext atomic.Pointer[error]

	mu      sync.Mutex
	applied uint64        // guarded by mu: the last raft index applied
	change  chan struct{} // guarded by mu: closed (and replaced) when applied moves

	sinceCkpt int
	lastCkpt  time.Time

	smu    sync.Mutex     // guards snaps, snapSt
	snaps  uint64         // snapshots taken
	snapSt fencekv.Status // the counters of the last one
}

var (
	_ raft.FSM         = (*fsm)(nil)
	_ raft.BatchingFSM = (*fsm)(nil)
)

// checkpointEvery and checkpointEntries bound how far the data file lags
// the raft log (the log is durable; the file catches up at checkpoints).
const (
	checkpointEvery   = 200 * time.Millisecond
	checkpointEntries = 4096
)

func newFSM(m *state.Machine, log *slog.Logger, freed func(string)) *fsm {
	return &fsm{m: m, log: log, freed: freed, applied: m.Applied(), change: make(chan struct{}), lastCkpt: time.Now()}
}

// Apply applies one entry.
func (f *fsm) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch applies committed entries in order. A command entry's
// response is a []state.Result, one per command; an entry the machine
// could not apply (it failed: storage error, or a log of a newer version)
// answers an error, and the machine stays failed.
func (f *fsm) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	if f.failNext.Load() != nil { // a test's (a plain load: no write per batch)
		if err := f.failNext.Swap(nil); err != nil {
			f.m.Fail(*err)
		}
	}
	var last uint64
	for i, l := range logs {
		last = l.Index
		if l.Type != raft.LogCommand || l.Index <= f.m.Applied() {
			continue // configuration entries change no state of ours; old entries are in the file
		}
		out[i] = f.applyEntry(l)
	}
	if err := f.m.Failed(); err != nil {
		// The machine failed, in this batch or before it: it discarded
		// what it had applied of the batch, so no result of it holds.
		// None is answered as applied (the proposers answer an unknown
		// outcome: the entries are committed, and the other nodes apply
		// them), and the applied index stays where it was, so no read
		// waits for it here.
		err = fmt.Errorf("cluster: this node's state machine failed: %w", err)
		for i := range out {
			out[i] = err
		}
		if f.failed != nil {
			f.failedOnce.Do(func() { f.failed(err) })
		}
		clear(f.freedNames)
		f.freedNames = f.freedNames[:0]
		return out
	}
	if last > f.m.Applied() {
		// Not for a batch replayed after a restart that the data file
		// already holds: Publish would move Applied back, and the entries
		// between would be applied a second time.
		f.m.Publish(last)
	}
	// Only now: a hand-off that read the lock before the batch was
	// published found it still held, and gave up until the next kick,
	// which never came (a queued acquire then waited out its wait
	// although the lock was free: TestClockDriftBound after
	// TestQueuedAcquireCutDuringHandOff, under -race).
	for _, name := range f.freedNames {
		f.freed(name)
	}
	clear(f.freedNames)
	f.freedNames = f.freedNames[:0]
	f.sinceCkpt += len(logs)
	if f.sinceCkpt >= checkpointEntries || time.Since(f.lastCkpt) >= checkpointEvery {
		if err := f.m.Checkpoint(); err != nil {
			f.log.Error("checkpoint failed; this node stops applying until restart", "err", err)
		}
		f.sinceCkpt, f.lastCkpt = 0, time.Now()
	}
	f.setApplied(last)
	return out
}

func (f *fsm) applyEntry(l *raft.Log) any {
	cmds, err := state.DecodeBatch(l.Data)
	if err != nil {
		err = fmt.Errorf("cluster: raft entry %d: %w", l.Index, err)
		f.m.Fail(err)
		f.log.Error("cannot apply the replicated log; this node stops applying", "err", err)
		return err
	}
	res := make([]state.Result, len(cmds))
	for i := range cmds {
		r, err := f.m.Apply(&cmds[i])
		if err != nil {
			f.log.Error("applying the replicated log failed; this node stops applying until restart", "index", l.Index, "err", err)
			return err
		}
		res[i] = r
		if r.Freed && f.freed != nil {
			f.freedNames = append(f.freedNames, cmds[i].Lease.Name)
		}
	}
	return res
}

func (f *fsm) setApplied(i uint64) {
	f.mu.Lock()
	if i > f.applied {
		f.applied = i
		close(f.change)
		f.change = make(chan struct{})
	}
	f.mu.Unlock()
}

// appliedIndex returns the last index applied and a channel closed when
// it next moves.
func (f *fsm) appliedIndex() (uint64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applied, f.change
}

// Snapshot checkpoints the machine and returns a snapshot that reads the
// data file only when raft persists it. Raft holds the FSMSnapshot while
// it asks its main goroutine for the configuration, and that goroutine may
// be waiting for this one (an install's Restore, or a full apply queue): a
// bbolt read transaction held across that wait would stop a Restore (it
// closes the file) or a checkpoint that grows the file, for good. Taken
// at Persist, the file may hold entries applied after the snapshot's
// index, never fewer: the machine skips entries at or below its own
// applied index, so a node that installs it applies the rest once.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	if err := f.m.Checkpoint(); err != nil {
		return nil, err
	}
	f.sinceCkpt, f.lastCkpt = 0, time.Now()
	// Nothing is applied while raft takes the snapshot: the published
	// counters are the snapshot's index's (a backup reports them; the
	// file it persists may be newer).
	c, err := f.m.Counters()
	if err != nil {
		return nil, err
	}
	st := fencekv.Status{Counters: c}
	f.smu.Lock()
	f.snaps++
	f.snapSt = st
	f.smu.Unlock()
	return &snapshot{m: f.m}, nil
}

// lastSnapshot returns the number of snapshots taken and the counters of
// the last.
func (f *fsm) lastSnapshot() (uint64, fencekv.Status) {
	f.smu.Lock()
	defer f.smu.Unlock()
	return f.snaps, f.snapSt
}

// Restore replaces the machine's state with a snapshot from the leader.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.m.Restore(rc); err != nil {
		return err
	}
	f.mu.Lock()
	f.applied = f.m.Applied()
	close(f.change)
	f.change = make(chan struct{})
	f.mu.Unlock()
	return nil
}

// snapshot streams the machine's data file to raft's snapshot store,
// reading it only when raft persists it (see Snapshot).
type snapshot struct{ m *state.Machine }

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	fs, err := s.m.FileSnapshot()
	if err != nil {
		sink.Cancel()
		return err
	}
	defer fs.Close()
	if _, err := fs.WriteTo(sink); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *snapshot) Release() {}
