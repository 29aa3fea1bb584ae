package state

import (
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
)

// The machine's read side. Each read runs in its own read-only
// transaction, concurrently with the write side, and sees every published
// batch and nothing else. Arguments are checked by the caller (Options'
// Check methods). now is the reader's time, on the clock the leases were
// last re-armed on.

// Get reads key.
func (m *Machine) Get(key []byte) (Entry, error) {
	var e kv.Entry
	err := m.view(0, func(tx *kv.Tx, _ time.Duration) error {
		e = tx.Get(key)
		return nil
	})
	return entry(e), err
}

// GetFunc calls fn with the key's entry, as Get returns it, but without
// copying the value: Value is valid only until fn returns.
func (m *Machine) GetFunc(key []byte, fn func(Entry)) error {
	return m.view(0, func(tx *kv.Tx, _ time.Duration) error {
		fn(entry(tx.Peek(key)))
		return nil
	})
}

// Scan returns up to limit live keys that start with prefix, from start
// on, in byte order, stopping after about maxBytes.
func (m *Machine) Scan(prefix, start []byte, limit, maxBytes int) (items []Entry, more bool, err error) {
	err = m.view(0, func(tx *kv.Tx, _ time.Duration) error {
		es, mr := tx.Scan(prefix, start, limit, maxBytes)
		items = make([]Entry, len(es))
		for i, e := range es {
			items[i] = entry(e)
		}
		more = mr
		return nil
	})
	return items, more, err
}

// LockInfo describes the lock name at now.
func (m *Machine) LockInfo(now time.Duration, name string) (LockInfo, error) {
	var in LockInfo
	err := m.view(now, func(tx *kv.Tx, now time.Duration) error {
		var err error
		in, err = m.leases.Info(tx, now, name)
		return err
	})
	return in, err
}

// Locks lists up to limit locks held at now, from start, whose names
// start with prefix, stopping after about maxBytes.
func (m *Machine) Locks(now time.Duration, prefix, start string, limit, maxBytes int) (locks []LockInfo, more bool, err error) {
	err = m.view(now, func(tx *kv.Tx, now time.Duration) error {
		var err error
		locks, more, err = m.leases.List(tx, now, prefix, start, limit, maxBytes)
		return err
	})
	return locks, more, err
}

// Counters reads the store-wide counters: last token, revision, live
// keys, data size, leases held and callers queued, and the grants and
// expiries this machine applied since it was opened.
func (m *Machine) Counters() (Counters, error) {
	c := Counters{
		Locks:    m.leases.Held(),
		Waiters:  m.leases.TotalWaiting(),
		Grants:   m.granted.Load(),
		Expiries: m.expiries.Load(),
	}
	err := m.view(0, func(tx *kv.Tx, _ time.Duration) error {
		c.LastToken, c.Revision, c.Keys, c.DataSize = tx.LastToken(), tx.Revision(), tx.Keys(), tx.Size()
		return nil
	})
	return c, err
}

// Queues are the FIFO queues of callers waiting for locks (Waiters), one
// per lock, which each driver keeps for itself: in memory, never
// replicated (see lease.Queues).
type Queues = lease.Queues

// NewQueues returns empty queues.
func NewQueues() *Queues { return lease.NewQueues() }

// Waiter is a caller queued for a lock (FIFO per lock).
type Waiter = lease.Waiter

// NewWaiter returns a waiter for an acquire.
func NewWaiter(req LeaseRequest) *Waiter { return lease.NewWaiter(req) }

// SetQueues names the driver's queues of callers waiting for locks (a
// single node's, a cluster leader's: in memory, never replicated), so that
// LockInfo, Locks and Counters count them. Call it before serving.
func (m *Machine) SetQueues(q *Queues) { m.leases.SetQueues(q) }

// NextDue, DueLocks and Wake drive an expiry loop: NextDue is the earliest
// time a lease or lock-delay is due (and arms Wake for anything earlier),
// DueLocks names the locks due at now.
func (m *Machine) NextDue() (time.Duration, bool)               { return m.leases.Arm() }
func (m *Machine) DueLocks(now time.Duration, max int) []string { return m.leases.Due(now, max) }
func (m *Machine) Wake() <-chan struct{}                        { return m.leases.Wake() }
