package state

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
)

// Machine is fencekv's state machine: the data file (keys, fences,
// revisions, the token sequence) and the leases, changed only by Apply,
// one Command after another (G5). A log drives it: the single node's
// write-ahead log (see DB), or a replicated log in a cluster, whose FSM
// applies each committed entry's commands.
//
// Apply is deterministic in (state, command): time and term are fields of
// the command, set by the node that proposed it. Applying the same commands
// in the same order gives the same state on every node and on replay.
//
// Batches: Apply works on one open bbolt transaction that spans many
// commands. Publish(index) ends a batch: its changes become visible to
// readers and index becomes Applied. Call it only once the batch is durable
// (the single node: after its log record is synced; a cluster: raft
// commits before it applies). Checkpoint writes everything published to
// the data file with the applied index, so a reopened machine knows which
// log entries it still has to apply.
//
// Failure: a command that fails in the storage (an I/O error, a damaged
// page) or panics fails the machine: the open batch is discarded (nothing
// of it is visible), and every later Apply returns the same error. What
// was published stays readable. A failed machine recovers only by being
// reopened (the log replays what the data file lacks).
//
// Threading: one goroutine at a time owns the write side (Apply, Publish,
// Checkpoint, Snapshot, Restore, Close): the single node's batch leader,
// or raft's FSM goroutine. View runs concurrently with it, from any
// goroutine.
type Machine struct {
	path   string
	smu    sync.RWMutex // guards store against Restore for readers (the write side swaps it itself)
	store  *kv.Store
	leases *lease.Manager
	opts   kv.Options

	applied uint64                // the last log index published
	term    uint64                // the term of the last rearm: expiries from an older term are ignored
	failed  atomic.Pointer[error] // set when a command failed in the storage or panicked (read from any goroutine: Failed)

	// Counted as commands are applied (replayed ones too), for metrics.
	granted  atomic.Uint64 // acquires granted
	expiries atomic.Uint64 // leases that ran out (an expire that ended a held lease)

	// hook, if set (by tests), runs before each command is applied; a
	// panic in it is a panic in apply.
	hook func(*Command)

	// sink, if set, receives the events of each published batch, in
	// order (watch.go); events holds the open batch's.
	sink   func([]Event) (kept bool)
	events []Event
	hub    *hub     // watchers and the history window; nil until EnableWatch
	hist   *durable // the data file's watch history (history.go); nil until EnableWatch

	gmu    sync.Mutex        // guards grants and order (the refusal log reads them)
	grants map[Token]grantee // the latest grants: token -> lock and holder
	order  [maxGrants]Token  // grants' tokens, oldest first from gnext (a ring)
	gnext  int
}

// grantee is whom a token was granted to.
type grantee struct{ lock, holder string }

// maxGrants is how many grants the machine remembers for the refusal log.
const maxGrants = 1 << 14

// noteGrant remembers whom token was granted to.
func (m *Machine) noteGrant(t Token, lock, holder string) {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	if m.grants == nil {
		m.grants = make(map[Token]grantee)
	}
	delete(m.grants, m.order[m.gnext])
	m.order[m.gnext] = t
	m.gnext = (m.gnext + 1) % maxGrants
	m.grants[t] = grantee{lock, holder}
}

// Grantee returns the lock and holder name token t was granted to, if the
// machine still remembers (the latest grants since it was opened).
func (m *Machine) Grantee(t Token) (lock, holder string, ok bool) {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	g, ok := m.grants[t]
	return g.lock, g.holder, ok
}

// Path is the data file's path.
func (m *Machine) Path() string { return m.path }

// SetApplyHook makes fn run before each command is applied, a panic in it
// being a panic in apply: fault injection, for the tests of a driver. Set
// it while no command is being applied.
func (m *Machine) SetApplyHook(fn func(*Command)) { m.hook = fn }

// OpenMachine opens (or creates) the data file at path and rebuilds the
// lease index from it. Applied reports the last log index the file holds.
func OpenMachine(path string, noSync bool) (*Machine, error) {
	m := &Machine{path: path, opts: kv.Options{NoSync: noSync}, leases: lease.NewManager()}
	if err := m.open(); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Machine) open() error {
	store, err := kv.Open(m.path, m.opts)
	if err != nil {
		return err
	}
	marks, err := store.Marks()
	if err == nil {
		err = store.View(func(tx *kv.Tx) error { return m.leases.Load(tx) })
	}
	if err != nil {
		store.Close()
		return fmt.Errorf("fencekv: open %s: %w", m.path, err)
	}
	m.store, m.applied, m.term = store, marks.Applied, marks.Term
	m.failed.Store(nil)
	return nil
}

// LogUpgrade logs, once, what opening did to a data file of an older
// schema (an upgrade cannot be undone: older binaries refuse the file).
func (m *Machine) LogUpgrade(log *slog.Logger) {
	if u := m.store.Upgrade(); u.From != 0 {
		log.Info("upgraded the data file's schema", "file", m.path, "from", u.From, "to", u.To, "tombstones_moved", u.Tombstones)
	}
}

// Applied is the log index of the last published batch.
func (m *Machine) Applied() uint64 { return m.applied }

// Term is the term of the last rearm applied.
func (m *Machine) Term() uint64 { return m.term }

// Failed returns the error that failed the machine, or nil. Any
// goroutine may call it.
func (m *Machine) Failed() error {
	if err := m.failed.Load(); err != nil {
		return *err
	}
	return nil
}

// Apply applies c to the open batch and returns its result: a refusal is
// Result.Err, and changes nothing. err is not nil when the machine failed
// (now or before): then nothing of the open batch will ever be visible,
// and the caller must fail the whole batch.
func (m *Machine) Apply(c *Command) (res Result, err error) {
	if err := m.Failed(); err != nil {
		return Result{}, err
	}
	defer func() {
		if p := recover(); p != nil {
			err = m.fail(fmt.Errorf("fencekv: applying %v: %w", c.Op, &PanicError{p, debug.Stack()}))
		}
	}()
	tx, err := m.store.Writer()
	if err != nil {
		return Result{}, m.fail(err)
	}
	if m.hook != nil {
		m.hook(c)
	}
	res = m.apply(tx, c)
	if res.Err != nil && !isRefusal(res.Err) {
		return Result{}, m.fail(fmt.Errorf("fencekv: applying %v: %w", c.Op, res.Err))
	}
	return res, nil
}

// fail discards the open batch and fails the machine with err.
func (m *Machine) fail(err error) error {
	m.store.Abort()
	m.events = m.events[:0]
	m.failed.Store(&err)
	return err
}

// Fail fails the machine from outside: the caller could not make the open
// batch durable (its log failed). The batch is discarded.
func (m *Machine) Fail(err error) {
	if m.Failed() == nil {
		m.fail(err)
	}
}

// written converts a write's storage entry.
func written(e kv.Entry, err error) (Entry, error) { return entry(e), err }

func isRefusal(err error) bool {
	var e *fence.Error
	return errors.As(err, &e)
}

// apply is the state machine's one transition function. A refused
// command changes nothing: every check comes before the first write.
func (m *Machine) apply(tx *kv.Tx, c *Command) (r Result) {
	var expired Token
	defer func() { m.recordEvents(tx, c, &r, expired) }()
	leases := m.leases
	if c.Term != 0 && c.Term < m.term && c.Op != OpExpire {
		// A cluster leader's command from a term older than the last
		// rearm: its leader went on stamping its old term (and its own
		// clock, c.Now) for a moment after it lost the leadership, and
		// won it back before its own rearm. Leases have since been
		// re-armed on another leader's clock, against which c.Now means
		// nothing: refused on every node alike. (A single node's
		// commands carry no term. An old expiry is a no-op, below.)
		r.Err = fence.Errorf(fence.CodeUnavailable, "proposed by the leader of term %d after a leader of term %d took over; not applied: retry", c.Term, m.term)
		return r
	}
	switch c.Op {
	case OpPut, OpDelete, OpCAS, OpIncr, OpTxn:
		if c.Lock != "" {
			if err := leases.Check(tx, c.Now, c.Lock, c.Write.Token); err != nil {
				r.Err = err
				return r
			}
		}
	}
	switch c.Op {
	case OpPut:
		r.Entry, r.Err = written(tx.Put(c.Key, c.Value, c.Write))
	case OpDelete:
		var e kv.Entry
		r.Deleted, e, r.Err = tx.Delete(c.Key, c.Write)
		r.Entry = entry(e)
	case OpCAS:
		r.Entry, r.Err = written(tx.CAS(c.Key, c.Revision, c.Value, c.Write))
	case OpIncr:
		var e kv.Entry
		r.Int, e, r.Err = tx.Incr(c.Key, c.Delta, c.Write)
		r.Entry = entry(e)
	case OpAcquire:
		r.Grant, r.Err = leases.Acquire(tx, c.Now, c.Lease)
		if r.Err == nil {
			m.noteGrant(r.Grant.Token, c.Lease.Name, c.Lease.Holder)
			m.granted.Add(1)
			r.Freed = r.Grant.Free > 0 // a semaphore with permits left: hand them to waiters
		}
	case OpRenew:
		r.TTL, r.Err = leases.Renew(tx, c.Now, c.Lease.Name, c.Token)
	case OpRelease:
		r.Err = leases.Release(tx, c.Now, c.Lease.Name, c.Token)
		r.Freed = r.Err == nil
	case OpExpire:
		if c.Term < m.term {
			// Proposed by a leader of an older term, against deadlines
			// a newer leader has since re-armed on its own clock.
			r.Noop = true
			return r
		}
		before, live, err := leases.Lease(tx, c.Lease.Name)
		if err != nil {
			r.Err = err
			return r
		}
		var changed bool
		held := leases.Held()
		r.Freed, changed, r.Err = leases.Expire(tx, c.Now, c.Lease.Name)
		r.Noop = !changed
		if changed && live && !before.Expired {
			expired = before.Token // the lease ran out now
		}
		if leases.Held() < held {
			m.expiries.Add(1)
		}
	case OpTxn:
		r.Txn, r.Err = applyTxn(tx, c)
	case OpRearm:
		tx.RaiseToken(c.Token)
		r.Err = leases.Rearm(tx, c.Now)
		if r.Err == nil {
			m.term = max(m.term, c.Term)
		}
	default:
		r.Err = fence.Errorf(fence.CodeBadRequest, "unknown command %d", c.Op)
	}
	return r
}

// Publish ends the batch at log index: what it applied becomes visible to
// readers. Call it only once the batch is durable.
func (m *Machine) Publish(index uint64) {
	if m.Failed() != nil {
		return
	}
	if m.keepEvents() != nil {
		return
	}
	m.store.Publish()
	m.applied = max(m.applied, index)
	if len(m.events) > 0 {
		if m.sink(m.events) {
			m.events = nil // the watchers have it
		} else {
			clear(m.events)
			m.events = m.events[:0]
		}
	}
}

// Checkpoint writes every published batch to the data file, with the
// applied index and term, and syncs it. Call it between batches.
func (m *Machine) Checkpoint() error {
	if err := m.Failed(); err != nil {
		return err
	}
	if err := m.store.Checkpoint(kv.Marks{Applied: m.applied, Term: m.term}); err != nil {
		return m.fail(fmt.Errorf("fencekv: checkpoint: %w", err))
	}
	if m.hist != nil {
		m.hist.committed()
	}
	return nil
}

// Snapshot checkpoints, then returns a consistent copy of the state as of
// Applied. Its WriteTo may run concurrently with later batches; Close it
// when done.
func (m *Machine) Snapshot() (*Snapshot, error) {
	if err := m.Checkpoint(); err != nil {
		return nil, err
	}
	s, err := m.store.Snapshot()
	if err != nil {
		return nil, err
	}
	return &Snapshot{Index: m.applied, Term: m.term, snap: s}, nil
}

// FileSnapshot is a consistent copy of the data file as it is now,
// without a checkpoint first: it holds what was applied up to the last
// Checkpoint (its Index and Term are left 0). Any goroutine may call it,
// while the machine's owner goes on applying; Restore waits for it to be
// closed.
func (m *Machine) FileSnapshot() (*Snapshot, error) {
	m.smu.RLock()
	defer m.smu.RUnlock()
	s, err := m.store.Snapshot()
	if err != nil {
		return nil, err
	}
	return &Snapshot{snap: s}, nil
}

// Snapshot is a consistent copy of a Machine's state.
type Snapshot struct {
	Index uint64 // the last log index it reflects
	Term  uint64 // the machine's term then
	snap  *kv.Snapshot
}

// Size is the snapshot's length in bytes.
func (s *Snapshot) Size() int64 { return s.snap.Size() }

// WriteTo writes the snapshot (a complete data file) to w.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) { return s.snap.WriteTo(w) }

// Close releases the snapshot.
func (s *Snapshot) Close() error { return s.snap.Close() }

// Restore replaces the machine's whole state with a snapshot read from r
// (as Snapshot.WriteTo wrote it). A damaged or truncated snapshot is
// refused, and the machine keeps its state. On success Applied and Term
// are the snapshot's.
func (m *Machine) Restore(r io.Reader) error {
	if m.Failed() == nil {
		// Keep what was published if the snapshot is refused.
		if err := m.Checkpoint(); err != nil {
			return err
		}
	}
	err := m.restore(r)
	m.resetWatch()
	return err
}

func (m *Machine) restore(r io.Reader) error {
	m.smu.Lock()
	defer m.smu.Unlock()
	m.store.Abort()
	if err := m.store.Close(); err != nil {
		return err
	}
	rerr := kv.Restore(m.path, r)
	if err := m.open(); err != nil {
		// The data file could not be opened again: the machine is
		// failed, and reads fail too.
		failed := errors.Join(rerr, err)
		m.failed.Store(&failed)
		return failed
	}
	return rerr
}

// Close closes the data file, discarding what was not checkpointed.
func (m *Machine) Close() error { return m.store.Close() }

// view runs fn in a read-only transaction; now is the reader's time. It
// sees every published batch and nothing else.
func (m *Machine) view(now time.Duration, fn func(tx *kv.Tx, now time.Duration) error) error {
	m.smu.RLock()
	defer m.smu.RUnlock()
	began := false
	err := m.store.View(func(tx *kv.Tx) error {
		began = true
		return fn(tx, now)
	})
	if err != nil && !began {
		return fence.Errorf(fence.CodeUnavailable, "%v", err)
	}
	return err
}
