package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/fencekv/fencekv/kv"
)

// The durable watch history: every event the machine publishes is also
// written to the data file (kv's history bucket), numbered in the
// store-wide event sequence, in the transaction that applied the change
// it describes, as the batch is published. It is so exactly as durable
// as the data: a checkpoint commits both; after a crash, the log's replay
// applies the commands the file lacks again, and so writes their events
// again, once (the file never had them). On a cluster every node's
// machine writes them as it applies, so any node serves a resumed watch
// after a restart, and a raft snapshot (the data file) carries them. On
// open the hub's window is loaded from the file.
//
// Cost: a batch's events are encoded into one record (of half a page at
// most, so that bbolt writes it from its pool of pages), one put per
// record, into an arena of blocks reused after each checkpoint (bbolt
// keeps a put's value until the commit). Records are grouped in
// generations (sub-buckets) of a tenth of the limits each; the oldest
// generation is dropped whole once the rest still hold the hub's window
// (the latest WatchHistory events within WatchHistoryBytes, eventBytes),
// so the file keeps at least the window and at most a generation more,
// and trimming never deletes event by event. The file's floor (kv's
// history_floor) is the revision from which every event is kept: past the
// last revision of a dropped generation; a file that never kept a
// history gets the revision after its own as floor on the first event.

// durable is the file's history as the machine's write side tracks it:
// its generations' sizes, to trim without reading them back. Owned by
// the write side.
type durable struct {
	max, maxBytes       int
	genMax, genMaxBytes int      // a generation is full at either
	floor               Revision // every event at or after it is in the file
	floorStored         bool     // the file has floor (else it is written with the first event)
	next                uint64   // the next event's number
	gens                []durableGen
	head                int // gens[head:] are in the file, oldest first
	count, bytes        int // events, and their eventBytes, in gens[head:]
	arena               arena
}

// durableGen is a generation: its first event's number (its key), and
// what it holds.
type durableGen struct {
	first        uint64
	count, bytes int
	last         Revision // its last event's revision
}

// maxRecord is the most a record holds (but for a single larger event):
// two fit a page of 4 KiB with their keys and headers. bbolt splits a
// node into pages of at least two elements each, and writes a node of one
// page from its pool, a larger one into a new allocation.
const maxRecord = 2000

func newDurable(history, historyBytes int, floor Revision) *durable {
	return &durable{max: history, maxBytes: historyBytes, genMax: max(history/10, 1), genMaxBytes: max(historyBytes/10, 1), floor: floor, next: 1}
}

func (d *durable) full(g *durableGen) bool {
	return g.count >= d.genMax || g.bytes >= d.genMaxBytes
}

// add writes a published batch's events to the file in tx, and drops
// the oldest generations the window no longer needs.
func (d *durable) add(tx *kv.Tx, es []Event) error {
	if len(es) == 0 {
		return nil
	}
	if !d.floorStored {
		if err := tx.SetHistoryFloor(d.floor); err != nil {
			return err
		}
		d.floorStored = true
	}
	a := &d.arena
	first := d.next // the open record's first event
	flush := func() error {
		rec := a.take()
		if len(rec) == 0 {
			return nil
		}
		g := &d.gens[len(d.gens)-1]
		err := tx.PutHistory(g.first, first, rec)
		first = d.next
		return err
	}
	for i := range es {
		e := &es[i]
		n := eventRecordSize(e)
		need := kv.HistoryEntrySize(n)
		if d.head == len(d.gens) || d.full(&d.gens[len(d.gens)-1]) {
			if err := flush(); err != nil {
				return err
			}
			d.gens = append(d.gens, durableGen{first: d.next})
		}
		if a.open() > 0 && (a.open()+need > maxRecord || !a.fits(need)) {
			if err := flush(); err != nil {
				return err
			}
		}
		a.reserve(need)
		a.buf = appendEvent(kv.AppendHistoryEntry(a.buf, n), e)
		size := eventBytes(e)
		g := &d.gens[len(d.gens)-1]
		g.count++
		g.bytes += size
		g.last = e.Revision
		d.count++
		d.bytes += size
		d.next++
	}
	if err := flush(); err != nil {
		return err
	}
	return d.trim(tx)
}

// trim drops the oldest generations while the rest still hold the hub's
// window: at least max events, or at least maxBytes (the window is the
// latest events within both), and moves the floor past them.
func (d *durable) trim(tx *kv.Tx) error {
	dropped := false
	for d.head < len(d.gens)-1 {
		g := &d.gens[d.head]
		if d.count-g.count < d.max && d.bytes-g.bytes < d.maxBytes {
			break
		}
		if err := tx.DropHistory(g.first); err != nil {
			return err
		}
		d.floor = max(d.floor, g.last+1)
		d.count -= g.count
		d.bytes -= g.bytes
		d.head++
		dropped = true
	}
	if !dropped {
		return nil
	}
	if d.head > len(d.gens)/2 {
		d.gens = append(d.gens[:0], d.gens[d.head:]...)
		d.head = 0
	}
	return tx.SetHistoryFloor(d.floor)
}

// committed is called once the file committed what was put: the arena's
// blocks may be written again.
func (d *durable) committed() { d.arena.reset() }

// arena holds the records put since the last commit: bbolt keeps a
// put's value (not a copy) until the commit, so a record's bytes are
// never written again before it; after it, the blocks are reused.
type arena struct {
	buf   []byte   // the block being filled; buf[start:] is the open record
	start int      //
	used  [][]byte // blocks filled since the last commit, but for buf
	free  [][]byte // blocks to reuse
}

const arenaBlock = 64 << 10

func (a *arena) open() int       { return len(a.buf) - a.start }
func (a *arena) fits(n int) bool { return cap(a.buf)-len(a.buf) >= n }

// reserve makes room for n more bytes of the open record: a new block
// when buf has not (only with no record open: a record is contiguous).
func (a *arena) reserve(n int) {
	if a.fits(n) {
		return
	}
	if cap(a.buf) == arenaBlock {
		a.used = append(a.used, a.buf)
	}
	switch {
	case n > arenaBlock:
		a.buf = make([]byte, 0, n) // a large event's own, not reused
	case len(a.free) > 0:
		a.buf = a.free[len(a.free)-1][:0]
		a.free = a.free[:len(a.free)-1]
	default:
		a.buf = make([]byte, 0, arenaBlock)
	}
	a.start = 0
}

// take ends the open record and returns it.
func (a *arena) take() []byte {
	rec := a.buf[a.start:len(a.buf):len(a.buf)]
	a.start = len(a.buf)
	return rec
}

func (a *arena) reset() {
	a.free = append(a.free, a.used...)
	clear(a.used)
	a.used = a.used[:0]
	if cap(a.buf) != arenaBlock {
		a.buf = nil
	}
	a.buf, a.start = a.buf[:0], 0
}

// loadHistory reads the file's history: its floor and events, oldest
// first. rev is the file's revision: a file that never kept a history
// gets rev+1 as its floor.
func (m *Machine) loadHistory(history, historyBytes int, rev Revision) (*durable, []Event, error) {
	d := newDurable(history, historyBytes, rev+1)
	var es []Event
	err := m.view(0, func(tx *kv.Tx, _ time.Duration) error {
		if f, ok := tx.HistoryFloor(); ok {
			d.floor, d.floorStored = f, true
		}
		var bad error
		err := tx.EachHistoryGen(func(gen, seq uint64, rec []byte) bool {
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
			if len(d.gens) == 0 || d.gens[len(d.gens)-1].first != gen {
				d.gens = append(d.gens, durableGen{first: gen})
			}
			size := eventBytes(&e)
			g := &d.gens[len(d.gens)-1]
			g.count++
			g.bytes += size
			g.last = e.Revision
			d.count++
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

// eventRecordSize is the length of e's record.
func eventRecordSize(e *Event) int {
	return 25 + kv.HistoryEntrySize(len(e.Key)) + kv.HistoryEntrySize(len(e.Lock)) + len(e.Value)
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
