package kv

import (
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// The overlay is what read-only transactions see of the writer's changes
// since the last checkpoint: for every key and lock changed, its record as
// of each Publish, and the counters.
//
// A reader must see one state: the file as of a checkpoint plus every
// batch published since, up to one Publish, and nothing after it, for its
// whole life, however many Gets and Scans it runs. It must not make
// Publish or Checkpoint (so every commit) wait while it reads, so it holds
// the overlay's lock only in Begin, to take its bbolt transaction and pin
// the current view together, and then reads without locks:
//
//   - A generation (gen) holds the records published between two
//     checkpoints. Its maps only ever gain versions, and each version is
//     immutable once published (but for its prev link, below), so readers
//     may read them while Publish adds more (names).
//   - Publish numbers its batch (seq), stores each changed record as a new
//     version with that number in front of the key's older ones, and only
//     then makes a view of the new number current (under the lock). A
//     reader pinned to a view reads, for each key, the newest version
//     numbered at most its view's seq, and the file for a key with none:
//     exactly the state that Publish made current, whatever was published
//     since.
//   - Checkpoint commits the writer and makes a view of a new, empty
//     generation current under the lock, so a reader's bbolt transaction
//     (taken in Begin under the same lock) is always the file its
//     generation lies over: one from before the commit reads the old
//     generation over the old file, one from after it the new over the new.
//     The old generation is never written again.
//   - Versions no reader can read are unlinked: Publish knows the views
//     readers may still hold (every reader counts itself on its view), and
//     keeps, below the versions it adds, only the newest version numbered
//     at or below the oldest such view. So a key holds one or two versions
//     unless a reader stayed open across its publishes (then the extra
//     ones go at the key's next Publish, or with the generation).
//
// Since no reader takes the lock after Begin, Checkpoint may keep it
// through its commit: a commit that grows the file waits in bbolt for the
// open bbolt read transactions, and those end without taking the lock.
type overlay struct {
	mu  sync.RWMutex // guards cur: held for reading in Begin; for writing by Publish (to move cur) and Checkpoint (through its commit)
	cur *view        // what a reader begun now sees

	// The write side's (Publish and Checkpoint, one goroutine at a time):
	old []*view // views of cur's generation that Publish replaced, oldest first, while readers may hold them
}

// gen is the records published between two checkpoints.
type gen struct {
	keys  names // a record as in the keys bucket, the live flag cleared for a deleted key (fence and revision, no value); nil: no record
	locks names // a lease record; nil: deleted
}

// names are the chains of versions of the keys (or locks) published in a
// generation, in a hash table that one writer (Publish) adds to while
// readers look names up without locks. A chain, once in the table, stays
// in it for the generation's life. The table is replaced by one twice its
// size when it is half full; readers holding the old one find in it every
// chain added before it was replaced, which is every chain a version they
// may read is on: a reader pins its view (under the overlay's lock) after
// the Publish that added those versions made it current, and loads the
// table after that. (A sync.Map boxes names as interfaces to hash and
// compare them: the lookup was 3.7% of the server's CPU per get under 16
// clients, and is 2.9% this way.)
type names struct {
	tab atomic.Pointer[table] // nil: no chain (as in most generations' locks, or keys, in a workload of the other): a read skips the lookup
	n   int                   // chains in tab; the writer's
}

// table is an open-addressing hash table of chains, probed linearly.
type table struct {
	slots []atomic.Pointer[chain] // a power of two of them
}

// nameSeed seeds the tables' hash.
var nameSeed = maphash.MakeSeed()

// find returns name's chain, or nil.
func (ns *names) find(name string) *chain {
	t := ns.tab.Load()
	if t == nil {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for i := maphash.String(nameSeed, name) & mask; ; i = (i + 1) & mask {
		c := t.slots[i].Load()
		if c == nil || c.name == name {
			return c
		}
	}
}

// insert adds c, whose name has no chain yet. Only the writer calls it.
func (ns *names) insert(c *chain) {
	t := ns.tab.Load()
	if t == nil || 2*(ns.n+1) > len(t.slots) {
		size := 16
		if t != nil {
			size = 2 * len(t.slots)
		}
		bigger := &table{slots: make([]atomic.Pointer[chain], size)}
		if t != nil {
			for i := range t.slots {
				if o := t.slots[i].Load(); o != nil {
					bigger.put(o)
				}
			}
		}
		ns.tab.Store(bigger)
		t = bigger
	}
	t.put(c)
	ns.n++
}

func (t *table) put(c *chain) {
	mask := uint64(len(t.slots) - 1)
	i := maphash.String(nameSeed, c.name) & mask
	for t.slots[i].Load() != nil {
		i = (i + 1) & mask
	}
	t.slots[i].Store(c)
}

// each calls fn for every chain, in no order.
func (ns *names) each(fn func(*chain)) {
	t := ns.tab.Load()
	if t == nil {
		return
	}
	for i := range t.slots {
		if c := t.slots[i].Load(); c != nil {
			fn(c)
		}
	}
}

// chain is one name's versions, newest first. A chain stays in its table
// for the generation's life, so that Publish adds a version by moving head
// rather than by replacing the table's entry (which allocates).
type chain struct {
	name  string
	head  atomic.Pointer[version]
	first version // the first version published, in the same allocation
}

// version is a record as of one Publish.
type version struct {
	seq  uint64
	rec  []byte
	prev atomic.Pointer[version] // the version before, with a lower seq; nil: none that a reader may read
}

// view is the state one Publish made current: a generation up to a batch
// number, and the counters then.
type view struct {
	g       *gen
	seq     uint64
	set     bool // the counters are newer than the file's
	rev     Revision
	last    Token
	live    uint64
	readers atomic.Int64 // read-only transactions begun on this view and not ended
}

func newOverlay() overlay {
	return overlay{cur: &view{g: &gen{}}}
}

// pin returns the current view, counted as held by one more reader. The
// caller holds mu for reading.
func (o *overlay) pin() *view {
	v := o.cur
	v.readers.Add(1)
	return v
}

func (v *view) unpin() { v.readers.Add(-1) }

// publish makes current a new view whose batch adds the records of the
// keys and locks the writer w changed since the last publish to the
// current generation, with w's counters.
func (o *overlay) publish(w *Tx) {
	cur := o.cur
	// A view replaced earlier with no readers left is never held again
	// (Begin pins only cur): the oldest one still held bounds what
	// readers may read.
	done := 0
	for done < len(o.old) && o.old[done].readers.Load() == 0 {
		done++
	}
	// Shift rather than reslice, so that o.old keeps its room for the
	// append below.
	n := copy(o.old, o.old[done:])
	clear(o.old[n:])
	o.old = o.old[:n]
	floor := cur.seq
	if len(o.old) > 0 {
		floor = o.old[0].seq
	}
	seq := cur.seq + 1
	// The records are the writer's own (Tx.write, Tx.PutLock), which
	// never change: readers may share them with bbolt.
	for _, d := range w.dirtyKeys {
		cur.g.keys.addKey(d.key, seq, d.rec, floor)
	}
	for k, rec := range w.dirtyLocks {
		cur.g.locks.add(k, seq, rec, floor)
	}
	next := &view{g: cur.g, seq: seq, set: true, rev: w.rev, last: w.lastToken, live: w.live}
	o.mu.Lock()
	o.cur = next
	o.mu.Unlock()
	o.old = append(o.old, cur)
}

// add stores rec as name's version seq, and unlinks the versions below
// the newest one at or below floor, which no reader may read.
func (ns *names) add(name string, seq uint64, rec []byte, floor uint64) {
	if c := ns.find(name); c != nil {
		c.push(seq, rec, floor)
		return
	}
	ns.create(name, seq, rec)
}

// addKey is add for a key as bytes: it makes a string of it only for a
// key new to the generation.
func (ns *names) addKey(key []byte, seq uint64, rec []byte, floor uint64) {
	if c := ns.find(string(key)); c != nil {
		c.push(seq, rec, floor)
		return
	}
	ns.create(string(key), seq, rec)
}

func (ns *names) create(name string, seq uint64, rec []byte) {
	c := &chain{name: name, first: version{seq: seq, rec: rec}}
	c.head.Store(&c.first)
	ns.insert(c)
}

func (c *chain) push(seq uint64, rec []byte, floor uint64) {
	prev := c.head.Load()
	if prev.seq == seq {
		// Written twice in the batch being published: no reader reads
		// a version of it yet (readers read no version above their
		// view's seq), so the newer record replaces the older.
		prev.rec = rec
		return
	}
	v := &version{seq: seq, rec: rec}
	v.prev.Store(prev)
	for o := prev; o != nil; o = o.prev.Load() {
		if o.seq <= floor {
			o.prev.Store(nil)
			break
		}
	}
	c.head.Store(v)
}

// checkpoint makes a view of a new, empty generation current. The caller
// holds mu, and has committed everything published to the file.
func (o *overlay) checkpoint() {
	o.cur = &view{g: &gen{}, seq: o.cur.seq}
	o.old = nil
}

// at returns the record of name in ns as of the view; ok is false if the
// view has no version of it (or v is nil): the file's is current.
func (v *view) at(ns *names, name string) (rec []byte, ok bool) {
	c := ns.find(name)
	if c == nil {
		return nil, false
	}
	for o := c.head.Load(); o != nil; o = o.prev.Load() {
		if o.seq <= v.seq {
			return o.rec, true
		}
	}
	return nil, false
}

func (v *view) key(key []byte) ([]byte, bool) {
	if v == nil {
		return nil, false
	}
	return v.at(&v.g.keys, string(key))
}

func (v *view) lock(name string) ([]byte, bool) {
	if v == nil {
		return nil, false
	}
	return v.at(&v.g.locks, name)
}

// ovRecord is an overlay record found by span.
type ovRecord struct {
	name string
	rec  []byte // nil: no record (a deleted lock)
}

// span returns the view's records in m whose names start with prefix and
// are >= from, in byte order.
func (v *view) span(ns *names, prefix, from []byte) []ovRecord {
	var out []ovRecord
	ns.each(func(c *chain) {
		if !strings.HasPrefix(c.name, string(prefix)) || c.name < string(from) {
			return
		}
		for o := c.head.Load(); o != nil; o = o.prev.Load() {
			if o.seq <= v.seq {
				out = append(out, ovRecord{c.name, o.rec})
				break
			}
		}
	})
	slices.SortFunc(out, func(a, b ovRecord) int { return strings.Compare(a.name, b.name) })
	return out
}

func (v *view) keysSpan(prefix, from []byte) []ovRecord {
	if v == nil {
		return nil
	}
	return v.span(&v.g.keys, prefix, from)
}

func (v *view) locksSpan(prefix, from []byte) []ovRecord {
	if v == nil {
		return nil
	}
	return v.span(&v.g.locks, prefix, from)
}
