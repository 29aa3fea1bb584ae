package kv

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The watch history: the events of the latest revisions, kept in the
// data file so that a watch resumed after a restart gets them (package
// state encodes them; here they are opaque entries, numbered in one
// store-wide sequence).
//
//	history  generation (8, big-endian: its first event's number) -> bucket:
//	           record (8, big-endian: its first event's number) ->
//	             entries, each a uvarint length and the bytes
//	meta     history_floor: every event at or after this revision is in
//	         history (absent in a file that never kept one)
//
// A record holds the consecutive events of (part of) one batch, so the
// writer makes one put per batch (per record of about a page at most)
// rather than one per event. A generation is a sub-bucket of records,
// trimmed whole (DropHistory): trimming never deletes key by key, which
// in bbolt shifts the rest of the leaf every time.
//
// The writer puts them in the transaction that applies the changes they
// describe, so they are exactly as durable as the data: a checkpoint
// commits both, and a log replay writes again only what the file lacks.
// The bucket is made on the first put; a file without it has no history.

var (
	bucketHistory    = []byte("history")
	metaHistoryFloor = []byte("history_floor")
)

// HistoryFloor returns the history's floor revision, and false when the
// file has none (it never kept a history).
func (t *Tx) HistoryFloor() (Revision, bool) {
	meta := t.tx.Bucket(bucketMeta)
	if meta == nil {
		return 0, false
	}
	v := meta.Get(metaHistoryFloor)
	if len(v) != 8 {
		return 0, false
	}
	return Revision(binary.BigEndian.Uint64(v)), true
}

// SetHistoryFloor records the history's floor revision. Writable
// transactions only.
func (t *Tx) SetHistoryFloor(floor Revision) error {
	meta := t.tx.Bucket(bucketMeta)
	if meta == nil {
		return errors.New("kv: no meta bucket")
	}
	return meta.Put(metaHistoryFloor, u64(uint64(floor)))
}

// AppendHistoryEntry appends the header of a record's entry of n bytes
// to b; the caller appends the n bytes.
func AppendHistoryEntry(b []byte, n int) []byte { return binary.AppendUvarint(b, uint64(n)) }

// HistoryEntrySize is the size in a record of an entry of n bytes.
func HistoryEntrySize(n int) int {
	s := 1
	for v := uint64(n); v >= 0x80; v >>= 7 {
		s++
	}
	return s + n
}

// PutHistory stores in generation gen the record rec (entries made with
// AppendHistoryEntry) whose first entry is event number first; gen is
// the generation's first event's number, and a new generation's is its
// first record's. The store keeps rec until the commit: the caller must
// not change it before.
func (t *Tx) PutHistory(gen, first uint64, rec []byte) error {
	h, err := t.tx.CreateBucketIfNotExists(bucketHistory)
	if err != nil {
		return err
	}
	var gk, rk [8]byte
	g := h.Bucket(be64(&gk, gen))
	if g == nil {
		if g, err = h.CreateBucket(gk[:]); err != nil {
			return err
		}
	}
	g.FillPercent = 1 // appended in order: full pages, not half ones
	return g.Put(be64(&rk, first), rec)
}

// DropHistory removes generation gen, all its records at once.
func (t *Tx) DropHistory(gen uint64) error {
	h := t.tx.Bucket(bucketHistory)
	if h == nil {
		return nil
	}
	var gk [8]byte
	if err := h.DeleteBucket(be64(&gk, gen)); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
		return err
	}
	return nil
}

// be64 is u64 in the caller's array, for a lookup or a put (bbolt
// copies the keys it keeps).
func be64(b *[8]byte, v uint64) []byte {
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

var errHistoryEntry = errors.New("kv: a malformed history entry")

// EachHistory calls fn for every stored event, oldest first, until it
// returns false. rec is valid only during the call; a malformed entry is
// an error.
func (t *Tx) EachHistory(fn func(seq uint64, rec []byte) bool) error {
	return t.EachHistoryGen(func(_, seq uint64, rec []byte) bool { return fn(seq, rec) })
}

// EachHistoryGen is EachHistory, with the generation of each event.
// Events are numbered in order: a record that starts before the end of
// the one before it, or a generation after its first record, is an
// error.
func (t *Tx) EachHistoryGen(fn func(gen, seq uint64, rec []byte) bool) error {
	h := t.tx.Bucket(bucketHistory)
	if h == nil {
		return nil
	}
	var next uint64 // the least number the next event may have
	c := h.Cursor()
	for gk, v := c.First(); gk != nil; gk, v = c.Next() {
		g := h.Bucket(gk)
		if len(gk) != 8 || v != nil || g == nil {
			return errHistoryEntry
		}
		gen := binary.BigEndian.Uint64(gk)
		rc := g.Cursor()
		for rk, rec := rc.First(); rk != nil; rk, rec = rc.Next() {
			if len(rk) != 8 || rec == nil {
				return errHistoryEntry
			}
			seq := binary.BigEndian.Uint64(rk)
			if seq < gen || seq < next {
				return fmt.Errorf("kv: history record %d out of order (generation %d, after event %d)", seq, gen, next-1)
			}
			for len(rec) > 0 {
				n, w := binary.Uvarint(rec)
				if w <= 0 || n > uint64(len(rec)-w) {
					return fmt.Errorf("%w in record %d", errHistoryEntry, binary.BigEndian.Uint64(rk))
				}
				if !fn(gen, seq, rec[w:w+int(n)]) {
					return nil
				}
				rec = rec[w+int(n):]
				seq++
			}
			next = seq
		}
	}
	return nil
}
