package fencekv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv/lease"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wal"
)

// DB is an open fencekv engine on one node: the state machine (Machine)
// driven by its own write-ahead log, with group commit (batch.go), the
// durable path (commit.go) and the expiry loop (expiry.go). Its methods
// are safe for concurrent use.
//
// The single node keeps its own log rather than raft's: one fdatasync of
// one appended record per batch, and the data file brought up to date
// only at checkpoints. A one-node raft would add a second log write per
// batch (raft's log store is itself a bbolt file with its own commits).
type DB struct {
	opts  Options
	log   *slog.Logger
	clock Clock
	epoch time.Time

	refusals *RefusalLog

	// m is the state machine. Its write side is used by the batch leader
	// only (and by Open and Close, before and after any leader).
	m      *state.Machine
	queues *lease.Queues // callers waiting for locks (in memory)

	qmu     sync.Mutex // guards pending, leading, closed
	qidle   sync.Cond  // signalled (with qmu) when leading ends
	pending []*request // submitted, not yet taken into a batch, oldest first
	leading bool       // a goroutine is the leader: it alone applies batches
	closed  bool

	stop      chan struct{}  // closed by Close: stops the expiry loop and idle committers
	wg        sync.WaitGroup // the expiry loop and the committers, awaited by Close
	answering sync.WaitGroup // leaders answering their batch's started writes, awaited by Close

	wal *wal.Log // the write-ahead log; used only by the leader (and Open, Close)

	// Owned by the leader (see lead):
	gather bool // the last batch had company: yield before taking the next
	batch  []*request

	commit         chan struct{} // to an idle committer goroutine (kickCommitter)
	idleCommitters atomic.Int32
	seq            uint64    // the last log record written
	rec            []byte    // the log record being built for the current batch
	logged         int       // commands in rec
	sinceCkpt      int       // log records since the last checkpoint
	lastCkpt       time.Time // when the last checkpoint ended, by the real clock (an I/O policy, not lease time)

	// beforeSync, if set (by tests), runs between appending a batch's log
	// record and syncing it; an error fails the sync.
	beforeSync func() error

	// lastSync is how long the last log record took to write and sync
	// (for Options.Observer). Owned by the leader.
	lastSync time.Duration

	mu     sync.Mutex // guards failed
	failed error      // set when a batch could not be applied or made durable; writes are refused after

	commits     atomic.Uint64
	commands    atomic.Uint64
	syncNanos   atomic.Int64 // time spent writing and syncing log records
	checkpoints atomic.Uint64
	ckptNanos   atomic.Int64 // time spent in checkpoints

	closeOnce sync.Once
	closeErr  error
}

// Open opens the data dir (creating it if needed), replays the log records
// its data file does not reflect yet, and starts the expiry loop. It fails
// with ErrLocked when another process has the dir open, and with
// ErrSchema for a file of another schema version. Every live lease gets
// its full TTL again (G7), by a rearm command logged like any other.
func Open(dir string, opts *Options) (*DB, error) {
	o := DefaultOptions()
	if opts != nil {
		o = *opts
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	_, statErr := os.Stat(dir)
	created := errors.Is(statErr, os.ErrNotExist)
	if _, err := os.Stat(filepath.Join(dir, NodeFile)); err == nil {
		// Its state is a replica's, perhaps behind the cluster's: a
		// single node on it could issue the cluster's tokens again (G1).
		return nil, fmt.Errorf("fencekv: data dir %s belongs to a cluster node (its name is in %s): start it as that node (fencekv serve --node), or, for a single node with the cluster's state, back up a running node (fencekv backup) and restore the backup into a new dir (fencekv restore), which moves the token sequence past a gap", dir, NodeFile)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("fencekv: data dir: %w", err)
	}
	m, err := state.OpenMachine(filepath.Join(dir, DataFile), o.NoSync)
	if err != nil {
		return nil, err
	}
	queues := lease.NewQueues()
	m.SetQueues(queues)
	// The data file's lock (taken by kv.Open) also guards the log.
	logPath := filepath.Join(dir, LogFile)
	log, recs, tail, err := wal.Open(logPath, m.Applied())
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("fencekv: open: %w", err)
	}
	// The files' names, when just created, must be durable before the
	// first write acknowledged in them (G6): an fsync of a file does not
	// promise its directory entry. (Nor the entry of a dir just created.)
	if !o.NoSync {
		err := wal.SyncDir(dir)
		if err == nil && created {
			err = wal.SyncDir(filepath.Dir(filepath.Clean(dir)))
		}
		if err != nil {
			log.Close()
			m.Close()
			return nil, fmt.Errorf("fencekv: open: %w", err)
		}
	}
	db := &DB{
		opts:   o,
		log:    o.Logger,
		clock:  o.Clock,
		m:      m,
		queues: queues,
		wal:    log,
		stop:   make(chan struct{}),
		commit: make(chan struct{}),
	}
	db.qidle.L = &db.qmu
	if db.log == nil {
		db.log = slog.New(slog.DiscardHandler)
	}
	if db.clock == nil {
		db.clock = RealClock()
	}
	db.refusals = NewRefusalLog(o.MaxRefusals, db.log)
	m.LogUpgrade(db.log)
	db.epoch = db.clock.Now()
	// The watch history (kept in the data file) before the replay: the
	// replayed commands' events are recorded as they are applied again,
	// once, after those the file kept.
	if err := m.EnableWatch(o.WatchHistory, o.WatchHistoryBytes, o.MaxWatchers); err != nil {
		m.Close()
		log.Close()
		return nil, fmt.Errorf("fencekv: open: %w", err)
	}
	if err := db.replay(recs); err != nil {
		m.CloseWatch()
		m.Close()
		log.Close()
		return nil, fmt.Errorf("fencekv: open: %w", err)
	}
	db.lastCkpt = time.Now()
	rearm := state.Command{Op: state.OpRearm}
	if tail.Torn {
		floor, err := db.tokenFloor(logPath, tail)
		if err != nil {
			m.CloseWatch()
			m.Close()
			log.Close()
			return nil, fmt.Errorf("fencekv: open: %w", err)
		}
		rearm.Token = floor
		db.log.Warn("the write-ahead log ends in a damaged record: dropped it as a torn append (a crash cut it short; it was never acknowledged if its sync did not finish) and moved the token sequence past any token it could have issued",
			"log", logPath, "offset", tail.Offset, "what", tail.Reason, "next_token_above", uint64(floor))
	}
	if r := db.exec(context.Background(), rearm); r.Err != nil {
		db.Close()
		return nil, fmt.Errorf("fencekv: open: re-arming leases: %w", r.Err)
	}
	db.wg.Add(1)
	go db.expiryLoop()
	return db, nil
}

// Close stops accepting commands, lets the leader answer every command
// already submitted, fails queued waiters with ErrUnavailable, and closes
// the file. It returns even after a failure. It is safe to call more than
// once; later calls return the first call's result.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		// Apply expiries already due, so that a lease that ran out before
		// a clean Close does not come back, re-armed, after Open.
		db.expireDue(db.now())
		db.qmu.Lock()
		db.closed = true
		for db.leading || len(db.pending) > 0 {
			db.qidle.Wait()
		}
		db.qmu.Unlock()
		db.answering.Wait() // the last leader's callbacks
		db.drainWaiters()
		db.m.CloseWatch()
		close(db.stop)
		db.wg.Wait()
		var ckpt error
		if db.failure() == nil {
			ckpt = db.checkpoint()
		}
		db.closeErr = errors.Join(ckpt, db.m.Close(), db.wal.Close())
	})
	return db.closeErr
}

// now is the engine's time: the monotonic offset since Open.
func (db *DB) now() time.Duration { return db.clock.Now().Sub(db.epoch) }

var errClosed = errorf(CodeUnavailable, "the database is closed")

// fail puts the DB in its failed state after a batch could not be applied
// or made durable: the machine discards the batch, and every later write
// is refused with ErrUnavailable at once. What was acknowledged is durable
// in the log; a restart replays it. Reads go on serving what was
// acknowledged. Called by the leader.
func (db *DB) fail(err error) {
	var pe *state.PanicError
	if errors.As(err, &pe) {
		db.log.Error("the store failed; refusing writes until restart", "err", err, "stack", string(pe.Stack))
	} else {
		db.log.Error("the store failed; refusing writes until restart", "err", err)
	}
	db.m.Fail(err)
	db.mu.Lock()
	if db.failed == nil {
		db.failed = err
	}
	db.mu.Unlock()
}

// failure returns the error that failed the DB, or nil.
func (db *DB) failure() error {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.failed
}

// tokenFloor is the token sequence's new floor after a torn last log
// record: above every token that record could have issued (G1), had its
// sync finished before the crash and its grants been answered. A record
// issues at most one token per command, and every command takes more
// than one byte, so the bytes from the record to the end of the file bound
// them.
func (db *DB) tokenFloor(logPath string, tail wal.Tail) (Token, error) {
	fi, err := os.Stat(logPath)
	if err != nil {
		return 0, err
	}
	c, err := db.m.Counters()
	if err != nil {
		return 0, err
	}
	return c.LastToken + Token(max(fi.Size()-tail.Offset, 0)) + 1, nil
}
