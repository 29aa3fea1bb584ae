package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/fencekv/fencekv/fence"
)

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
