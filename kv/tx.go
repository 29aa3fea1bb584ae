package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/fencekv/fencekv/diskfault"
	bolt "go.etcd.io/bbolt"
)

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
	if diskfault.Enabled {
		diskfault.DataCommitted(t.s.db.Path(), t.s.image) // the power-loss recorder
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
