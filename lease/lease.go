// Package lease is fencekv's lease manager: lock grants, renewals, releases,
// expiries and lock-delays, applied to lease records through the caller's
// storage transaction; the deadline index that says which lease is due next;
// and the FIFO queues of callers waiting to acquire (Queues, owned by the
// driver: the cluster's leader and the single node each keep their own).
//
// Time is passed in, never read: now is a point on the proposer's monotonic
// clock, as an offset from an epoch the proposer chose. The same calls with
// the same times leave the same records, so a replicated log can apply them.
//
// Threading: the apply-side methods (Acquire, Renew, Release, Check,
// Expire, Rearm, Load) are called by one goroutine at a time, the one
// that owns the engine's state machine. Arm, Due, Held, Wake, Info and List
// may be called from any goroutine, and so may every method of Queues.
package lease

import (
	"fmt"
	"sync"
	"time"

	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/kv"
)

// Store is the view of a storage transaction that leases use. *kv.Tx
// implements it.
type Store interface {
	NextToken() fence.Token
	Lock(name string) []byte // the store's record: decode it before the next write
	PutLock(name string, rec []byte) error
	DeleteLock(name string) error
	Locks(prefix, start []byte, fn func(name, rec []byte) bool)
}

var _ Store = (*kv.Tx)(nil)

// Request asks for a lock.
type Request struct {
	Name      string
	TTL       time.Duration
	Holder    string
	LockDelay time.Duration
	Limit     int // permits: 0 or 1 a plain lock, more a semaphore (semaphore.go)
}

// Grant is a granted lease.
type Grant struct {
	Token fence.Token
	TTL   time.Duration
	Free  int // a semaphore's permits still free after this grant (0 for a plain lock)
}

// Info describes a lock at one moment.
type Info struct {
	Name    string
	Held    bool
	Holder  string
	Token   fence.Token   // the holder's token, or the latest grant's if not held
	TTL     time.Duration // lease time left; 0 when not held, or when it ran out and its expiry is not applied yet (see Manager.Info)
	Delay   time.Duration // lock-delay left; 0 when none
	Waiters int
	Sem     *SemInfo // a semaphore's limit and live permits; nil for a plain lock (so Info stays comparable)
}

// Manager keeps the in-memory side of leases: the deadline index and the
// waiter queues. Records live in the store.
type Manager struct {
	mu     sync.Mutex // guards idx, held, armed, armedOK
	idx    *index
	held   int     // leases held as of the last applied command
	queues *Queues // the driver's, for the waiter counts (SetQueues); set before use

	// The time the expiry loop will look next, as it last said (Arm);
	// armedOK is false when it waits for nothing but a wake.
	armed   time.Duration
	armedOK bool
	wake    chan struct{} // gets a value when a due time comes before armed
}

// NewManager returns a Manager with empty indexes. Call Rearm before use on
// a store that may hold records.
func NewManager() *Manager {
	return &Manager{
		idx:  newIndex(),
		wake: make(chan struct{}, 1),
	}
}

// SetQueues names the queues of callers waiting for locks, which the
// driver owns, so that Info and TotalWaiting count them. Call it before
// the Manager is used.
func (m *Manager) SetQueues(q *Queues) { m.queues = q }

// waiters is the number of callers queued for name, by the driver's
// queues.
func (m *Manager) waiters(name string) int {
	if m.queues == nil {
		return 0
	}
	return m.queues.Waiting(name)
}

// TotalWaiting is the number of callers queued for all locks.
func (m *Manager) TotalWaiting() int {
	if m.queues == nil {
		return 0
	}
	return m.queues.Total()
}

// Wake returns a channel that receives when a lease or lock-delay becomes
// due before the time the expiry loop last armed (see Arm), or when it
// armed none. The expiry loop selects on it.
func (m *Manager) Wake() <-chan struct{} { return m.wake }

// Arm returns the earliest time at which a lease or lock-delay is due, for
// the expiry loop, which promises to look again then (or, if none, when
// woken): from then on, Wake receives only for a due time before it. A
// lock taken and released over and over so does not wake the loop each
// time, only when its timer comes.
func (m *Manager) Arm() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.armed, m.armedOK = m.idx.next()
	return m.armed, m.armedOK
}

// Due returns up to max lock names with a lease or lock-delay due at now.
func (m *Manager) Due(now time.Duration, max int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.idx.due(now, max)
}

// Held is the number of leases held (not expired, not released) as of the
// last applied command. A lease whose deadline passed counts until its
// expiry is applied.
func (m *Manager) Held() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held
}

func (m *Manager) setDue(name string, at time.Duration) {
	m.mu.Lock()
	m.idx.set(name, at)
	early := !m.armedOK || at < m.armed
	m.mu.Unlock()
	if early {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

func (m *Manager) unsetDue(name string) {
	m.mu.Lock()
	m.idx.remove(name)
	m.mu.Unlock()
}

func (m *Manager) addHeld(n int) {
	m.mu.Lock()
	m.held += n
	m.mu.Unlock()
}

func load(st Store, name string) (Record, bool, error) { return decode(name, st.Lock(name)) }

func decode(name string, raw []byte) (Record, bool, error) {
	if raw == nil {
		return Record{}, false, nil
	}
	r, err := unmarshal(raw)
	if err != nil {
		return Record{}, false, fmt.Errorf("lock %q: %w", name, err)
	}
	return r, true, nil
}

func store(st Store, name string, r *Record) error {
	return st.PutLock(name, r.marshal())
}

// Acquire grants the lock if it is free at now: not held by a live lease
// and not in lock-delay. The token is the next of the store-wide sequence.
// A refusal is fence.CodeLockHeld with the holder, its token and the time
// until the lock may be free, and changes nothing.
func (m *Manager) Acquire(st Store, now time.Duration, req Request) (Grant, error) {
	raw := st.Lock(req.Name)
	if req.Limit > 1 || isSem(raw) {
		return m.acquireSem(st, now, req, raw)
	}
	r, ok, err := decode(req.Name, raw)
	if err != nil {
		return Grant{}, err
	}
	wasHeld := ok && !r.Expired
	if ok {
		if r.held(now) {
			return Grant{}, &fence.Error{Code: fence.CodeLockHeld, Holder: r.Holder, Token: r.Token, RetryAfter: r.Deadline - now,
				Message: fmt.Sprintf("lock %q is held by token %d for %v more", req.Name, r.Token, (r.Deadline - now).Round(time.Millisecond))}
		}
		if end := r.delayEnd(); end > now {
			return Grant{}, &fence.Error{Code: fence.CodeLockHeld, RetryAfter: end - now,
				Message: fmt.Sprintf("lock %q is in lock-delay for %v more after token %d expired", req.Name, (end - now).Round(time.Millisecond), r.Token)}
		}
	}
	nr := Record{
		Token:     st.NextToken(),
		Holder:    req.Holder,
		TTL:       req.TTL,
		LockDelay: req.LockDelay,
		Deadline:  now + req.TTL,
	}
	if err := store(st, req.Name, &nr); err != nil {
		return Grant{}, err
	}
	if !wasHeld {
		m.addHeld(1)
	}
	m.setDue(req.Name, nr.Deadline)
	return Grant{Token: nr.Token, TTL: nr.TTL}, nil
}

// check is the holder check shared by renew, release and held writes.
func check(r Record, ok bool, name string, token fence.Token, now time.Duration) error {
	switch {
	case ok && r.Token == token && r.held(now):
		return nil
	case ok && r.Token == token:
		return &fence.Error{Code: fence.CodeLeaseExpired, Token: token,
			Message: fmt.Sprintf("the lease of token %d on lock %q has expired", token, name)}
	case ok && r.held(now):
		return &fence.Error{Code: fence.CodeNotHolder, Token: r.Token,
			Message: fmt.Sprintf("lock %q is held by token %d, not %d", name, r.Token, token)}
	default:
		return &fence.Error{Code: fence.CodeNotHolder,
			Message: fmt.Sprintf("lock %q is not held by token %d", name, token)}
	}
}

// Check reports whether name is held by exactly token at now (G4): nil, or
// fence.CodeNotHolder / fence.CodeLeaseExpired.
func (m *Manager) Check(st Store, now time.Duration, name string, token fence.Token) error {
	raw := st.Lock(name)
	if isSem(raw) {
		return m.checkSemRaw(name, raw, token, now)
	}
	r, ok, err := decode(name, raw)
	if err != nil {
		return err
	}
	return check(r, ok, name, token, now)
}

// Renew gives the lease of token on name its full TTL again, from now. It is
// idempotent: a retried renew only moves the deadline.
func (m *Manager) Renew(st Store, now time.Duration, name string, token fence.Token) (time.Duration, error) {
	raw := st.Lock(name)
	if isSem(raw) {
		return m.renewSem(st, now, name, raw, token)
	}
	r, ok, err := decode(name, raw)
	if err != nil {
		return 0, err
	}
	if err := check(r, ok, name, token, now); err != nil {
		return 0, err
	}
	r.Deadline = now + r.TTL
	if err := store(st, name, &r); err != nil {
		return 0, err
	}
	m.setDue(name, r.Deadline)
	return r.TTL, nil
}

// Release ends the lease of token on name. A clean release frees the lock
// at once, with no lock-delay. It reports nil or fence.CodeNotHolder /
// fence.CodeLeaseExpired, and on refusal changes nothing.
func (m *Manager) Release(st Store, now time.Duration, name string, token fence.Token) error {
	raw := st.Lock(name)
	if isSem(raw) {
		return m.releaseSem(st, now, name, raw, token)
	}
	r, ok, err := decode(name, raw)
	if err != nil {
		return err
	}
	if err := check(r, ok, name, token, now); err != nil {
		return err
	}
	if err := st.DeleteLock(name); err != nil {
		return err
	}
	m.addHeld(-1)
	m.unsetDue(name)
	return nil
}

// Expire applies what is due on name at now: a lease past its deadline
// expires (entering lock-delay if it asked for one), a lock-delay that has
// passed ends, and the record of an expired lock that has been free for
// Retention is deleted. It reports whether the lock became acquirable, so
// the caller can hand it to a waiter, and whether it changed the store at
// all (nothing is due more often than not: a command that changed nothing
// need not be logged). Until it is deleted, an expired
// lease's record tells its late holder lease_expired rather than
// not_holder.
func (m *Manager) Expire(st Store, now time.Duration, name string) (freed, changed bool, err error) {
	raw := st.Lock(name)
	if isSem(raw) {
		return m.expireSem(st, now, name, raw)
	}
	r, ok, err := decode(name, raw)
	if err != nil || !ok {
		m.unsetDue(name)
		return false, false, err
	}
	switch {
	case !r.Expired && now < r.Deadline:
		m.setDue(name, r.Deadline) // renewed since it was indexed
		return false, false, nil
	case !r.Expired:
		r.DelayUntil = r.delayEnd()
		r.Expired = true
		m.addHeld(-1)
	case r.DelayUntil != 0 && now < r.DelayUntil:
		m.setDue(name, r.DelayUntil)
		return false, false, nil
	case r.DelayUntil == 0:
		// Expired and free: forget it when its retention has passed.
		if now < r.ForgetAt {
			m.setDue(name, r.ForgetAt)
			return false, false, nil
		}
		m.unsetDue(name)
		return false, true, st.DeleteLock(name)
	}
	if r.DelayUntil != 0 && now >= r.DelayUntil {
		r.DelayUntil = 0
	}
	if r.DelayUntil == 0 {
		r.ForgetAt = now + Retention
		freed = true
	}
	if err := store(st, name, &r); err != nil {
		return false, false, err
	}
	if freed {
		m.setDue(name, r.ForgetAt)
	} else {
		m.setDue(name, r.DelayUntil)
	}
	return freed, true, nil
}

// Rearm gives every live lease its full TTL from now, and every lock in
// lock-delay its full delay from now, and every expired record its full
// Retention (G7: a failure may extend a lease, never shorten it). It
// rebuilds the deadline index and the held count. The engine applies it as
// a command (logged, and in a cluster replicated) when a store is opened
// and when a node becomes leader.
func (m *Manager) Rearm(st Store, now time.Duration) error {
	type change struct {
		name string
		rec  Record
		sem  *semRecord
	}
	var changes []change
	err := each(st, func(name string, r Record, s *semRecord) {
		if s != nil {
			rearmSem(s, now)
			changes = append(changes, change{name: name, sem: s})
			return
		}
		switch {
		case !r.Expired:
			r.Deadline = now + r.TTL
		case r.DelayUntil != 0:
			r.DelayUntil = now + r.LockDelay
		default:
			r.ForgetAt = now + Retention
		}
		changes = append(changes, change{name: name, rec: r})
	})
	if err != nil {
		return err
	}
	m.reset()
	for _, c := range changes {
		if c.sem != nil {
			if err := m.saveSem(st, c.name, c.sem); err != nil {
				return err
			}
			m.addHeld(c.sem.live())
			continue
		}
		if err := store(st, c.name, &c.rec); err != nil {
			return err
		}
		m.index(c.name, &c.rec)
	}
	return nil
}

// Load rebuilds the deadline index and the held count from the records as
// they are, changing nothing. Called when a state machine is opened or
// restored, before it applies anything.
func (m *Manager) Load(st Store) error {
	m.reset()
	return each(st, func(name string, r Record, s *semRecord) {
		if s != nil {
			m.indexSem(name, s)
		} else {
			m.index(name, &r)
		}
	})
}

// each calls fn for every lock record, in name order: a plain lock's r,
// or a semaphore's s.
func each(st Store, fn func(name string, r Record, s *semRecord)) error {
	var bad error
	st.Locks(nil, nil, func(name, raw []byte) bool {
		if isSem(raw) {
			s, err := loadSem(string(name), raw)
			if err != nil {
				bad = err
				return false
			}
			fn(string(name), Record{}, &s)
			return true
		}
		r, err := unmarshal(raw)
		if err != nil {
			bad = fmt.Errorf("lock %q: %w", name, err)
			return false
		}
		fn(string(name), r, nil)
		return true
	})
	return bad
}

func (m *Manager) reset() {
	m.mu.Lock()
	m.idx = newIndex()
	m.held = 0
	m.mu.Unlock()
}

// index puts a record's next due time in the index, and counts it if held.
func (m *Manager) index(name string, r *Record) {
	switch {
	case r.Expired && r.DelayUntil != 0:
		m.setDue(name, r.DelayUntil)
	case r.Expired:
		m.setDue(name, r.ForgetAt)
	default:
		m.addHeld(1)
		m.setDue(name, r.Deadline)
	}
}

// Lease returns the lock's record as stored, and whether there is one.
// A semaphore's record is reported as none (its permits are described by
// Info).
func (m *Manager) Lease(st Store, name string) (Record, bool, error) {
	raw := st.Lock(name)
	if isSem(raw) {
		return Record{}, false, nil
	}
	return decode(name, raw)
}

// Info describes the lock name at now, as of the last applied command. A
// lease whose deadline has passed is reported held (TTL 0) until its
// expiry is applied, and a lock-delay that has run out lasts (minDelayLeft)
// until its end is: until then a restart or a new leader would give the
// lease its full TTL, or the lock-delay its full length, again (Rearm), so
// reporting them over sooner could be undone. The expiry loop applies both
// within milliseconds. Info reads only, so it may run in a read-only
// transaction concurrently with the batch leader.
func (m *Manager) Info(st Store, now time.Duration, name string) (Info, error) {
	raw := st.Lock(name)
	if isSem(raw) {
		s, err := loadSem(name, raw)
		if err != nil {
			return Info{}, err
		}
		return m.infoSem(name, &s, now), nil
	}
	r, ok, err := decode(name, raw)
	if err != nil {
		return Info{}, err
	}
	return m.info(name, r, ok, now), nil
}

func (m *Manager) info(name string, r Record, ok bool, now time.Duration) Info {
	in := Info{Name: name, Waiters: m.waiters(name)}
	if !ok {
		return in
	}
	in.Token = r.Token
	switch {
	case !r.Expired:
		in.Held = true
		in.Holder = r.Holder
		in.TTL = max(r.Deadline-now, 0)
	case r.DelayUntil != 0:
		in.Delay = max(r.DelayUntil-now, minDelayLeft)
	}
	return in
}

// minDelayLeft is the lock-delay reported for a lock whose lock-delay has
// run out but whose end is not applied yet.
const minDelayLeft = time.Millisecond

// ExpiryPending reports whether the lock as described has something due
// that is not applied yet: a lease that ran out (held, no time left) or a
// lock-delay that ended. (A lock-delay with exactly minDelayLeft left
// counts too; applying what is due then changes nothing.)
func (in Info) ExpiryPending() bool {
	if in.Sem != nil {
		for _, h := range in.Sem.Holders {
			if h.TTL <= 0 {
				return true
			}
		}
	}
	return in.Held && in.TTL <= 0 || !in.Held && in.Delay > 0 && in.Delay <= minDelayLeft
}

// List describes up to limit locks held at now (as Info counts them) whose names start with
// prefix, in byte order of their names, starting at start. It stops early,
// with more set, once the names and holders listed add up to maxBytes (at
// least one lock is listed), so that one answer stays small however long
// the names are.
func (m *Manager) List(st Store, now time.Duration, prefix, start string, limit, maxBytes int) (out []Info, more bool, err error) {
	size := 0
	st.Locks([]byte(prefix), []byte(start), func(name, raw []byte) bool {
		if isSem(raw) {
			s, e := loadSem(string(name), raw)
			if e != nil {
				err = e
				return false
			}
			if s.live() == 0 {
				return true
			}
			n := len(name)
			for _, p := range s.Permits {
				n += len(p.Holder)
			}
			if len(out) == limit || (len(out) > 0 && size+n > maxBytes) {
				more = true
				return false
			}
			size += n
			out = append(out, m.infoSem(string(name), &s, now))
			return true
		}
		r, e := unmarshal(raw)
		if e != nil {
			err = fmt.Errorf("lock %q: %w", name, e)
			return false
		}
		if r.Expired {
			return true
		}
		n := len(name) + len(r.Holder)
		if len(out) == limit || (len(out) > 0 && size+n > maxBytes) {
			more = true
			return false
		}
		size += n
		out = append(out, m.info(string(name), r, true, now))
		return true
	})
	return out, more, err
}
