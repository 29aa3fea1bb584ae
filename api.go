package fencekv

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
	"github.com/fencekv/fencekv/state"
)

// WriteOptions fence a write.
type WriteOptions struct {
	// Token is the caller's fencing token; 0 means none (G3).
	Token Token
	// Strict accepts the write only if Token is above the key's fence.
	Strict bool
	// Lock, if set, accepts the write only if that lock is held by Token
	// and its lease has not expired (G4).
	Lock string
}

// Entry is a key's state as a read or write left it.
type Entry = state.Entry

// WriteResult is the key's fence and revision after an accepted write.
type WriteResult struct {
	Fence    Token
	Revision Revision
}

func (w WriteOptions) kv() kv.Write { return kv.Write{Token: w.Token, Strict: w.Strict} }

func (db *DB) write(ctx context.Context, c state.Command, w WriteOptions) state.Result {
	if err := db.opts.CheckWrite(c.Key, c.Value, w); err != nil {
		return state.Result{Err: err}
	}
	c.Write, c.Lock = w.kv(), w.Lock
	r := db.exec(ctx, c)
	if r.Err != nil {
		db.refusals.Note(ctx, &c, r.Err, db.m.Grantee)
	}
	return r
}

// Refusals returns up to limit refused fenced writes after sequence number
// since, oldest first, and the latest sequence number (see RefusalLog).
func (db *DB) Refusals(ctx context.Context, since uint64, limit int) ([]Refusal, uint64, error) {
	limit, err := db.opts.Limit(limit)
	if err != nil {
		return nil, 0, err
	}
	rs, last := db.refusals.Since(since, limit)
	return rs, last, nil
}

func written(r state.Result) (WriteResult, error) {
	if r.Err != nil {
		return WriteResult{}, r.Err
	}
	return WriteResult{Fence: r.Entry.Fence, Revision: r.Entry.Revision}, nil
}

// Put writes value to key. It returns after the write is durable.
func (db *DB) Put(ctx context.Context, key, value []byte, w WriteOptions) (WriteResult, error) {
	return written(db.write(ctx, state.Command{Op: state.OpPut, Key: key, Value: value}, w))
}

// Delete removes key; its fence survives. deleted is false if the key was
// not there (which is not an error). A delete carrying a token raises the
// fence even of a missing key.
func (db *DB) Delete(ctx context.Context, key []byte, w WriteOptions) (deleted bool, res WriteResult, err error) {
	r := db.write(ctx, state.Command{Op: state.OpDelete, Key: key}, w)
	res, err = written(r)
	return r.Deleted, res, err
}

// CAS writes value if key is at revision rev; rev 0 means the key must be
// absent. A mismatch is ErrCompareFailed with the key's current revision.
func (db *DB) CAS(ctx context.Context, key []byte, rev Revision, value []byte, w WriteOptions) (WriteResult, error) {
	return written(db.write(ctx, state.Command{Op: state.OpCAS, Key: key, Revision: rev, Value: value}, w))
}

// Incr adds delta to the signed 64-bit integer stored at key as decimal
// text (a missing key counts as 0) and returns the new value.
func (db *DB) Incr(ctx context.Context, key []byte, delta int64, w WriteOptions) (int64, WriteResult, error) {
	r := db.write(ctx, state.Command{Op: state.OpIncr, Key: key, Delta: delta}, w)
	res, err := written(r)
	return r.Int, res, err
}

// Get reads key. A missing key is not an error: Found is false, and Fence
// still reports a deleted key's fence.
func (db *DB) Get(ctx context.Context, key []byte) (Entry, error) {
	if err := db.opts.CheckKey(key); err != nil {
		return Entry{}, err
	}
	return db.m.Get(key)
}

// GetFunc calls fn with the key's entry, as Get would return it, but
// without copying the value: the entry's Value is the store's own memory,
// valid only until fn returns, and must not be changed. For a caller that
// only reads the value (a server encoding it into its answer).
func (db *DB) GetFunc(ctx context.Context, key []byte, fn func(Entry)) error {
	if err := db.opts.CheckKey(key); err != nil {
		return err
	}
	return db.m.GetFunc(key, fn)
}

// ScanOptions select the keys of a Scan.
type ScanOptions struct {
	Prefix []byte
	Start  []byte // first key to return (inclusive); page with last key + "\x00"
	Limit  int    // 0: 1000 (or MaxScan if smaller); at most MaxScan
}

// Scan returns live keys in byte order. more reports that further keys
// match; it is also set when the page stopped at MaxScanBytes.
func (db *DB) Scan(ctx context.Context, o ScanOptions) (items []Entry, more bool, err error) {
	limit, err := db.opts.Limit(o.Limit)
	if err != nil {
		return nil, false, err
	}
	return db.m.Scan(o.Prefix, o.Start, limit, db.opts.MaxScanBytes)
}

// AcquireOptions tune Acquire. The zero value takes the lock only if it is
// free now.
type AcquireOptions struct {
	Holder    string        // shown to others by LockInfo and in lock_held refusals
	Wait      time.Duration // queue up to this long (first come, first served)
	LockDelay time.Duration // after this lease expires, nobody may acquire for this long
	Limit     int           // permits: 0 or 1 a plain lock, 2..MaxPermits a semaphore (semaphore.go)
}

// Lease is a granted lock.
type Lease struct {
	Name  string
	Token Token
	TTL   time.Duration
}

// Acquire takes the lock name for ttl. The token is new: above every token
// this store ever issued (G1). If the lock is held and o.Wait > 0, the
// caller is queued and the lock is handed to it, in the transaction that
// frees it, when its turn comes. A lock that cannot be granted is
// ErrLockHeld with the holder and the time to wait.
//
// If ctx ends while queued, Acquire returns ctx's error; if the grant had
// already been made, it is released first.
func (db *DB) Acquire(ctx context.Context, name string, ttl time.Duration, o *AcquireOptions) (Lease, error) {
	var ao AcquireOptions
	if o != nil {
		ao = *o
	}
	if err := db.opts.CheckAcquire(name, ttl, ao); err != nil {
		return Lease{}, err
	}
	r := newRequest(state.Command{Op: state.OpAcquire, Lease: lease.Request{Name: name, TTL: ttl, Holder: ao.Holder, LockDelay: ao.LockDelay, Limit: ao.Limit}})
	r.wait = ao.Wait
	defer r.free()
	var timer Timer
	if ao.Wait > 0 {
		// The wait runs from the call, not from when the caller learns it
		// was queued: by then the clock may have moved on (a test clock
		// advanced in between left such a timer waiting for good).
		timer = db.clock.NewTimer(ao.Wait)
		defer timer.Stop()
	}
	if err := db.submit(ctx, r); err != nil {
		return Lease{}, err
	}
	if r.waiter == nil {
		if r.res.Err != nil {
			return Lease{}, r.res.Err
		}
		return Lease{Name: name, Token: r.res.Grant.Token, TTL: r.res.Grant.TTL}, nil
	}
	return db.awaitGrant(ctx, r.waiter, timer)
}

// awaitGrant waits for a queued acquire's turn, its wait limit (timer), or
// ctx.
func (db *DB) awaitGrant(ctx context.Context, w *lease.Waiter, timer Timer) (Lease, error) {
	granted := func() (Lease, error) {
		if w.Err != nil {
			return Lease{}, w.Err
		}
		return Lease{Name: w.Req.Name, Token: w.Grant.Token, TTL: w.Grant.TTL}, nil
	}
	select {
	case <-w.Done():
		return granted()
	case <-timer.C():
		if !db.queues.Cancel(w) {
			<-w.Done()
			return granted()
		}
		// The lease in the way may have run out without the expiry loop
		// having handed the lock on yet: one last try without waiting. It
		// still goes behind anyone queued (the batch leader expires and
		// hands off to them first).
		r := db.exec(ctx, state.Command{Op: state.OpAcquire, Lease: w.Req})
		if r.Err == nil {
			return Lease{Name: w.Req.Name, Token: r.Grant.Token, TTL: r.Grant.TTL}, nil
		}
		if !errors.Is(r.Err, ErrLockHeld) {
			return Lease{}, r.Err
		}
		return Lease{}, db.lockHeld(w.Req.Name)
	case <-ctx.Done():
		if !db.queues.Cancel(w) {
			<-w.Done()
			if w.Err == nil {
				// Nobody will use this grant: give the lock to the next.
				_ = db.Release(context.Background(), w.Req.Name, w.Grant.Token)
			}
		}
		return Lease{}, ctx.Err()
	}
}

// lockHeld describes why name cannot be acquired now, for a wait that ran
// out.
func (db *DB) lockHeld(name string) error {
	in, err := db.m.LockInfo(db.now(), name)
	if err != nil {
		return err
	}
	return LockHeld(in, db.opts.MinTTL)
}

// LockHeld is the lock_held refusal for a lock described by in, for an
// acquire whose wait ran out (or that must queue behind waiters): the
// holder, its token (0 when the lock is only in lock-delay), and the time
// until it may be free (at least minRetry).
func LockHeld(in LockInfo, minRetry time.Duration) *Error {
	retry := in.TTL + in.Delay
	if retry <= 0 {
		retry = minRetry
	}
	token := in.Token
	if !in.Held {
		token = 0
	}
	return &Error{Code: CodeLockHeld, Holder: in.Holder, Token: token, RetryAfter: retry,
		Message: "lock " + quote(in.Name) + " is still held after the wait"}
}

// Renew gives the lease of token on name its full TTL again. It is
// idempotent; a retry is always safe. A lease that ran out is
// ErrLeaseExpired; a lock held by another token (or free) is ErrNotHolder.
func (db *DB) Renew(ctx context.Context, name string, token Token) (time.Duration, error) {
	if err := db.opts.CheckName(name); err != nil {
		return 0, err
	}
	r := db.exec(ctx, state.Command{Op: state.OpRenew, Lease: lease.Request{Name: name}, Token: token})
	return r.TTL, r.Err
}

// Release frees the lock if token holds it, and hands it to the next
// waiter. There is no lock-delay after a clean release.
func (db *DB) Release(ctx context.Context, name string, token Token) error {
	if err := db.opts.CheckName(name); err != nil {
		return err
	}
	return db.exec(ctx, state.Command{Op: state.OpRelease, Lease: lease.Request{Name: name}, Token: token}).Err
}

// LockInfo describes a lock: whether it is held, by whom, with which token,
// for how long more; or, if free, its latest token and any lock-delay left.
type LockInfo = lease.Info

// LockInfo describes the lock name now. If its lease has run out (or its
// lock-delay ended) and the expiry loop has not applied that yet, LockInfo
// applies it first, waiting for its commit, unless ctx is of
// WithoutCommitWait: until it is applied the lock is reported held with no
// time left, since a restart would give the lease its full TTL again.
func (db *DB) LockInfo(ctx context.Context, name string) (LockInfo, error) {
	if err := db.opts.CheckName(name); err != nil {
		return LockInfo{}, err
	}
	read := func() (LockInfo, error) { return db.m.LockInfo(db.now(), name) }
	if noCommitWait(ctx) {
		return read()
	}
	return AfterExpiries(read, func(in LockInfo) []LockInfo { return []LockInfo{in} },
		func(names []string) error { return db.applyExpiries(ctx, names) })
}

// Locks lists up to limit held locks whose names start with prefix, in
// byte order, from start (inclusive). Expiries pending on them are applied
// first, as for LockInfo.
func (db *DB) Locks(ctx context.Context, prefix, start string, limit int) (locks []LockInfo, more bool, err error) {
	limit, err = db.opts.Limit(limit)
	if err != nil {
		return nil, false, err
	}
	type page struct {
		locks []LockInfo
		more  bool
	}
	read := func() (page, error) {
		locks, more, err := db.m.Locks(db.now(), prefix, start, limit, db.opts.MaxScanBytes)
		return page{locks, more}, err
	}
	var p page
	if noCommitWait(ctx) {
		p, err = read()
	} else {
		p, err = AfterExpiries(read, func(p page) []LockInfo { return p.locks },
			func(names []string) error { return db.applyExpiries(ctx, names) })
	}
	return p.locks, p.more, err
}

// AfterExpiries is how a lock read reports leases that have run out: it
// reads, and if a lock read has its expiry pending (LockInfo.ExpiryPending),
// applies those expiries with apply, which waits for their commit, and
// reads again. A lease that ran out is so reported free (or left out of a
// list) once its expiry is applied, never before: until then a restart, or
// a new leader, would give it its full TTL again. locks gives the locks a
// read reports.
func AfterExpiries[T any](read func() (T, error), locks func(T) []LockInfo, apply func(names []string) error) (T, error) {
	v, err := read()
	if err != nil {
		return v, err
	}
	var due []string
	for _, in := range locks(v) {
		if in.ExpiryPending() {
			due = append(due, in.Name)
		}
	}
	if len(due) == 0 {
		return v, nil
	}
	if err := apply(due); err != nil {
		var zero T
		return zero, err
	}
	return read()
}

// Status describes the store.
type Status struct {
	Version string
	// The store-wide counters: the highest token ever issued, the
	// revision, live keys, the data file's size, leases held, callers
	// queued, and the grants and expiries applied since Open (replayed
	// ones included).
	state.Counters
	Commits  uint64 // group commits (one log sync each) since Open
	Commands uint64 // commands applied since Open

	SyncTime       time.Duration // total time writing and syncing the log, since Open
	Checkpoints    uint64        // checkpoints of the log into the data file since Open
	CheckpointTime time.Duration // total time in checkpoints, since Open

	// Where this node stands: Role is "single" for a node without a
	// cluster, else "leader", "follower" or "candidate"; the rest are
	// set in a cluster only.
	Role         string
	Node         string // the node's name
	Leader       string // the leader's client address, "" if none is known
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64

	// PID is the server process's id, as a client learns it from the
	// status method (0 if the server did not say: an embedded DB, or an
	// older server).
	PID int
}

// Status reads the store's counters.
func (db *DB) Status(ctx context.Context) (Status, error) {
	s := Status{
		Version: Version,
		Role:    "single",
		Commits: db.commits.Load(),

		SyncTime:       time.Duration(db.syncNanos.Load()),
		Checkpoints:    db.checkpoints.Load(),
		CheckpointTime: time.Duration(db.ckptNanos.Load()),
		Commands:       db.commands.Load(),
	}
	c, err := db.m.Counters()
	s.Counters = c
	return s, err
}

// Limits returns the options in force, for servers that advertise them.
func (db *DB) Limits() Options { return db.opts }

func quote(s string) string { return strconv.Quote(s) }

// Member describes one node of a cluster, as its members method lists it.
type Member struct {
	Node       string
	ClientAddr string
	RaftAddr   string
	GossipAddr string
	State      string // by gossip: alive, suspect, dead, left (or unknown)
	Voter      bool   // a voter in the raft configuration
	RaftRole   string // leader, follower, or "" when not in the raft configuration
}

type staleKey struct{}

// WithStaleReads returns a context whose reads a cluster node may answer
// from its own state without asking the leader: faster, possibly behind
// (consistency "stale" on the wire). A single node's reads are always
// current.
func WithStaleReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, staleKey{}, true)
}

type noCommitWaitKey struct{}

// WithoutCommitWait returns a context whose reads never wait for a commit,
// for a caller that must not block, such as an event loop that leads its
// own batches (StartLed). LockInfo and Locks then report a lease that ran
// out, and whose expiry the expiry loop has not applied yet (a matter of
// milliseconds), as held with no time left, instead of applying the expiry
// first and reporting the lock free.
func WithoutCommitWait(ctx context.Context) context.Context {
	return context.WithValue(ctx, noCommitWaitKey{}, true)
}

func noCommitWait(ctx context.Context) bool {
	v, _ := ctx.Value(noCommitWaitKey{}).(bool)
	return v
}

// StaleReads reports whether ctx allows stale reads.
func StaleReads(ctx context.Context) bool {
	v, _ := ctx.Value(staleKey{}).(bool)
	return v
}

// Watch starts a watcher of the keys (and, with o.Locks, the locks) whose
// names start with o.Prefix: every change after it is durable, in revision
// order, from o.StartRevision if it is still in the history window (else
// ErrCompacted with the oldest revision kept). Close it when done; it
// ends with ErrWatchCancelled if it falls behind, or when the DB closes.
func (db *DB) Watch(ctx context.Context, o WatchOptions) (*Watcher, error) {
	return db.m.Watch(o)
}
