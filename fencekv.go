// Package fencekv is the fencekv engine: a key-value store and a lock
// service in one transactional boundary, for embedding in Go programs. The
// TCP server (package wire) and the fencekv binary are built on it.
//
// A DB has three nouns: keys (with values, a fence and a revision), locks
// (leases with fencing tokens), and commands (the only way either changes).
//
//	db, err := fencekv.Open("data", nil)
//	l, err := db.Acquire(ctx, "inventory", 10*time.Second, nil)
//	_, err = db.Put(ctx, []byte("inventory/sku-1"), []byte("7"), fencekv.WriteOptions{Token: l.Token})
//	err = db.Release(ctx, "inventory", l.Token)
//
// # Guarantees
//
//   - G1: every grant draws its token from one store-wide sequence that
//     strictly increases across locks, restarts and crashes.
//   - G2: every key keeps its fence, the highest token any accepted write to
//     it carried, in the same transaction as its value; a write with a lower
//     token (or not higher, when Strict) is refused with ErrStaleToken. The
//     fence outlives a delete.
//   - G3: a write without a token is accepted only while the key's fence is 0.
//   - G4: a write naming a lock is accepted only if that lock is held by
//     exactly its token and the lease has not expired when it is applied.
//   - G5: grants, renewals, releases, expiries and writes are Commands,
//     applied one after another by one deterministic function inside bbolt
//     read-write transactions.
//   - G6: a call returns only after its command is durable: the commands
//     of a group commit are applied in one bbolt transaction and written as
//     one record to the write-ahead log, which is synced (fdatasync) before
//     any of them is answered. The data file is brought up to date from the
//     log at checkpoints; Open replays what it does not reflect yet.
//   - G7: leases are durations on the engine's monotonic clock; on Open every
//     live lease gets its full TTL again, and every lock in lock-delay its
//     full delay.
//   - G8: every refusal is an *Error with a stable Code and its facts; a
//     refused command changes nothing and does not fail others in its batch.
//
// Reads (Get, Scan, LockInfo, Locks, Status) run in read-only transactions
// concurrently with the writer; they see every acknowledged command and
// nothing that is not yet durable.
//
// # Caveats
//
// Tokens are compared, not authenticated: a caller that writes with a huge
// token it invented fences that key against every real holder. Waiter
// queues live in memory: a restart drops them (their callers get an error).
// An expired lock's record is kept for lease.Retention (10 minutes) after
// the lock became free, or until it is acquired again, so that a late
// holder is told lease_expired; after that it is told not_holder. Only one
// process may open a data dir.
//
// The engine is the root package, not a package of its own, so that
// embedding programs write fencekv.Open and errors.Is(err,
// fencekv.ErrStaleToken), and the same names serve the wire client.
package fencekv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
	"github.com/fencekv/fencekv/wal"
)

// Version is the version of fencekv.
const Version = "0.1.0"

// DataFile is the name of the bbolt file inside a data dir, and LogFile
// the name of its write-ahead log.
const (
	DataFile = "fencekv.db"
	LogFile  = "fencekv.wal"
)

// Options configure a DB. Use DefaultOptions and change what you need; a
// nil *Options to Open means the defaults.
type Options struct {
	Clock  Clock        // nil: the real clock
	Logger *slog.Logger // nil: discard

	// NoSync skips fsync of the log and the data file. It breaks G6; for
	// tests only.
	NoSync bool

	MaxKeySize   int           // bytes; also the limit for lock names and holders
	MaxValueSize int           // bytes
	MinTTL       time.Duration // shortest lease
	MaxTTL       time.Duration // longest lease
	MaxLockDelay time.Duration
	MaxWait      time.Duration // longest wait of a blocking acquire
	MaxWaiters   int           // callers queued for locks, store-wide
	MaxScan      int           // most items one Scan or Locks returns
	MaxScanBytes int           // a Scan stops after about this many bytes of keys and values
	MaxBatch     int           // most commands in one transaction

	// CheckpointEvery and CheckpointBytes say how often the data file is
	// brought up to date with the write-ahead log (and the log emptied):
	// after this much time with writes, or this many bytes of log.
	CheckpointEvery time.Duration
	CheckpointBytes int64
}

// DefaultOptions returns the defaults documented in README.md.
func DefaultOptions() Options {
	return Options{
		MaxKeySize:   4 << 10,
		MaxValueSize: 1 << 20,
		MinTTL:       100 * time.Millisecond,
		MaxTTL:       time.Hour,
		MaxLockDelay: time.Hour,
		MaxWait:      time.Hour,
		MaxWaiters:   100_000,
		MaxScan:      10_000,
		MaxScanBytes: 2 << 20,
		MaxBatch:     1024,

		CheckpointEvery: 200 * time.Millisecond,
		CheckpointBytes: 16 << 20,
	}
}

func (o *Options) validate() error {
	switch {
	case o.MaxKeySize <= 0, o.MaxValueSize <= 0, o.MaxScan <= 0, o.MaxScanBytes <= 0, o.MaxBatch <= 0:
		return errors.New("fencekv: size limits must be positive")
	case o.MinTTL <= 0 || o.MaxTTL < o.MinTTL:
		return fmt.Errorf("fencekv: bad TTL range %v..%v", o.MinTTL, o.MaxTTL)
	case o.CheckpointEvery <= 0 || o.CheckpointBytes <= 0:
		return errors.New("fencekv: CheckpointEvery and CheckpointBytes must be positive")
	case o.MaxLockDelay < 0 || o.MaxWait < 0 || o.MaxWaiters < 0:
		return errors.New("fencekv: MaxLockDelay, MaxWait and MaxWaiters must not be negative")
	}
	return nil
}

// DB is an open fencekv engine. Its methods are safe for concurrent use.
type DB struct {
	opts   Options
	log    *slog.Logger
	clock  Clock
	epoch  time.Time
	store  *kv.Store
	leases *lease.Manager

	qmu     sync.Mutex // guards pending, leading, closed
	qidle   sync.Cond  // signalled (with qmu) when leading ends
	pending []*request // submitted, not yet taken into a batch, oldest first
	leading bool       // a goroutine is the leader: it alone applies batches
	closed  bool

	stop chan struct{} // closed by Close: stops the expiry loop
	wg   sync.WaitGroup

	log_ *wal.Log // the write-ahead log; used only by the leader (and Open, Close)

	// Owned by the leader (see lead):
	gather    bool // the last batch had company: yield before taking the next
	batch     []*request
	seq       uint64    // the last log record written
	rec       []byte    // the log record being built for the current batch
	logged    int       // commands in rec
	sinceCkpt int       // log records since the last checkpoint
	lastCkpt  time.Time // when the last checkpoint ended, by the real clock (an I/O policy, not lease time)

	// beforeSync, if set (by tests), runs between appending a batch's log
	// record and syncing it; an error fails the sync.
	beforeSync func() error

	mu     sync.Mutex // guards failed
	failed error      // set when the log or a checkpoint failed; writes are refused after

	commits     atomic.Uint64
	commands    atomic.Uint64
	syncNanos   atomic.Int64 // time spent writing and syncing log records
	checkpoints atomic.Uint64
	ckptNanos   atomic.Int64 // time spent in checkpoints

	closeOnce sync.Once
	closeErr  error
}

// Open opens the data dir (creating it if needed) and starts the commit
// and expiry loops. It fails with ErrLocked when another process has the
// dir open, and with ErrSchema for a file of another schema version. Every
// live lease gets its full TTL again (G7).
func Open(dir string, opts *Options) (*DB, error) {
	o := DefaultOptions()
	if opts != nil {
		o = *opts
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("fencekv: data dir: %w", err)
	}
	store, err := kv.Open(filepath.Join(dir, DataFile), kv.Options{NoSync: o.NoSync})
	if err != nil {
		return nil, err
	}
	// The data file's lock (taken by kv.Open) also guards the log.
	applied, err := store.Applied()
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("fencekv: open: %w", err)
	}
	log_, recs, _, err := wal.Open(filepath.Join(dir, LogFile), applied)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("fencekv: open: %w", err)
	}
	db := &DB{
		opts:   o,
		log:    o.Logger,
		clock:  o.Clock,
		store:  store,
		log_:   log_,
		leases: lease.NewManager(),
		stop:   make(chan struct{}),
	}
	db.qidle.L = &db.qmu
	if db.log == nil {
		db.log = slog.New(slog.DiscardHandler)
	}
	if db.clock == nil {
		db.clock = realClock{}
	}
	db.epoch = db.clock.Now()
	err = db.replay(recs)
	if err == nil {
		err = store.Update(func(tx *kv.Tx) error {
			return db.leases.Rearm(tx, db.now())
		})
	}
	if err != nil {
		store.Close()
		log_.Close()
		return nil, fmt.Errorf("fencekv: open: %w", err)
	}
	db.lastCkpt = time.Now()
	db.wg.Add(1)
	go db.expiryLoop()
	return db, nil
}

// Close stops accepting commands, lets the leader answer every command
// already submitted, fails queued waiters with ErrUnavailable, and closes
// the file. It is safe to call more than once; later calls return the first
// call's result.
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
		db.drainWaiters()
		close(db.stop)
		db.wg.Wait()
		db.closeErr = errors.Join(db.checkpoint(), db.store.Close(), db.log_.Close())
	})
	return db.closeErr
}

// now is the engine's time: the monotonic offset since Open.
func (db *DB) now() time.Duration { return db.clock.Now().Sub(db.epoch) }

var errClosed = errorf(CodeUnavailable, "the database is closed")

// request is a command on its way to be applied.
type request struct {
	cmd    Command
	wait   time.Duration // acquire: queue for the lock this long if it is held
	res    Result
	waiter *lease.Waiter // set by the leader when the acquire was queued
	lead   bool          // set, before done receives, to make the submitter the leader
	done   chan struct{} // receives once res (and waiter) are set, or lead is
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

func newRequest(c Command) *request {
	r := requestPool.Get().(*request)
	r.cmd = c
	return r
}

func (r *request) free() {
	*r = request{done: r.done}
	requestPool.Put(r)
}

// Group commit without a commit goroutine: the goroutines that submit
// commands take turns as the leader. A submitter that finds no leader
// becomes it: it takes every command waiting (its own among them) as one
// batch, applies it in one transaction, makes it durable with one log sync,
// answers the batch, then hands the lead to the oldest command still
// waiting, whose submitter commits the next batch. The batch size follows
// the load, with no timer: while one batch syncs, the next gathers. A lone
// caller commits its own command, with no goroutine switch.

// submitAll queues the requests together and waits for all of them.
func (db *DB) submitAll(rs ...*request) error {
	db.qmu.Lock()
	if db.closed {
		db.qmu.Unlock()
		return errClosed
	}
	db.pending = append(db.pending, rs...)
	lead := !db.leading
	db.leading = true
	db.qmu.Unlock()
	if lead {
		db.lead()
	}
	for _, r := range rs {
		for {
			<-r.done
			if !r.lead {
				break
			}
			r.lead = false
			db.lead()
		}
	}
	return nil
}

// lead commits one batch, then passes the lead on (or gives it up). Only
// the leader calls it, so commitBatch and the state it owns are used by one
// goroutine at a time; qmu and the done channels order the turns.
func (db *DB) lead() {
	if db.gather {
		// Under load, let the goroutines that are ready run first: those
		// parsing requests submit them, and they join this batch. It is
		// not a timer: it costs a lone caller nothing (gather is false
		// after a batch of one), and at 64 clients it took batches from
		// about 18 commands to 25 and the server's CPU per request down
		// by about 5%.
		runtime.Gosched()
	}
	db.qmu.Lock()
	n, size := 0, 0
	for n < len(db.pending) && n < db.opts.MaxBatch && size < maxBatchBytes {
		size += len(db.pending[n].cmd.Key) + len(db.pending[n].cmd.Value)
		n++
	}
	db.batch = append(db.batch[:0], db.pending[:n]...)
	rest := copy(db.pending, db.pending[n:])
	clear(db.pending[rest:])
	db.pending = db.pending[:rest]
	db.qmu.Unlock()

	db.gather = len(db.batch) > 1
	if len(db.batch) > 0 {
		db.commitBatch(db.batch)
		clear(db.batch)
	}

	db.qmu.Lock()
	if len(db.pending) == 0 {
		db.leading = false
		db.qidle.Broadcast()
		db.qmu.Unlock()
		return
	}
	next := db.pending[0]
	next.lead = true
	db.qmu.Unlock()
	next.done <- struct{}{}
}

// exec runs one command. ctx is not consulted: once submitted, a command
// is applied and answered (a commit takes well under a second).
func (db *DB) exec(_ context.Context, c Command) Result {
	r := newRequest(c)
	defer r.free()
	if err := db.submitAll(r); err != nil {
		return Result{Err: err}
	}
	return r.res
}

// maxBatchBytes bounds the keys and values of one batch, and so the size of
// its log record.
const maxBatchBytes = 32 << 20

// handoff is a grant made to a queued waiter, answered after commit.
type handoff struct {
	w   *lease.Waiter
	res Result
}

func (db *DB) commitBatch(batch []*request) {
	db.mu.Lock()
	failed := db.failed
	db.mu.Unlock()
	var tx *kv.Tx
	if failed == nil {
		tx, failed = db.store.Writer()
	}
	if failed != nil {
		for _, r := range batch {
			r.res = Result{Err: errorf(CodeUnavailable, "the store failed: %v", failed)}
			r.done <- struct{}{}
		}
		return
	}
	now := db.now()
	var handed []handoff
	db.startRecord()
	for _, r := range batch {
		c := &r.cmd
		c.Now = now
		if c.Op == OpAcquire && db.leases.Waiting(c.Lease.Name) > 0 {
			// Waiters come first: if the holder's lease is past due,
			// expire it now and hand the lock to the head of the queue.
			handed = db.expire(tx, now, c.Lease.Name, handed)
		}
		r.res = db.apply(tx, c)
		if c.Op == OpAcquire && r.wait > 0 && errors.Is(r.res.Err, ErrLockHeld) {
			w := lease.NewWaiter(c.Lease)
			if err := db.leases.Enqueue(w, db.opts.MaxWaiters); err != nil {
				r.res.Err = err
			} else {
				r.waiter = w
			}
		}
		if r.res.Freed {
			handed = db.handOff(tx, now, c.Lease.Name, handed)
		}
	}
	if err := db.writeRecord(); err != nil {
		db.fail(err)
		fail := errorf(CodeUnavailable, "the write-ahead log failed: %v", err)
		for _, r := range batch {
			r.res = Result{Err: fail}
			if r.waiter != nil {
				db.leases.Cancel(r.waiter)
				r.waiter = nil
			}
			r.done <- struct{}{}
		}
		for _, h := range handed {
			h.w.Finish(lease.Grant{}, fail)
		}
		return
	}
	db.store.Publish()
	if db.logged > 0 {
		db.commits.Add(1)
	}
	db.commands.Add(uint64(len(batch) + len(handed)))
	for _, r := range batch {
		r.done <- struct{}{}
	}
	for _, h := range handed {
		h.w.Finish(h.res.Grant, h.res.Err)
	}
	if db.sinceCkpt > 0 && (time.Since(db.lastCkpt) >= db.opts.CheckpointEvery || db.log_.Size() >= db.opts.CheckpointBytes) {
		if err := db.checkpoint(); err != nil {
			db.fail(err)
		}
	}
}

// fail stops the DB accepting writes after its log or data file failed.
// What was acknowledged is durable in the log; a restart replays it.
func (db *DB) fail(err error) {
	db.log.Error("the store failed; refusing writes until restart", "err", err)
	db.store.Abort()
	db.mu.Lock()
	db.failed = err
	db.mu.Unlock()
}

// apply applies c and, if it changed anything, adds it to the batch's log
// record (a refused command, or an expire with nothing due, changed
// nothing: replay needs neither).
func (db *DB) apply(tx *kv.Tx, c *Command) Result {
	r := apply(tx, db.leases, c)
	if r.Err == nil && !r.Noop {
		db.rec = appendCommand(db.rec, c)
		db.logged++
	}
	return r
}

// startRecord begins the log record of a batch: the commands that change
// state, in the order they were applied. The record's number is seq+1.
func (db *DB) startRecord() {
	db.rec = db.rec[:0]
	db.logged = 0
}

// writeRecord appends the batch's record to the log and syncs it (G6). A
// batch that changed nothing writes nothing.
func (db *DB) writeRecord() error {
	if db.logged == 0 {
		return nil
	}
	start := time.Now()
	defer func() { db.syncNanos.Add(int64(time.Since(start))) }()
	if err := db.log_.Append(db.seq+1, db.rec); err != nil {
		return err
	}
	if db.beforeSync != nil {
		if err := db.beforeSync(); err != nil {
			return err
		}
	}
	if !db.opts.NoSync {
		if err := db.log_.Sync(); err != nil {
			return err
		}
	}
	db.seq++
	db.sinceCkpt++
	if cap(db.rec) > 4<<20 {
		db.rec = nil // do not keep a huge buffer for good
	}
	return nil
}

// checkpoint commits the data file up to the last log record and empties
// the log. Called by the leader, and by Close once no one leads.
func (db *DB) checkpoint() error {
	db.mu.Lock()
	failed := db.failed
	db.mu.Unlock()
	if failed != nil || db.sinceCkpt == 0 {
		return nil
	}
	start := time.Now()
	defer func() {
		db.checkpoints.Add(1)
		db.ckptNanos.Add(int64(time.Since(start)))
	}()
	if err := db.store.Checkpoint(db.seq); err != nil {
		return fmt.Errorf("fencekv: checkpoint: %w", err)
	}
	db.log_.Reset()
	db.sinceCkpt = 0
	db.lastCkpt = time.Now()
	return nil
}

// replay applies the log records the data file does not reflect yet (those
// after its last checkpoint), then checkpoints. Called by Open.
func (db *DB) replay(recs []wal.Record) error {
	applied, err := db.store.Applied()
	if err != nil {
		return err
	}
	db.seq = applied
	for _, rec := range recs {
		seq := rec.LSN
		if seq <= applied {
			continue // already in the data file
		}
		if seq != db.seq+1 {
			return fmt.Errorf("fencekv: the log jumps from record %d to %d", db.seq, seq)
		}
		tx, err := db.store.Writer()
		if err != nil {
			return err
		}
		for b := rec.Payload; len(b) > 0; {
			var c Command
			if c, b, err = readCommand(b); err != nil {
				return err
			}
			if r := apply(tx, db.leases, &c); r.Err != nil {
				return fmt.Errorf("fencekv: replaying record %d: %v %w", seq, c.Op, r.Err)
			}
		}
		db.seq = seq
		db.sinceCkpt++
	}
	if db.sinceCkpt > 0 {
		db.log.Info("replayed the write-ahead log", "records", db.sinceCkpt, "last", db.seq)
	}
	db.sinceCkpt = max(db.sinceCkpt, len(recs)) // a log of applied records is emptied too
	return db.checkpoint()
}

// expire applies what is due on a lock, and hands it to a waiter if that
// freed it.
func (db *DB) expire(tx *kv.Tx, now time.Duration, name string, handed []handoff) []handoff {
	res := db.apply(tx, &Command{Op: OpExpire, Now: now, Lease: lease.Request{Name: name}})
	if res.Err != nil {
		db.log.Error("expire failed", "lock", name, "err", res.Err)
	}
	if res.Freed {
		handed = db.handOff(tx, now, name, handed)
	}
	return handed
}

// handOff grants a freed lock to the first waiter still waiting, in the
// same transaction that freed it (FIFO; no thundering herd).
func (db *DB) handOff(tx *kv.Tx, now time.Duration, name string, handed []handoff) []handoff {
	for {
		w := db.leases.Pop(name)
		if w == nil {
			return handed
		}
		res := db.apply(tx, &Command{Op: OpAcquire, Now: now, Lease: w.Req})
		handed = append(handed, handoff{w, res})
		if res.Err == nil {
			return handed
		}
	}
}

// drainWaiters fails every queued waiter. Called by Close once no one
// leads.
func (db *DB) drainWaiters() {
	for _, name := range db.leases.QueuedLocks() {
		for w := db.leases.Pop(name); w != nil; w = db.leases.Pop(name) {
			w.Finish(lease.Grant{}, errClosed)
		}
	}
}

// expiryLoop submits an expire command for each lock whose lease or
// lock-delay is due, sleeping until the earliest one otherwise. Correctness
// does not depend on its promptness: every command judges leases by its own
// time. It only frees locks for waiters and keeps records tidy.
func (db *DB) expiryLoop() {
	defer db.wg.Done()
	for {
		at, ok := db.leases.Arm()
		var timer Timer
		var fire <-chan time.Time
		if ok {
			now := db.now()
			if at <= now {
				if !db.expireDue(now) {
					return
				}
				continue
			}
			timer = db.clock.NewTimer(at - now)
			// The clock may have moved past at between reading now and
			// arming the timer. The timer then fires late, and on a fake
			// clock (which moves only when told) never: check again.
			if db.now() >= at {
				timer.Stop()
				continue
			}
			fire = timer.C()
		}
		select {
		case <-fire:
		case <-db.leases.Wake():
		case <-db.stop:
			if timer != nil {
				timer.Stop()
			}
			return
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// expireDue submits expire commands for what is due at now and waits for
// them. It returns false when the DB is closing or failed.
func (db *DB) expireDue(now time.Duration) bool {
	names := db.leases.Due(now, db.opts.MaxBatch)
	if len(names) == 0 {
		return true
	}
	reqs := make([]*request, len(names))
	for i, name := range names {
		reqs[i] = newRequest(Command{Op: OpExpire, Lease: lease.Request{Name: name}})
	}
	defer func() {
		for _, r := range reqs {
			r.free()
		}
	}()
	if err := db.submitAll(reqs...); err != nil {
		return false
	}
	for _, r := range reqs {
		if r.res.Err != nil {
			return false
		}
	}
	return true
}

// view runs fn in a read-only transaction. It sees every acknowledged
// command and nothing that is not yet durable: the store publishes a batch
// to readers only after its log record is synced.
func (db *DB) view(fn func(tx *kv.Tx, now time.Duration) error) error {
	tx, err := db.store.Begin(false)
	if err != nil {
		return errorf(CodeUnavailable, "%v", err)
	}
	defer tx.Rollback()
	return fn(tx, db.now())
}
