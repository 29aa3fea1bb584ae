// Package kv is fencekv's storage engine: it owns the bbolt file and its
// layout, and implements the fenced operations on a read-write transaction.
//
// The file holds four buckets:
//
//	meta        schema version, store-wide revision, last issued token, live
//	            key count, and the state machine's marks: wal_applied (the
//	            last log index the file reflects) and term (of the last lease
//	            re-arm)
//	keys        live key -> record: flags (1 byte, always live), fence (8),
//	            revision (8), value
//	tombstones  deleted key -> fence (8), revision of the delete (8)
//	locks       lock name -> lease record (opaque here; encoded by package
//	            lease)
//
// Every number is stored as 8-byte big-endian, so bbolt's byte order is
// numeric order. A deleted key keeps its fence, so that it outlives the
// delete (G2), in the tombstones bucket: a key is in keys or in tombstones,
// never both, and a scan walks only the live keys. Schema version 1 kept
// deleted keys in keys with the live flag cleared; Open moves them (see
// Upgrade).
//
// The package has no goroutines and no clocks. A Tx is used by one goroutine
// at a time; the caller decides when it commits.
package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencekv/fencekv/fence"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// SchemaVersion is the layout version this package reads and writes.
const SchemaVersion = 2

// Token and Revision are fence's; kv stores them big-endian.
type (
	Token    = fence.Token
	Revision = fence.Revision
)

var (
	bucketMeta  = []byte("meta")
	bucketKeys  = []byte("keys")
	bucketTombs = []byte("tombstones")
	bucketLocks = []byte("locks")

	metaSchema    = []byte("schema")
	metaRevision  = []byte("revision")
	metaLastToken = []byte("last_token")
	metaLiveKeys  = []byte("live_keys")
	metaApplied   = []byte("wal_applied") // Marks.Applied (named when only the write-ahead log had indexes)
	metaTerm      = []byte("term")
)

const (
	flagLive  = 1
	recHeader = 1 + 8 + 8 // a key record's flags, fence and revision
	tombLen   = 8 + 8     // a tombstone: fence and revision
)

// ErrLocked is returned by Open when another process holds the file.
var ErrLocked = errors.New("kv: data file is locked by another process")

// Options tune Open. The zero value is usable.
type Options struct {
	// LockTimeout is how long Open waits for another process to release the
	// file lock before it returns ErrLocked. Zero means 100ms.
	LockTimeout time.Duration
	// NoSync skips fsync on commit. It breaks durability (G6): for tests
	// and benchmarks that say so, never for a server.
	NoSync bool
}

// Store is an open fencekv data file.
//
// Writes go through one long-lived writable transaction (Writer), which the
// engine commits to the file only now and then (Checkpoint): between
// checkpoints its durability comes from the engine's write-ahead log. What
// the writer has changed since the last checkpoint, and the engine has made
// durable, is published (Publish) to an overlay that read-only
// transactions consult before the file, so reads see every durable write.
type Store struct {
	db *bolt.DB
	w  *Tx // the open writer; only the engine's batch leader touches it
	ov overlay
	rs readers // bbolt read transactions kept between reads
	up Upgrade // what Open did to an older file
}

// readers keeps the bbolt read transactions of ended read-only Txs, to
// begin the next ones on: beginning and ending a bbolt transaction (and
// opening its buckets) costs a read more than the read itself. Between
// two commits the file does not change (the writer commits only at
// Checkpoint), so a transaction begun after one commit reads what a new
// one would until the next. Every commit drains the idle ones first (a
// commit that grows the file waits for every open read transaction), and
// those in use when it ran are rolled back when their Tx ends: they are
// of an older epoch.
type readers struct {
	mu    sync.Mutex
	epoch uint64    // commits so far; changed only with ov.mu held for writing
	idle  []*reader // of the current epoch, at most maxIdleReaders
}

// maxIdleReaders bounds the read transactions kept: about as many as
// reads run at once.
const maxIdleReaders = 32

// reader is a bbolt read transaction and the buckets opened on it. One
// goroutine at a time uses it (bbolt transactions are not safe for
// concurrent use): the one whose Tx has it, or none while it is idle.
type reader struct {
	tx                       *bolt.Tx
	epoch                    uint64
	meta, keys, tombs, locks *bolt.Bucket
	keysCur, tombsCur        *bolt.Cursor // for lookups (Tx.record)
	lent                     Tx           // the Tx View lends its fn
}

// get returns an idle reader, or nil.
func (rs *readers) get() *reader {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	n := len(rs.idle)
	if n == 0 {
		return nil
	}
	rd := rs.idle[n-1]
	rs.idle[n-1] = nil
	rs.idle = rs.idle[:n-1]
	return rd
}

// put keeps rd for the next read if it is of the current epoch and there
// is room, and rolls it back otherwise.
func (rs *readers) put(rd *reader) {
	rs.mu.Lock()
	if rd.epoch == rs.epoch && len(rs.idle) < maxIdleReaders {
		rs.idle = append(rs.idle, rd)
		rs.mu.Unlock()
		return
	}
	rs.mu.Unlock()
	_ = rd.tx.Rollback()
}

// drain starts a new epoch and rolls back the idle readers. The caller
// holds ov.mu for writing, and is about to commit (or close the file).
func (rs *readers) drain() {
	rs.mu.Lock()
	rs.epoch++
	idle := rs.idle
	rs.idle = nil
	rs.mu.Unlock()
	for _, rd := range idle {
		_ = rd.tx.Rollback()
	}
}

// Open opens or creates the data file at path. It fails with ErrLocked when
// another process has it open, with ErrSchema when the file was written by
// another schema version, and with a *DamagedError (ErrDamaged) when its
// pages are damaged: it walks them first (see Check), and a panic in bbolt
// is returned as an error, never let through.
func Open(path string, opts Options) (*Store, error) {
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = 100 * time.Millisecond
	}
	if err := precheck(path, timeout); err != nil {
		return nil, err
	}
	var db *bolt.DB
	err := safely(path, func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{
			Timeout:        timeout,
			NoFreelistSync: true,
			FreelistType:   bolt.FreelistMapType,
			NoSync:         opts.NoSync,
		})
		return err
	})
	if errors.Is(err, ErrDamaged) {
		return nil, err
	}
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, fmt.Errorf("kv: open %s: %w", path, err)
	}
	s := &Store{db: db, ov: newOverlay()}
	if err := safely(path, s.init); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) init() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			if tx.Bucket(bucketKeys) != nil {
				return fmt.Errorf("%w: keys without a meta bucket", ErrSchema)
			}
			var err error
			if meta, err = tx.CreateBucket(bucketMeta); err != nil {
				return err
			}
			if err := meta.Put(metaSchema, u64(SchemaVersion)); err != nil {
				return err
			}
		}
		v := meta.Get(metaSchema)
		switch {
		case len(v) == 8 && binary.BigEndian.Uint64(v) == SchemaVersion:
		case len(v) == 8 && binary.BigEndian.Uint64(v) == 1:
			n, err := upgrade1(tx)
			if err != nil {
				return fmt.Errorf("kv: upgrading the data file from schema 1 to %d: %w", SchemaVersion, err)
			}
			s.up = Upgrade{From: 1, To: SchemaVersion, Tombstones: n}
		default:
			return fmt.Errorf("%w: file has %x, this build reads %d (and upgrades 1)", ErrSchema, v, SchemaVersion)
		}
		for _, b := range [][]byte{bucketKeys, bucketTombs, bucketLocks} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
}

// Upgrade is what Open did to bring a file of an older schema version to
// this one, in the transaction that opened it: nothing (From 0), or an
// upgrade from version From to To that moved Tombstones deleted keys'
// records out of the keys bucket.
type Upgrade struct {
	From, To   int
	Tombstones int
}

// Upgrade reports what Open did to an older file, for the engine to log.
func (s *Store) Upgrade() Upgrade { return s.up }

// upgrade1 brings a schema 1 file to schema 2 in tx: every deleted key's
// record (live flag cleared) moves from keys to tombstones as its fence
// and revision. The counters and marks in meta stay as they are: the live
// key count already counted only live records. A record too short to
// decode is left where it is (Check reports it). It returns how many
// records moved.
func upgrade1(tx *bolt.Tx) (int, error) {
	meta := tx.Bucket(bucketMeta)
	keys, err := tx.CreateBucketIfNotExists(bucketKeys)
	if err != nil {
		return 0, err
	}
	if tx.Bucket(bucketTombs) != nil {
		return 0, fmt.Errorf("a schema 1 file with a %q bucket", bucketTombs)
	}
	tombs, err := tx.CreateBucket(bucketTombs)
	if err != nil {
		return 0, err
	}
	// A chunk at a time: collect under a cursor, then delete (deleting
	// under a bbolt cursor can skip the next key), then seek past the
	// chunk's last key.
	moved := 0
	from := []byte{}
	for {
		var dead [][]byte
		var last []byte
		c := keys.Cursor()
		for k, v := c.Seek(from); k != nil && len(dead) < 4096; k, v = c.Next() {
			last = k
			if v == nil || len(v) < recHeader || v[0]&flagLive != 0 {
				continue
			}
			// bbolt keeps the slices given to Put until the commit, and
			// these alias pages the deletes below may change: copy.
			if err := tombs.Put(bytes.Clone(k), bytes.Clone(v[1:recHeader])); err != nil {
				return 0, err
			}
			dead = append(dead, bytes.Clone(k))
		}
		if last == nil {
			break
		}
		from = append(bytes.Clone(last), 0)
		for _, k := range dead {
			if err := keys.Delete(k); err != nil {
				return 0, err
			}
		}
		moved += len(dead)
	}
	return moved, meta.Put(metaSchema, u64(SchemaVersion))
}

// Close closes the file, discarding what the writer has not checkpointed.
// It is safe to call more than once.
func (s *Store) Close() error {
	if s.db == nil {
		return nil
	}
	s.Abort()
	s.ov.mu.Lock()
	s.rs.drain() // bbolt's Close waits for every read transaction
	s.ov.mu.Unlock()
	err := s.db.Close()
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return nil
	}
	return err
}

// Begin starts a transaction. Only one writable transaction exists at a
// time (and none while a Writer is open); read-only ones run concurrently
// with it and see the last commit plus what was published when they
// began, for their whole life (see overlay.go). A read-only Tx must be
// ended with Rollback; until then it keeps the versions of records it may
// read, and bbolt keeps its pages.
func (s *Store) Begin(writable bool) (*Tx, error) {
	if writable {
		btx, err := s.db.Begin(true)
		if err != nil {
			return nil, fmt.Errorf("kv: begin: %w", err)
		}
		t := &Tx{tx: btx, s: s}
		t.counters()
		return t, nil
	}
	t := &Tx{}
	if err := s.beginRead(t); err != nil {
		return nil, err
	}
	return t, nil
}

// beginRead begins t as a read-only transaction, on an idle reader if
// there is one.
func (s *Store) beginRead(t *Tx) error {
	// The bbolt transaction and the view together: Checkpoint commits
	// and starts a new generation under the write lock.
	s.ov.mu.RLock()
	defer s.ov.mu.RUnlock()
	rd := s.rs.get()
	if rd == nil {
		btx, err := s.db.Begin(false)
		if err != nil {
			return fmt.Errorf("kv: begin: %w", err)
		}
		rd = &reader{tx: btx, epoch: s.rs.epoch}
	}
	*t = Tx{tx: rd.tx, meta: rd.meta, keys: rd.keys, tombs: rd.tombs, locks: rd.locks, keysCur: rd.keysCur, tombsCur: rd.tombsCur, s: s, rd: rd, view: s.ov.pin()}
	return nil
}

// endRead ends the read-only t: its reader, with the buckets t opened,
// goes back to the store.
func (t *Tx) endRead() {
	rd := t.rd
	rd.meta, rd.keys, rd.tombs, rd.locks = t.meta, t.keys, t.tombs, t.locks
	rd.keysCur, rd.tombsCur = t.keysCur, t.tombsCur
	t.rd, t.tx = nil, nil
	t.view.unpin()
	t.view = nil
	t.s.rs.put(rd)
}

// Writer returns the open writable transaction, beginning one if none is
// open. Its changes reach the file at the next Checkpoint, and readers at
// the next Publish. Only one goroutine may use it.
func (s *Store) Writer() (*Tx, error) {
	if s.w == nil {
		t, err := s.Begin(true)
		if err != nil {
			return nil, err
		}
		t.writer = true
		t.dirtyLocks = map[string][]byte{}
		s.w = t
	}
	return s.w, nil
}

// Publish makes the writer's changes since the last Publish visible to
// read-only transactions. The engine calls it once they are durable in
// its log.
func (s *Store) Publish() {
	w := s.w
	if w == nil {
		return
	}
	s.ov.publish(w)
	clear(w.dirtyKeys)
	w.dirtyKeys = w.dirtyKeys[:0]
	if cap(w.dirtyKeys) > maxKeptDirty {
		w.dirtyKeys = nil // do not keep what a huge batch grew
	}
	clear(w.dirtyLocks)
}

// Marks are the state machine's own counters, kept in the data file with
// the data they describe: the last log index the file reflects (the
// engine's write-ahead log sequence, or the raft index in a cluster) and
// the term of the last lease re-arm.
type Marks struct {
	Applied uint64
	Term    uint64
}

// Checkpoint commits the writer to the file (with fsync), recording marks
// with it, and empties the overlay. Readers that begin while it runs wait
// for it; open ones go on reading the state they began on. Nothing happens
// if no writer is open.
func (s *Store) Checkpoint(marks Marks) error {
	w := s.w
	if w == nil {
		return nil
	}
	s.w = nil
	if err := w.meta.Put(metaApplied, u64(marks.Applied)); err != nil {
		w.Rollback()
		return err
	}
	if err := w.meta.Put(metaTerm, u64(marks.Term)); err != nil {
		w.Rollback()
		return err
	}
	s.ov.mu.Lock()
	defer s.ov.mu.Unlock()
	s.rs.drain()
	if err := w.commit(); err != nil {
		return err
	}
	s.ov.checkpoint()
	return nil
}

// Abort discards the writer's changes since the last checkpoint. What was
// published stays visible to readers.
func (s *Store) Abort() {
	if s.w != nil {
		s.w.Rollback()
		s.w = nil
	}
}

// Marks are the marks the file recorded at its last checkpoint.
func (s *Store) Marks() (Marks, error) {
	var m Marks
	err := s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		m.Applied = getU64(meta.Get(metaApplied))
		m.Term = getU64(meta.Get(metaTerm))
		return nil
	})
	return m, err
}

// Buckets and counters are looked up on first use: most read-only
// transactions (a get) need only the keys bucket.

func (t *Tx) keysBucket() *bolt.Bucket {
	if t.keys == nil {
		t.keys = t.tx.Bucket(bucketKeys)
	}
	return t.keys
}

func (t *Tx) tombsBucket() *bolt.Bucket {
	if t.tombs == nil {
		t.tombs = t.tx.Bucket(bucketTombs)
	}
	return t.tombs
}

// record returns key's value in b, as b.Get does. A read-only Tx looks
// it up with *cur, a cursor on b its reader keeps: Get makes a new cursor,
// and its stack, for each lookup (two allocations per get of a key read
// from the file).
func (t *Tx) record(b *bolt.Bucket, cur **bolt.Cursor, key []byte) []byte {
	if t.rd == nil {
		return b.Get(key)
	}
	if *cur == nil {
		*cur = b.Cursor()
	}
	k, v := (*cur).Seek(key)
	if !bytes.Equal(k, key) {
		return nil
	}
	return v
}

func (t *Tx) locksBucket() *bolt.Bucket {
	if t.locks == nil {
		t.locks = t.tx.Bucket(bucketLocks)
	}
	return t.locks
}

// counters loads the revision, last token and live key count once.
func (t *Tx) counters() {
	if t.loaded {
		return
	}
	t.loaded = true
	if t.view != nil && t.view.set {
		t.rev, t.lastToken, t.live = t.view.rev, t.view.last, t.view.live
		return
	}
	if t.meta == nil {
		t.meta = t.tx.Bucket(bucketMeta)
	}
	t.rev = Revision(getU64(t.meta.Get(metaRevision)))
	t.lastToken = Token(getU64(t.meta.Get(metaLastToken)))
	t.live = getU64(t.meta.Get(metaLiveKeys))
}

// View runs fn in a read-only transaction, which it ends when fn returns
// (fn's Rollback does nothing). Unlike Begin, it allocates nothing when
// an idle reader is at hand.
func (s *Store) View(fn func(*Tx) error) error {
	var t Tx
	if err := s.beginRead(&t); err != nil {
		return err
	}
	// A pointer to t itself, passed to an fn not known here, would move
	// t to the heap: fn gets the reader's own Tx instead, lent until it
	// ends.
	lent := &t.rd.lent
	*lent = t
	lent.lending = true
	defer func() {
		lent.lending = false
		lent.endRead()
	}()
	return fn(lent)
}

// Update runs fn in a read-write transaction and commits it if fn returns
// nil.
func (s *Store) Update(fn func(*Tx) error) error {
	t, err := s.Begin(true)
	if err != nil {
		return err
	}
	if err := fn(t); err != nil {
		t.Rollback()
		return err
	}
	return t.Commit()
}

// dirtyKey is a key the Writer wrote, and its record as the overlay keeps
// it (see Tx.write).
type dirtyKey struct{ key, rec []byte }

// maxKeptDirty bounds the room the Writer keeps for the keys of a batch.
const maxKeptDirty = 1 << 12

// Tx is a transaction on the store. The counters (revision, last token,
// live keys) are cached in the Tx and written back by Commit.
type Tx struct {
	tx                       *bolt.Tx
	meta, keys, tombs, locks *bolt.Bucket // nil until first used
	keysCur, tombsCur        *bolt.Cursor // read-only: nil until first used (record)
	s                        *Store
	rd                       *reader // read-only: where tx comes from, and goes back to
	lending                  bool    // read-only: View's, which ends it itself
	loaded                   bool    // the counters are loaded

	rev       Revision
	lastToken Token
	live      uint64
	dirty     bool     // counters changed since Begin
	grouped   bool     // inside Group: writes share groupRev
	groupRev  Revision // the group's revision, once it has written

	view       *view             // read-only: the overlay's state it reads before the file
	writer     bool              // the Store's Writer: it records what it changes, for Publish
	dirtyKeys  []dirtyKey        // the Writer: keys written since the last Publish, in order (one written twice is here twice)
	dirtyLocks map[string][]byte // the Writer: lock records changed since the last Publish (nil: deleted)

	steps int // records each has read from the file's buckets, for tests
}

// Commit writes the counters back and commits durably (unless the store
// was opened with NoSync).
func (t *Tx) Commit() error {
	// Like Checkpoint: readers must not begin on a bbolt transaction from
	// before the commit.
	t.s.ov.mu.Lock()
	defer t.s.ov.mu.Unlock()
	t.s.rs.drain()
	return t.commit()
}

func (t *Tx) commit() error {
	if t.dirty {
		if err := t.meta.Put(metaRevision, u64(uint64(t.rev))); err != nil {
			t.tx.Rollback()
			return err
		}
		if err := t.meta.Put(metaLastToken, u64(uint64(t.lastToken))); err != nil {
			t.tx.Rollback()
			return err
		}
		if err := t.meta.Put(metaLiveKeys, u64(t.live)); err != nil {
			t.tx.Rollback()
			return err
		}
	}
	if err := t.tx.Commit(); err != nil {
		return fmt.Errorf("kv: commit: %w", err)
	}
	return nil
}

// Rollback discards the transaction. It is safe after Commit, and more
// than once.
func (t *Tx) Rollback() {
	switch {
	case t.lending: // View ends it
	case t.rd != nil:
		t.endRead()
	case t.tx != nil && t.tx.Writable(): // bbolt's Rollback is safe after Commit
		_ = t.tx.Rollback()
	}
}

// Revision is the store-wide revision: the number of accepted writes.
func (t *Tx) Revision() Revision {
	t.counters()
	return t.rev
}

// LastToken is the highest token ever issued.
func (t *Tx) LastToken() Token {
	t.counters()
	return t.lastToken
}

// Keys is the number of live (not deleted) keys.
func (t *Tx) Keys() uint64 {
	t.counters()
	return t.live
}

// NextToken issues the next token of the store-wide sequence (G1). The new
// high-water mark is written by Commit, in the transaction that issues it.
func (t *Tx) NextToken() Token {
	t.lastToken++
	t.dirty = true
	return t.lastToken
}

// RaiseToken moves the token sequence to at least t: the next token issued
// is above it. Like NextToken, the high-water mark is written by Commit.
func (t *Tx) RaiseToken(floor Token) {
	t.counters()
	if floor > t.lastToken {
		t.lastToken = floor
		t.dirty = true
	}
}

// Entry is a key's state.
type Entry struct {
	Key      []byte
	Value    []byte
	Found    bool     // false for a key never written or deleted
	Fence    Token    // highest token any accepted write to the key carried
	Revision Revision // revision of the key's last change; 0 when not found
}

// Write is how a write is fenced.
type Write struct {
	Token  Token // 0: no token (accepted only while the key's fence is 0)
	Strict bool  // accept only Token > fence (and Token must be set)
}

// Get returns the key's entry. The value is a copy. A deleted key is not
// Found but still reports its Fence.
func (t *Tx) Get(key []byte) Entry {
	e, _ := t.get(key, true)
	return e
}

// Peek returns the key's entry as Get does, without copying the value:
// Value is the store's own memory, valid until the transaction ends, and
// must not be changed.
func (t *Tx) Peek(key []byte) Entry {
	e, _ := t.get(key, false)
	return e
}

// get decodes the key's record: the overlay's, or else the keys bucket's,
// or else the tombstone's. It copies the value when copyValue is set;
// otherwise the value aliases bbolt memory valid only until the next
// write. ok reports whether the key has a record (live or a tombstone).
func (t *Tx) get(key []byte, copyValue bool) (e Entry, ok bool) {
	e = Entry{Key: key}
	raw, inOv := t.view.key(key)
	if !inOv {
		if raw = t.record(t.keysBucket(), &t.keysCur, key); raw == nil {
			if tomb := t.record(t.tombsBucket(), &t.tombsCur, key); len(tomb) == tombLen {
				e.Fence = Token(binary.BigEndian.Uint64(tomb[:8]))
				return e, true
			}
		}
	}
	if len(raw) < recHeader {
		return e, false
	}
	e.Fence = Token(binary.BigEndian.Uint64(raw[1:9]))
	if raw[0]&flagLive != 0 {
		e.Found = true
		e.Revision = Revision(binary.BigEndian.Uint64(raw[9:17]))
		e.Value = raw[recHeader:]
		if copyValue {
			e.Value = bytes.Clone(e.Value)
			if e.Value == nil {
				e.Value = []byte{}
			}
		}
	}
	return e, true
}

// check applies the fence rule (G2, G3) to a write on a key whose current
// fence is cur.
func check(cur Token, w Write) error {
	if w.Strict {
		if w.Token <= cur {
			return &fence.Error{Code: fence.CodeStaleToken, Fence: cur,
				Message: fmt.Sprintf("strict write needs a token above fence %d, got %d", cur, w.Token)}
		}
		return nil
	}
	if w.Token < cur {
		return &fence.Error{Code: fence.CodeStaleToken, Fence: cur,
			Message: fmt.Sprintf("token %d is below fence %d", w.Token, cur)}
	}
	return nil
}

// write stores a live record for key in keys, or a deleted key's fence in
// tombstones, with the new fence, removes the key's other record (wasLive:
// it has one in keys; hadTomb: in tombstones), and advances the revision.
// It never fails a fence check: callers check first.
//
// It returns the key and the record as stored (for a deleted key, the
// overlay's record: the live flag cleared, no value): the store's own
// copies, which never change (bbolt, and the overlay once published, keep
// them).
func (t *Tx) write(key, value []byte, live bool, fnc Token, wasLive, hadTomb bool) (k, rec []byte, rev Revision, err error) {
	rev = t.nextRev()
	// The store's own copy of the key (bbolt makes another) and the
	// record, in one allocation: they are kept together (see above).
	n := recHeader
	if live {
		n += len(value)
	}
	buf := make([]byte, len(key)+n)
	k, rec = buf[:len(key):len(key)], buf[len(key):]
	copy(k, key)
	if live {
		rec[0] = flagLive
		binary.BigEndian.PutUint64(rec[1:9], uint64(fnc))
		binary.BigEndian.PutUint64(rec[9:17], uint64(rev))
		copy(rec[recHeader:], value)
		if err := t.keysBucket().Put(k, rec); err != nil {
			return nil, nil, 0, err
		}
		if hadTomb {
			if err := t.tombsBucket().Delete(k); err != nil {
				return nil, nil, 0, err
			}
		}
	} else {
		// The tombstone is the overlay's record without its flags.
		binary.BigEndian.PutUint64(rec[1:9], uint64(fnc))
		binary.BigEndian.PutUint64(rec[9:17], uint64(rev))
		if err := t.tombsBucket().Put(k, rec[1:]); err != nil {
			return nil, nil, 0, err
		}
		if wasLive {
			if err := t.keysBucket().Delete(k); err != nil {
				return nil, nil, 0, err
			}
		}
	}
	if t.writer {
		t.dirtyKeys = append(t.dirtyKeys, dirtyKey{k, rec})
	}
	t.rev = rev
	switch {
	case live && !wasLive:
		t.live++
	case !live && wasLive:
		t.live--
	}
	t.dirty = true
	return k, rec, rev, nil
}

func raise(cur Token, w Write) Token {
	if w.Token > cur {
		return w.Token
	}
	return cur
}

// Put writes value to key if the fence rule accepts w, and raises the fence
// to w.Token.
func (t *Tx) Put(key, value []byte, w Write) (Entry, error) {
	cur, ok := t.get(key, false)
	if err := check(cur.Fence, w); err != nil {
		return cur, err
	}
	nf := raise(cur.Fence, w)
	k, rec, rev, err := t.write(key, value, true, nf, cur.Found, ok && !cur.Found)
	if err != nil {
		return cur, err
	}
	return Entry{Key: k, Value: rec[recHeader:], Found: true, Fence: nf, Revision: rev}, nil
}

// Delete removes key if the fence rule accepts w. The fence survives. A
// delete of a missing key that carries a token still raises the fence (and
// keeps a tombstone for it); a tokenless one only advances the store's
// revision, as every accepted write does. deleted reports whether a live
// key was removed.
func (t *Tx) Delete(key []byte, w Write) (deleted bool, e Entry, err error) {
	cur, ok := t.get(key, false)
	if err := check(cur.Fence, w); err != nil {
		return false, cur, err
	}
	nf := raise(cur.Fence, w)
	if !cur.Found && w.Token == 0 {
		// An accepted write like any other, so it advances the store's
		// revision; there is nothing to record for the key.
		t.rev = t.nextRev()
		t.dirty = true
		return false, Entry{Key: key, Fence: nf, Revision: t.rev}, nil
	}
	_, _, rev, err := t.write(key, nil, false, nf, cur.Found, ok && !cur.Found)
	if err != nil {
		return false, cur, err
	}
	return cur.Found, Entry{Key: key, Fence: nf, Revision: rev}, nil
}

// CAS writes value if the key's revision is rev (0: the key must be absent)
// and the fence rule accepts w. The fence is checked before the revision.
func (t *Tx) CAS(key []byte, rev Revision, value []byte, w Write) (Entry, error) {
	cur, _ := t.get(key, false)
	if err := check(cur.Fence, w); err != nil {
		return cur, err
	}
	if cur.Revision != rev {
		return cur, &fence.Error{Code: fence.CodeCompareFailed, Revision: cur.Revision,
			Message: fmt.Sprintf("key is at revision %d, not %d", cur.Revision, rev)}
	}
	return t.Put(key, value, w)
}

// Incr adds delta to the signed 64-bit decimal integer stored at key (a
// missing key counts as 0) if the fence rule accepts w.
func (t *Tx) Incr(key []byte, delta int64, w Write) (int64, Entry, error) {
	cur, _ := t.get(key, false)
	if err := check(cur.Fence, w); err != nil {
		return 0, cur, err
	}
	var n int64
	if cur.Found {
		var err error
		n, err = strconv.ParseInt(string(cur.Value), 10, 64)
		if err != nil {
			return 0, cur, &fence.Error{Code: fence.CodeNotInteger, Message: fmt.Sprintf("value %.32q is not a signed 64-bit integer", cur.Value)}
		}
	}
	sum := n + delta
	if (delta > 0 && sum < n) || (delta < 0 && sum > n) {
		return 0, cur, &fence.Error{Code: fence.CodeNotInteger, Message: fmt.Sprintf("%d + %d overflows a signed 64-bit integer", n, delta)}
	}
	e, err := t.Put(key, strconv.AppendInt(nil, sum, 10), w)
	return sum, e, err
}

// Scan returns up to limit live keys in byte order that start with prefix
// and are >= start, stopping early once the keys and values returned add up
// to maxBytes (at least one item is returned). more reports whether further
// keys match. It reads only live keys from the file (deleted keys are in
// the tombstones bucket), and the overlay's records, deleted or not, in
// the range.
func (t *Tx) Scan(prefix, start []byte, limit, maxBytes int) (items []Entry, more bool) {
	size := 0
	t.each(t.keysBucket(), t.view.keysSpan, prefix, start, func(k, v []byte) bool {
		if len(v) < recHeader || v[0]&flagLive == 0 {
			return true
		}
		if len(items) == limit || (len(items) > 0 && size+len(k)+len(v) > maxBytes) {
			more = true
			return false
		}
		size += len(k) + len(v)
		items = append(items, Entry{
			Key:      bytes.Clone(k),
			Value:    append([]byte{}, v[recHeader:]...),
			Found:    true,
			Fence:    Token(binary.BigEndian.Uint64(v[1:9])),
			Revision: Revision(binary.BigEndian.Uint64(v[9:17])),
		})
		return true
	})
	return items, more
}

// Lock returns the stored lease record of a lock, or nil. The slice is the
// store's, not a copy (lease decodes it at once): valid until the
// transaction's next write or its end, and not to be changed.
func (t *Tx) Lock(name string) []byte {
	if rec, ok := t.view.lock(name); ok {
		return rec
	}
	return t.locksBucket().Get([]byte(name))
}

// PutLock stores a lock's lease record. The store keeps rec (bbolt until
// the commit, and the overlay once published): the caller must not change
// it.
func (t *Tx) PutLock(name string, rec []byte) error {
	if err := t.locksBucket().Put([]byte(name), rec); err != nil {
		return err
	}
	if t.writer {
		t.dirtyLocks[name] = rec
	}
	return nil
}

// DeleteLock removes a lock's lease record.
func (t *Tx) DeleteLock(name string) error {
	if err := t.locksBucket().Delete([]byte(name)); err != nil {
		return err
	}
	if t.writer {
		t.dirtyLocks[name] = nil
	}
	return nil
}

// Locks calls fn for each lock record whose name starts with prefix and is
// >= start, in byte order, until fn returns false. The slices are valid only
// during the call.
func (t *Tx) Locks(prefix, start []byte, fn func(name, rec []byte) bool) {
	t.each(t.locksBucket(), t.view.locksSpan, prefix, start, fn)
}

// each calls fn for the bucket's entries whose keys start with prefix and
// are >= start, in byte order, until fn returns false, with the overlay's
// records (from span) in place of the file's (a nil record: none).
func (t *Tx) each(b *bolt.Bucket, span func(prefix, from []byte) []ovRecord, prefix, start []byte, fn func(k, v []byte) bool) {
	from := prefix
	if bytes.Compare(start, prefix) > 0 {
		from = start
	}
	extra := span(prefix, from)
	c := b.Cursor()
	k, v := c.Seek(from)
	t.steps++
	for {
		if k != nil && !bytes.HasPrefix(k, prefix) {
			k = nil
		}
		var useOv bool
		switch {
		case k == nil && len(extra) == 0:
			return
		case k == nil:
			useOv = true
		case len(extra) > 0:
			switch cmp := strings.Compare(extra[0].name, string(k)); {
			case cmp < 0:
				useOv = true
			case cmp == 0:
				useOv = true
				k, v = c.Next() // the overlay's version replaces the file's
				t.steps++
			}
		}
		if useOv {
			r := extra[0]
			extra = extra[1:]
			if r.rec != nil && !fn([]byte(r.name), r.rec) {
				return
			}
			continue
		}
		if !fn(k, v) {
			return
		}
		k, v = c.Next()
		t.steps++
	}
}

// Size is the data file's size in bytes as of this transaction.
func (t *Tx) Size() int64 { return t.tx.Size() }

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func getU64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// ErrSchema is returned by Open when the file was written by another schema
// version of fencekv.
var ErrSchema = errors.New("kv: unsupported schema version")
