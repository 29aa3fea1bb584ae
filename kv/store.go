package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekv/fencekv/diskfault"
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
	if diskfault.Enabled {
		diskfault.DataCommitted(path, s.image) // the power-loss recorder: what is on the disk
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
