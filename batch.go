package fencekv

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/fencekv/fencekv/lease"
	"github.com/fencekv/fencekv/state"
)

// Group commit without a commit goroutine: the goroutines that submit
// commands take turns as the batch leader. A submitter that finds no
// leader becomes it: it takes every command waiting (its own among them)
// as one batch, applies it in one transaction, makes it durable with one
// log sync, answers the batch, then hands the lead to the oldest command
// still waiting, whose submitter commits the next batch. The batch size
// follows the load, with no timer: while one batch syncs, the next
// gathers. A lone caller commits its own command, with no goroutine switch.

// request is a command on its way to be applied.
type request struct {
	cmd    state.Command
	wait   time.Duration // acquire: queue for the lock this long if it is held
	res    state.Result
	waiter *lease.Waiter // set by the leader when the acquire was queued
	lead   bool          // set (with qmu held) before done receives, to make the submitter the leader
	done   chan struct{} // receives once res (and waiter) are set, or lead is
	// turn, if set, makes the request no command but a function the
	// leader runs between batches, alone (see inTurn); res.Err is its error.
	turn func() error
	// then, if set, makes the request asynchronous (Start): nobody waits on
	// done; the leader calls then with the result, after passing the lead.
	then func(state.Result)
	// noteCtx, set for a started key write, is its caller's context: a
	// refusal goes to the refusal log with it, as DB.write does.
	noteCtx context.Context
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

func newRequest(c state.Command) *request {
	r := requestPool.Get().(*request)
	r.cmd = c
	return r
}

// answer wakes r's submitter, once r.res is set; an asynchronous request
// is answered by the leader after the batch (lead).
func (r *request) answer() {
	if r.then == nil {
		r.done <- struct{}{}
	}
}

func (r *request) free() {
	*r = request{done: r.done}
	requestPool.Put(r)
}

// exec runs one command. If ctx ends before a batch takes the command, it
// is withdrawn, nothing is applied, and the result is ctx's error; once a
// batch has it, the result is what the batch did.
func (db *DB) exec(ctx context.Context, c state.Command) state.Result {
	r := newRequest(c)
	defer r.free()
	if err := db.submit(ctx, r); err != nil {
		return state.Result{Err: err}
	}
	return r.res
}

// submit queues the requests together and waits for all of them. It
// returns ctx's error if ctx ended before a batch took them (then none was
// applied), and errClosed after Close.
func (db *DB) submit(ctx context.Context, rs ...*request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	db.qmu.Lock()
	if db.closed {
		db.qmu.Unlock()
		return errClosed
	}
	db.pending = append(db.pending, rs...)
	lead := !db.leading
	db.leading = true
	db.qmu.Unlock()
	if lead {
		db.lead()
	}
	var err error
	for _, r := range rs {
		if e := db.await(ctx, r); e != nil {
			err = e
		}
	}
	return err
}

// await waits for r's outcome, leading a batch when it is handed the lead.
func (db *DB) await(ctx context.Context, r *request) error {
	for {
		select {
		case <-r.done:
		case <-ctx.Done():
			if db.withdraw(r) {
				return ctx.Err()
			}
			<-r.done
		}
		if !r.lead {
			return nil
		}
		r.lead = false
		db.lead()
	}
}

// withdraw takes r out of the queue if no batch has taken it and it has
// not been handed the lead. It reports whether it did.
func (db *DB) withdraw(r *request) bool {
	db.qmu.Lock()
	defer db.qmu.Unlock()
	if r.lead {
		return false
	}
	i := slices.Index(db.pending, r)
	if i < 0 {
		return false
	}
	db.pending = slices.Delete(db.pending, i, i+1)
	return true
}

// lead commits one batch, then passes the lead on (or gives it up). Only
// the leader calls it, so commitBatch and the state it owns are used by one
// goroutine at a time; qmu and the done channels order the turns.
// commitBatch never panics (it recovers and fails the batch), so the lead
// is always passed on.
func (db *DB) lead() {
	if db.gather {
		// Under load, let the goroutines that are ready run first: those
		// parsing requests submit them, and they join this batch. It is
		// not a timer: it costs a lone caller nothing (gather is false
		// after a batch of one), and at 64 clients it took batches from
		// about 18 commands to 25 and the server's CPU per request down
		// by about 5%.
		runtime.Gosched()
	}
	db.commitNext()
}

// commitNext is lead without the yield: it commits the next batch and
// passes the lead on.
func (db *DB) commitNext() {
	db.qmu.Lock()
	n, size := 0, 0
	for n < len(db.pending) && n < db.opts.MaxBatch && size < maxBatchBytes {
		if db.pending[n].turn != nil {
			if n == 0 {
				n = 1 // a turn is a batch of its own
			}
			break
		}
		size += db.pending[n].cmd.Bytes()
		n++
	}
	db.batch = append(db.batch[:0], db.pending[:n]...)
	rest := copy(db.pending, db.pending[n:])
	clear(db.pending[rest:])
	db.pending = db.pending[:rest]
	db.qmu.Unlock()

	db.gather = len(db.batch) > 1
	// Noted before the commit: once answered, a waiting submitter frees
	// its request. A slice of its own per batch: the last leader may
	// still be answering its batch.
	var async []*request
	for _, r := range db.batch {
		if r.then != nil {
			async = append(async, r)
		}
	}
	switch {
	case len(db.batch) == 1 && db.batch[0].turn != nil:
		r := db.batch[0]
		r.res = state.Result{Err: state.Safely(r.turn)}
		r.done <- struct{}{}
	case len(db.batch) > 0:
		db.commitBatch(db.batch)
	}
	// The asynchronous requests are answered after the lead is passed on,
	// so that the next batch is applied and synced while their answers
	// are written.
	clear(db.batch)

	if len(async) > 0 {
		// Still the leader: Close, which waits for the lead to end
		// before it waits for answering, cannot have begun waiting.
		db.answering.Add(1)
		defer db.answering.Done()
	}
	db.qmu.Lock()
	if len(db.pending) == 0 {
		db.leading = false
		db.qidle.Broadcast()
		db.qmu.Unlock()
	} else {
		next := db.pending[0]
		if next.then != nil {
			db.qmu.Unlock()
			db.kickCommitter()
		} else {
			next.lead = true
			db.qmu.Unlock()
			next.done <- struct{}{}
		}
	}
	for _, r := range async {
		if r.noteCtx != nil && r.res.Err != nil {
			db.refusals.Note(r.noteCtx, &r.cmd, r.res.Err, db.m.Grantee)
		}
		then, res := r.then, r.res
		r.free()
		then(res)
	}
}

// Start submits a write without waiting for it: what Put, Delete, CAS,
// Incr, Renew, Release, or Acquire without a wait do, given as the command
// c (Op, Key, Value, Revision, Delta; Lease for the lock methods, Token for
// renew and release) with w's fencing for the key writes. Start returns at
// once; then is called exactly once with the command's result (Err is its
// refusal), once it is durable or refused, or at once if c is not valid.
// then runs on the goroutine that committed the batch, after it handed
// the lead on: it must be quick and must not wait for the DB. ctx carries
// what the waiting methods' contexts carry (the client's address, for the
// refusal log); it cannot withdraw the command.
//
// Start is for servers that answer many clients from few goroutines: a
// write costs them no goroutine that waits. A committer goroutine leads
// its batch; StartLed lets the caller lead instead (the wire event loop).
func (db *DB) Start(ctx context.Context, c state.Command, w WriteOptions, then func(state.Result)) {
	if db.start(ctx, c, w, then) {
		db.kickCommitter()
	}
}

// StartLed is Start for a caller that commits batches itself, as an event
// loop may at the end of a round: when no batch is being committed or
// queued, the caller is made the leader (instead of a committer goroutine
// being woken) and must then call Lead or PassLead soon, since the write,
// and every write queued after it, waits for that. It reports whether it
// must. Until it does, further writes are queued behind the lead without
// waking anyone: a caller that starts several writes and then leads
// commits them in one batch, with no goroutine hand-off at all.
func (db *DB) StartLed(ctx context.Context, c state.Command, w WriteOptions, then func(state.Result)) bool {
	return db.start(ctx, c, w, then)
}

// Direct returns db itself. A server asks an engine for it before taking
// the store's direct paths (StartLed, GetFunc), which bypass the Engine
// methods: a type that embeds a *DB to change what those methods do
// inherits Direct too, but answers with the embedded DB, not itself, so
// the server knows to call the wrapper's own methods instead.
func (db *DB) Direct() any { return db }

// Lead commits a batch of the queued writes on the calling goroutine, as
// the leader StartLed made it, answers the batch's started writes (their
// callbacks run here), and passes the lead on: to a committer goroutine if
// writes are still queued.
func (db *DB) Lead() { db.commitNext() }

// PassLead hands the lead StartLed gave the caller to a committer
// goroutine.
func (db *DB) PassLead() { db.kickCommitter() }

// start queues a started write; it reports whether the caller was made
// the leader.
func (db *DB) start(ctx context.Context, c state.Command, w WriteOptions, then func(state.Result)) bool {
	var err error
	switch c.Op {
	case state.OpPut, state.OpDelete, state.OpCAS, state.OpIncr:
		err = db.opts.CheckWrite(c.Key, c.Value, w)
		c.Write, c.Lock = w.kv(), w.Lock
	case state.OpRenew, state.OpRelease:
		err = db.opts.CheckName(c.Lease.Name)
	case state.OpAcquire:
		err = db.opts.CheckAcquire(c.Lease.Name, c.Lease.TTL, AcquireOptions{Holder: c.Lease.Holder, LockDelay: c.Lease.LockDelay, Limit: c.Lease.Limit})
	default:
		err = errorf(CodeBadRequest, "Start: op %v cannot be started", c.Op)
	}
	if err != nil {
		then(state.Result{Err: err})
		return false
	}
	r := newRequest(c)
	r.then = then
	if c.Op == state.OpPut || c.Op == state.OpDelete || c.Op == state.OpCAS || c.Op == state.OpIncr {
		r.noteCtx = ctx
	}
	db.qmu.Lock()
	if db.closed {
		db.qmu.Unlock()
		r.free()
		then(state.Result{Err: errClosed})
		return false
	}
	db.pending = append(db.pending, r)
	lead := !db.leading
	db.leading = true
	db.qmu.Unlock()
	return lead
}

// kickCommitter has a committer goroutine lead: an idle one, or a new one.
// Committers lead for asynchronous requests, which have no goroutine of
// their own to; they outlive their turn, because a new goroutine's stack
// grows by copying on the commit path.
func (db *DB) kickCommitter() {
	select {
	case db.commit <- struct{}{}:
	default:
		// A leader is kicking, so Close has not begun waiting for db.wg.
		db.wg.Go(db.committer)
	}
}

// maxIdleCommitters is the most committer goroutines kept waiting.
const maxIdleCommitters = 4

func (db *DB) committer() {
	for {
		db.lead()
		if db.idleCommitters.Add(1) > maxIdleCommitters {
			db.idleCommitters.Add(-1)
			return
		}
		select {
		case <-db.commit:
			db.idleCommitters.Add(-1)
		case <-db.stop:
			db.idleCommitters.Add(-1)
			return
		}
	}
}

// inTurn runs fn in the batch leader's turn, between two batches, when it
// alone may use the machine's write side (to checkpoint, or take a
// snapshot): every command acknowledged before the call is applied and
// published then. Its error is fn's, or ctx's if ctx ended before its turn
// came (then fn did not run).
func (db *DB) inTurn(ctx context.Context, fn func() error) error {
	r := newRequest(state.Command{})
	r.turn = fn
	defer r.free()
	if err := db.submit(ctx, r); err != nil {
		return err
	}
	return r.res.Err
}

// maxBatchBytes bounds the keys and values of one batch (a transaction's
// ops counted), and so the size of its log record: a batch takes commands
// while it holds less, so its record is at most this plus one command
// (state.MaxCommandBytes, Options.validate) plus the commands' headers, well
// within wal.MaxRecord. A record over that would fail the store.
const maxBatchBytes = 32 << 20
