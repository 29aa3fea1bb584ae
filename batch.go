package fencekv

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/fencekv/fencekv/lease"
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
	cmd    Command
	wait   time.Duration // acquire: queue for the lock this long if it is held
	res    Result
	waiter *lease.Waiter // set by the leader when the acquire was queued
	lead   bool          // set (with qmu held) before done receives, to make the submitter the leader
	done   chan struct{} // receives once res (and waiter) are set, or lead is
	// turn, if set, makes the request no command but a function the
	// leader runs between batches, alone (see inTurn); res.Err is its error.
	turn func() error
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

func newRequest(c Command) *request {
	r := requestPool.Get().(*request)
	r.cmd = c
	return r
}

func (r *request) free() {
	*r = request{done: r.done}
	requestPool.Put(r)
}

// exec runs one command. If ctx ends before a batch takes the command, it
// is withdrawn, nothing is applied, and the result is ctx's error; once a
// batch has it, the result is what the batch did.
func (db *DB) exec(ctx context.Context, c Command) Result {
	r := newRequest(c)
	defer r.free()
	if err := db.submit(ctx, r); err != nil {
		return Result{Err: err}
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
	db.qmu.Lock()
	n, size := 0, 0
	for n < len(db.pending) && n < db.opts.MaxBatch && size < maxBatchBytes {
		if db.pending[n].turn != nil {
			if n == 0 {
				n = 1 // a turn is a batch of its own
			}
			break
		}
		size += len(db.pending[n].cmd.Key) + len(db.pending[n].cmd.Value)
		n++
	}
	db.batch = append(db.batch[:0], db.pending[:n]...)
	rest := copy(db.pending, db.pending[n:])
	clear(db.pending[rest:])
	db.pending = db.pending[:rest]
	db.qmu.Unlock()

	db.gather = len(db.batch) > 1
	switch {
	case len(db.batch) == 1 && db.batch[0].turn != nil:
		r := db.batch[0]
		r.res = Result{Err: safely(r.turn)}
		r.done <- struct{}{}
	case len(db.batch) > 0:
		db.commitBatch(db.batch)
	}
	clear(db.batch)

	db.qmu.Lock()
	if len(db.pending) == 0 {
		db.leading = false
		db.qidle.Broadcast()
		db.qmu.Unlock()
		return
	}
	next := db.pending[0]
	next.lead = true
	db.qmu.Unlock()
	next.done <- struct{}{}
}

// inTurn runs fn in the batch leader's turn, between two batches, when it
// alone may use the machine's write side (to checkpoint, or take a
// snapshot): every command acknowledged before the call is applied and
// published then. Its error is fn's, or ctx's if ctx ended before its turn
// came (then fn did not run).
func (db *DB) inTurn(ctx context.Context, fn func() error) error {
	r := newRequest(Command{})
	r.turn = fn
	defer r.free()
	if err := db.submit(ctx, r); err != nil {
		return err
	}
	return r.res.Err
}

// maxBatchBytes bounds the keys and values of one batch, and so the size of
// its log record.
const maxBatchBytes = 32 << 20
