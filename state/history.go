package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/fencekv/fencekv/kv"
)

// The durable watch history: every event the machine records is also
// written to the data file (kv's history bucket), keyed by its number in
// the store-wide event sequence, in the transaction that applies the
// change it describes. It is so exactly as durable as the data: a
// checkpoint commits both; after a crash, the log's replay applies the
// commands the file lacks again, and so writes their events again, once
// (the file never had them). On a cluster every node's machine writes
// them as it applies, so any node serves a resumed watch after a restart,
// and a raft snapshot (the data file) carries them. On open the hub's
// window is loaded from the file.
//
// The file keeps at least the hub's window: the latest WatchHistory
// events within WatchHistoryBytes (eventBytes), and the oldest go in
// chunks, once the file holds a tenth more than that (amortised: about
// one delete per event). Its floor (kv's history_floor) is the revision
// from which every event is kept; a file that never kept a history gets
// the revision after its own as floor on the first event.

// durable is the file's history as the machine's write side tracks it:
// what each kept event costs, to trim without reading them back. Owned by
// the write side.
type durable struct {
	max, maxBytes int
	floor         Revision // every event at or after it is in the file
	floorStored   bool     // the file has floor (else it is written with the first event)
	next          uint64   // the next event's number
	ents          []durableEnt
	head          int // ents[head:] are in the file, oldest first
	bytes         int // eventBytes of ents[head:]
}

type durableEnt struct {
	seq  uint64
	rev  Revision
	size int
}

func (d *durable) count() int { return len(d.ents) - d.head }

// add writes es to the file in tx, and trims it when it is a tenth over
// its limits.
func (d *durable) add(tx *kv.Tx, es []Event) error {
	if !d.floorStored {
		if err := tx.SetHistoryFloor(d.floor); err != nil {
			return err
		}
		d.floorStored = true
	}
	for i := range es {
		e := &es[i]
		if err := tx.PutHistory(d.next, appendEvent(nil, e)); err != nil {
			return err
		}
		size := eventBytes(e)
		d.ents = append(d.ents, durableEnt{seq: d.next, rev: e.Revision, size: size})
		d.bytes += size
		d.next++
	}
	if n := d.count(); n > d.max+d.max/10 || (n > 1 && d.bytes > d.maxBytes+d.maxBytes/10) {
		return d.trim(tx)
	}
	return nil
}

// trim drops the oldest events until the rest fit the limits, as the
// hub's window does (so the file holds at least the window), and moves
// the floor past them.
func (d *durable) trim(tx *kv.Tx) error {
	for n := d.count(); n > d.max || (n > 1 && d.bytes > d.maxBytes); n-- {
		old := d.ents[d.head]
		d.floor = max(d.floor, old.rev+1)
		d.bytes -= old.size
		d.head++
	}
	if err := tx.DeleteHistory(d.ents[d.head].seq); err != nil {
		return err
	}
	if err := tx.SetHistoryFloor(d.floor); err != nil {
		return err
	}
	if d.head > len(d.ents)/2 {
		d.ents = append(d.ents[:0], d.ents[d.head:]...)
		d.head = 0
	}
	return nil
}

// loadHistory reads the file's history: its floor and events, oldest
// first. rev is the file's revision: a file that never kept a history
// gets rev+1 as its floor.
func (m *Machine) loadHistory(history, historyBytes int, rev Revision) (*durable, []Event, error) {
	d := &durable{max: history, maxBytes: historyBytes, floor: rev + 1, next: 1}
	var es []Event
	err := m.view(0, func(tx *kv.Tx, _ time.Duration) error {
		if f, ok := tx.HistoryFloor(); ok {
			d.floor, d.floorStored = f, true
		}
		var bad error
		err := tx.EachHistory(func(seq uint64, rec []byte) bool {
			e, err := decodeEvent(rec)
			switch {
			case err != nil:
				bad = fmt.Errorf("event %d: %w", seq, err)
			case seq < d.next:
				bad = fmt.Errorf("event %d after event %d", seq, d.next-1)
			case e.Revision > rev || (len(es) > 0 && e.Revision < es[len(es)-1].Revision):
				bad = fmt.Errorf("event %d at revision %d, out of order (the store is at %d)", seq, e.Revision, rev)
			}
			if bad != nil {
				return false
			}
			es = append(es, e)
			size := eventBytes(&e)
			d.ents = append(d.ents, durableEnt{seq: seq, rev: e.Revision, size: size})
			d.bytes += size
			d.next = seq + 1
			return true
		})
		return errors.Join(err, bad)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("fencekv: the watch history in %s: %w", m.path, err)
	}
	return d, es, nil
}

// Event records: type (1 byte), revision, fence, token (8 bytes each,
// big-endian), the key's and the lock name's lengths (uvarint) and
// bytes, then the value.
var eventTypes = [...]string{1: "put", 2: "delete", 3: "acquired", 4: "released", 5: "expired"}

func eventType(s string) byte {
	for i, t := range eventTypes {
		if i > 0 && t == s {
			return byte(i)
		}
	}
	return 0
}

func appendEvent(b []byte, e *Event) []byte {
	b = append(b, eventType(e.Type))
	b = binary.BigEndian.AppendUint64(b, uint64(e.Revision))
	b = binary.BigEndian.AppendUint64(b, uint64(e.Fence))
	b = binary.BigEndian.AppendUint64(b, uint64(e.Token))
	b = binary.AppendUvarint(b, uint64(len(e.Key)))
	b = append(b, e.Key...)
	b = binary.AppendUvarint(b, uint64(len(e.Lock)))
	b = append(b, e.Lock...)
	return append(b, e.Value...)
}

var errEventRecord = errors.New("a malformed event record")

// decodeEvent decodes a record; the event owns its bytes.
func decodeEvent(rec []byte) (Event, error) {
	if len(rec) < 25 || int(rec[0]) >= len(eventTypes) || rec[0] == 0 {
		return Event{}, errEventRecord
	}
	e := Event{Type: eventTypes[rec[0]],
		Revision: Revision(binary.BigEndian.Uint64(rec[1:])),
		Fence:    Token(binary.BigEndian.Uint64(rec[9:])),
		Token:    Token(binary.BigEndian.Uint64(rec[17:])),
	}
	b := rec[25:]
	n, w := binary.Uvarint(b)
	if w <= 0 || n > uint64(len(b)-w) {
		return Event{}, errEventRecord
	}
	key := b[w : w+int(n)]
	b = b[w+int(n):]
	n, w = binary.Uvarint(b)
	if w <= 0 || n > uint64(len(b)-w) {
		return Event{}, errEventRecord
	}
	e.Lock = string(b[w : w+int(n)])
	value := b[w+int(n):]
	switch e.Type {
	case "put":
		own := make([]byte, len(key)+len(value))
		copy(own, key)
		copy(own[len(key):], value)
		e.Key, e.Value = own[:len(key):len(key)], own[len(key):]
	case "delete":
		e.Key = append([]byte(nil), key...)
	}
	return e, nil
}
