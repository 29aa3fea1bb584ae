package state

import (
	"bytes"

	"fmt"
	"sync"
	"unsafe"

	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/kv"
)

// Watch: subscribers get the changes to keys (and, if they ask, locks) in
// revision order, after they are durable, never twice and never with a
// gap, resuming from a revision still in the history window.
//
// The machine records an event for every change it applies; when a batch
// is published (durable), its events go into the history ring and to every
// watcher, in the same step, under one lock: a watcher that starts from a
// revision gets the history from there and then every later batch, with
// nothing in between and nothing twice. Lock events (acquired, released,
// expired) do not advance the store's revision: they carry the revision
// current when they happened, after the key events of that revision.
//
// A watcher that does not keep up is cancelled (ErrWatchCancelled) rather
// than hold up writes: its buffer is bounded, and writers never wait for
// it.

// Event is one change, as a watcher sees it.
type Event struct {
	Type     string // put, delete; acquired, released, expired
	Key      []byte // put, delete
	Value    []byte // put: the value written
	Fence    Token  // put, delete: the key's fence after the change
	Revision Revision
	Lock     string // lock events
	Token    Token  // lock events: the token granted, released or expired
}

// WatchOptions select what a watcher sees.
type WatchOptions struct {
	Prefix []byte // keys that start with it (all keys if empty)
	Locks  bool   // also lock events, for lock names that start with Prefix
	// StartRevision replays the kept events from this revision on
	// (inclusive); 0 means from now. Older than the history window:
	// ErrCompacted, with the oldest revision kept.
	StartRevision Revision
	// Buffer is how many batches of events may wait for the watcher
	// before it is cancelled as too slow (0: 256).
	Buffer int
}

// Watcher receives events.
type Watcher struct {
	o      WatchOptions
	rev    Revision // the store's revision when it started
	after  uint64   // the number of the last event it had when it started (guarded by h.mu)
	ch     chan []Event
	h      *hub
	mu     sync.Mutex // guards err, closed
	err    error
	closed bool
}

// Revision is the store's revision when the watcher started: it gets
// every change after it (and, with StartRevision, the kept ones from
// there).
func (w *Watcher) Revision() Revision { return w.rev }

// Events delivers batches of events in revision order. It is closed when
// the watcher ends; Err says why.
func (w *Watcher) Events() <-chan []Event { return w.ch }

// Err is why the watcher ended: nil while it runs or after Close.
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close stops the watcher. It is safe to call more than once.
func (w *Watcher) Close() {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	w.end(nil)
}

// end closes the watcher with err. Called with h.mu held.
func (w *Watcher) end(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed, w.err = true, err
	delete(w.h.watchers, w)
	close(w.ch)
}

func (w *Watcher) wants(e *Event) bool {
	switch e.Type {
	case "acquired", "released", "expired":
		return w.o.Locks && bytes.HasPrefix([]byte(e.Lock), w.o.Prefix)
	}
	return bytes.HasPrefix(e.Key, w.o.Prefix)
}

// filter returns the events w wants: es itself when it wants them all
// (batches are never changed once published, so watchers share them).
func (w *Watcher) filter(es []Event) []Event {
	all := true
	for i := range es {
		if !w.wants(&es[i]) {
			all = false
			break
		}
	}
	if all {
		return es
	}
	var out []Event
	for i := range es {
		if w.wants(&es[i]) {
			out = append(out, es[i])
		}
	}
	return out
}

// hub keeps the history window and the watchers. The batch leader only
// appends to the history (publish); a dispatcher goroutine hands the
// batches to the watchers, so that writes never wait for them.
type hub struct {
	mu       sync.Mutex // guards all below
	hist     []Event    // ring of the latest events
	head, n  int        // oldest event at hist[head]; n events held
	bytes    int        // the keys and values of the events held
	maxBytes int        // past this, the oldest events go
	maxW     int        // most watchers at once
	floor    Revision   // every event at or after floor is held
	lastRev  Revision   // the revision of the last event published (floor-1 before any)
	seq      uint64     // events published so far; the last one is number seq
	queue    []batch    // published, not yet handed to the watchers
	watchers map[*Watcher]struct{}
	closed   bool

	wake chan struct{} // the dispatcher has a queue to hand out
	done chan struct{} // closed when the dispatcher ends
}

// batch is a published batch of events; its first is number first.
type batch struct {
	first  uint64
	events []Event
}

func newHub(size, maxBytes, maxWatchers int, next Revision) *hub {
	h := &hub{hist: make([]Event, max(size, 1)), maxBytes: maxBytes, maxW: maxWatchers, floor: next, lastRev: next - 1, watchers: map[*Watcher]struct{}{},
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	go h.dispatch()
	return h
}

// publish adds a durable batch's events to the history and queues them for
// the watchers. Called by the machine's write side. It reports whether it
// kept es (for the watchers): if not, the caller may reuse it.
func (h *hub) publish(es []Event) (kept bool) {
	if len(es) == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	for _, e := range es {
		size := eventBytes(&e)
		for h.n == len(h.hist) || (h.n > 0 && h.bytes+size > h.maxBytes) {
			// Evict the oldest: events of its revision are no longer
			// all held.
			old := &h.hist[h.head]
			h.floor = max(h.floor, old.Revision+1)
			h.bytes -= eventBytes(old)
			*old = Event{} // let its bytes go
			h.head = (h.head + 1) % len(h.hist)
			h.n--
		}
		h.hist[(h.head+h.n)%len(h.hist)] = e
		h.n++
		h.bytes += size
	}
	first := h.seq + 1
	h.seq += uint64(len(es))
	h.lastRev = es[len(es)-1].Revision
	if len(h.watchers) == 0 {
		return false // nobody to hand it to; a watcher that starts later replays the history
	}
	h.queue = append(h.queue, batch{first: first, events: es})
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return true
}

// eventBytes is what an event holds in the history: its key and value,
// and the struct.
func eventBytes(e *Event) int {
	return len(e.Key) + len(e.Value) + len(e.Lock) + int(unsafe.Sizeof(*e))
}

// replayBytes bounds one batch of a replay: a replay of the whole history
// goes out as several notifications, each checked against the
// connection's pending budget.
const replayBytes = 1 << 20

// defaultWatchBuffer is WatchOptions.Buffer's default.
const defaultWatchBuffer = 256

// maxWatchHistoryBytes bounds WatchHistoryBytes: a replay of the whole
// history fits a buffer of the default size.
const maxWatchHistoryBytes = defaultWatchBuffer * replayBytes

// dispatch hands queued batches to the watchers until the hub closes. A
// watcher whose buffer is full is cancelled.
func (h *hub) dispatch() {
	defer close(h.done)
	for range h.wake {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return
		}
		queue := h.queue
		h.queue = nil
		for _, b := range queue {
			for w := range h.watchers {
				es := b.events
				if w.after >= b.first+uint64(len(es))-1 {
					continue // it started after this batch: in its replay
				}
				if w.after >= b.first {
					es = es[w.after-b.first+1:]
				}
				if es = w.filter(es); len(es) == 0 {
					continue
				}
				select {
				case w.ch <- es:
				default:
					w.end(fmt.Errorf("%w: it fell %d batches behind", ErrWatchCancelled, cap(w.ch)))
				}
			}
		}
		h.mu.Unlock()
	}
}

// watch starts a watcher, replaying the history from o.StartRevision.
func (h *hub) watch(o WatchOptions) (*Watcher, error) {
	if o.Buffer <= 0 {
		o.Buffer = defaultWatchBuffer
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errClosed
	}
	if len(h.watchers) >= h.maxW {
		return nil, errorf(fence.CodeLimitExceeded, "%d watchers already, the most the store serves at once", len(h.watchers))
	}
	// It has seen every event published so far (by the replay, or by
	// starting from now); the dispatcher hands it the later ones.
	w := &Watcher{o: o, ch: make(chan []Event, o.Buffer), h: h, after: h.seq, rev: h.lastRev}
	if o.StartRevision != 0 {
		if o.StartRevision < h.floor {
			return nil, &fence.Error{Code: fence.CodeCompacted, Revision: h.floor,
				Message: fmt.Sprintf("revision %d is no longer kept; the oldest kept is %d", o.StartRevision, h.floor)}
		}
		// In batches of about replayBytes. The whole history is at most
		// WatchHistoryBytes, so the batches fit a buffer of the default
		// size (maxWatchHistoryBytes); a smaller buffer may not take
		// them: the watch is refused as too slow from the start.
		var batches [][]Event
		var replay []Event
		size := 0
		for i := range h.n {
			e := &h.hist[(h.head+i)%len(h.hist)]
			if e.Revision < o.StartRevision || !w.wants(e) {
				continue
			}
			replay = append(replay, *e)
			if size += eventBytes(e); size >= replayBytes {
				batches, replay, size = append(batches, replay), nil, 0
			}
		}
		if len(replay) > 0 {
			batches = append(batches, replay)
		}
		if len(batches) > cap(w.ch) {
			return nil, errorf(fence.CodeLimitExceeded, "the replay from revision %d is %d batches, over the watcher's buffer of %d", o.StartRevision, len(batches), cap(w.ch))
		}
		for _, b := range batches {
			w.ch <- b
		}
	}
	h.watchers[w] = struct{}{}
	return w, nil
}

// load fills the history with es, oldest first (the data file's, as
// the hub starts), as publish would; rev is the store's revision.
func (h *hub) load(es []Event, rev Revision) {
	for len(es) > 0 {
		n := min(len(es), 1024)
		h.publish(es[:n])
		es = es[n:]
	}
	h.mu.Lock()
	h.lastRev = rev
	h.mu.Unlock()
}

// close ends every watcher and the dispatcher.
func (h *hub) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	for w := range h.watchers {
		w.end(fmt.Errorf("%w: the store closed or its state was replaced; watch again", ErrWatchCancelled))
	}
	close(h.wake)
	h.mu.Unlock()
	<-h.done
}

// recordEvents adds to the open batch the events of c, which was applied
// with result r. Called by apply.
func (m *Machine) recordEvents(tx *kv.Tx, c *Command, r *Result, expired Token) {
	if m.sink == nil || r.Err != nil || r.Noop {
		return
	}
	m.appendEvents(tx, c, r, expired) // the data file gets them as the batch is published (keepEvents)
}

// keepEvents writes the open batch's events to the data file's history,
// in the writer's transaction, as the batch is published: one record for
// the batch rather than a put per command. An error fails the machine:
// the batch is durable in the log (its callers may be answered as
// applied), and a restart replays it, events and all.
func (m *Machine) keepEvents() error {
	if m.hist == nil || len(m.events) == 0 {
		return nil
	}
	tx, err := m.store.Writer()
	if err == nil {
		err = m.hist.add(tx, m.events)
	}
	if err != nil {
		return m.fail(fmt.Errorf("fencekv: keeping the watch history: %w", err))
	}
	return nil
}

// appendEvents adds c's events to the open batch.
func (m *Machine) appendEvents(tx *kv.Tx, c *Command, r *Result, expired Token) {
	n := len(m.events)
	defer func() {
		// The events outlive the request: they own their bytes.
		for i := n; i < len(m.events); i++ {
			e := &m.events[i]
			b := make([]byte, len(e.Key)+len(e.Value))
			copy(b, e.Key)
			copy(b[len(e.Key):], e.Value)
			e.Key, e.Value = b[:len(e.Key):len(e.Key)], b[len(e.Key):]
		}
	}()
	switch c.Op {
	case OpPut, OpCAS, OpIncr:
		// The entry's key and value are the store's copies, which never
		// change (kv.Tx.Put): the event owns them already, and an incr's
		// value is its new value as text.
		m.events = append(m.events, Event{Type: "put", Key: r.Entry.Key, Value: r.Entry.Value, Fence: r.Entry.Fence, Revision: r.Entry.Revision})
		n = len(m.events) // so the deferred copy passes it by
	case OpDelete:
		m.events = append(m.events, Event{Type: "delete", Key: c.Key, Fence: r.Entry.Fence, Revision: r.Entry.Revision})
	case OpTxn:
		for i, op := range c.Ops {
			res := r.Txn[i]
			switch op.Op {
			case OpDelete:
				m.events = append(m.events, Event{Type: "delete", Key: op.Key, Fence: res.Fence, Revision: res.Revision})
			case OpIncr:
				m.events = append(m.events, Event{Type: "put", Key: op.Key, Value: []byte(fmt.Sprint(res.Int)), Fence: res.Fence, Revision: res.Revision})
			default:
				m.events = append(m.events, Event{Type: "put", Key: op.Key, Value: op.Value, Fence: res.Fence, Revision: res.Revision})
			}
		}
	case OpAcquire:
		m.events = append(m.events, Event{Type: "acquired", Lock: c.Lease.Name, Token: r.Grant.Token, Revision: tx.Revision()})
	case OpRelease:
		m.events = append(m.events, Event{Type: "released", Lock: c.Lease.Name, Token: c.Token, Revision: tx.Revision()})
	case OpExpire:
		if expired != 0 {
			m.events = append(m.events, Event{Type: "expired", Lock: c.Lease.Name, Token: expired, Revision: tx.Revision()})
		}
	}
}

// EnableWatch starts keeping the latest history events (and at most
// about historyBytes of their keys and values) for watchers, in memory
// and in the data file (history.go), and serves at most maxWatchers at
// once. The window starts with the events the file kept. Call it once,
// before applying (before a log's replay too: the replayed commands' events
// are recorded as they are applied again).
func (m *Machine) EnableWatch(history, historyBytes, maxWatchers int) error {
	if historyBytes > maxWatchHistoryBytes {
		return fmt.Errorf("fencekv: WatchHistoryBytes %d is over the limit of %d: a replay of the whole history must fit a watcher's default buffer (%d batches of about %d bytes)",
			historyBytes, maxWatchHistoryBytes, defaultWatchBuffer, replayBytes)
	}
	st, err := m.Counters()
	if err != nil {
		return err
	}
	d, es, err := m.loadHistory(history, historyBytes, st.Revision)
	if err != nil {
		return err
	}
	m.hist = d
	m.hub = newHub(history, historyBytes, maxWatchers, d.floor)
	m.hub.load(es, st.Revision)
	m.sink = m.hub.publish
	return nil
}

// Watch starts a watcher (see DB.Watch). Any goroutine.
func (m *Machine) Watch(o WatchOptions) (*Watcher, error) {
	if m.hub == nil {
		return nil, errorf(fence.CodeUnavailable, "this store keeps no watch history")
	}
	return m.hub.watch(o)
}

// resetWatch ends every watcher and loads the history again from the
// data file: the machine's state was replaced (Restore), and the history
// with it (a snapshot's file carries its own).
func (m *Machine) resetWatch() {
	if m.hub == nil {
		return
	}
	m.hub.close()
	m.events = m.events[:0]
	if err := m.EnableWatch(len(m.hub.hist), m.hub.maxBytes, m.hub.maxW); err != nil && m.Failed() == nil {
		// The new state's history cannot be read: no watcher could be
		// served from it, nor its events kept.
		m.failed.Store(&err)
	}
}

// CloseWatch ends every watcher (their Err is ErrWatchCancelled) and
// refuses new ones: the store is closing.
func (m *Machine) CloseWatch() {
	if m.hub != nil {
		m.hub.close()
	}
}
