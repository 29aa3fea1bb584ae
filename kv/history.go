package kv

import (
	"encoding/binary"
	"errors"
	"slices"
)

// The watch history: the events of the latest revisions, kept in the
// data file so that a watch resumed after a restart gets them (package
// state encodes them; here they are opaque records).
//
//	history  event number (8, big-endian) -> event record
//	meta     history_floor: every event at or after this revision is in
//	         history (absent in a file that never kept one)
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

// PutHistory stores event number seq's record. The store keeps rec until
// the commit: the caller must not change it.
func (t *Tx) PutHistory(seq uint64, rec []byte) error {
	b, err := t.tx.CreateBucketIfNotExists(bucketHistory)
	if err != nil {
		return err
	}
	return b.Put(u64(seq), rec)
}

// DeleteHistory removes the events numbered below seq.
func (t *Tx) DeleteHistory(below uint64) error {
	b := t.tx.Bucket(bucketHistory)
	if b == nil {
		return nil
	}
	// The keys first, then the deletes: a cursor's First after each
	// delete walks again over the leaves emptied so far (bbolt rebalances
	// them only at commit), which made a chunk of k deletes cost k²/2
	// steps; and deleting under a cursor that moves on with Next skips keys.
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) < below; k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	// Newest first: each delete then takes the last element of its leaf,
	// where oldest first would shift the rest of the leaf every time.
	for _, k := range slices.Backward(keys) {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// EachHistory calls fn for every stored event, oldest first, until it
// returns false. rec is valid only during the call; a malformed key is
// an error.
func (t *Tx) EachHistory(fn func(seq uint64, rec []byte) bool) error {
	b := t.tx.Bucket(bucketHistory)
	if b == nil {
		return nil
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 || v == nil {
			return errors.New("kv: a malformed history entry")
		}
		if !fn(binary.BigEndian.Uint64(k), v) {
			return nil
		}
	}
	return nil
}
