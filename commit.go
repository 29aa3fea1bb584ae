package fencekv

import (
	"errors"
	"fmt"
	"time"

	"github.com/fencekv/fencekv/diskfault"
	"github.com/fencekv/fencekv/lease"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wal"
)

// The durable path of a single node (G6): the batch leader applies a
// batch's commands to the machine, appends those that changed state to the
// write-ahead log as one record, syncs it, and only then publishes the
// batch to readers and answers its callers. Checkpoints bring the data
// file up to date and start the log over; Open replays what the data file
// lacks.

// handoff is a grant made to a queued waiter, answered after commit.
type handoff struct {
	w   *lease.Waiter
	res state.Result
}

// commitBatch applies, logs, publishes and answers one batch. It never
// panics: a panic or a storage error anywhere in it fails the batch (its
// callers get ErrInternal or ErrUnavailable, nothing of it is visible) and
// puts the DB in its failed state.
func (db *DB) commitBatch(batch []*request) {
	if err := db.failure(); err != nil {
		fail := errorf(CodeUnavailable, "the store failed: %v", err)
		for _, r := range batch {
			r.res = state.Result{Err: fail}
			r.answer()
		}
		return
	}
	var handed []handoff
	logging := false // the batch's record is being written: it may reach the disk
	err := state.Safely(func() error {
		var err error
		if handed, err = db.applyBatch(batch); err != nil {
			return err
		}
		logging = db.logged > 0
		return db.writeRecord()
	})
	if err != nil {
		db.fail(err)
		fail := errorf(CodeUnavailable, "the store failed: %v", err)
		if errors.Is(err, state.ErrPanic) {
			fail = errorf(CodeInternal, "the store failed: %v", err)
		}
		// A command applied in a batch whose record was written, whose
		// sync then failed, may be in the log (in the page cache, say),
		// and a restart replays it: its outcome is unknown, not "not
		// applied" (a client that retried an incr on the latter would
		// apply it twice). One the batch refused changes nothing either
		// way.
		unknown := fail
		if logging {
			unknown = errorf(fail.Code, "%s; the command may have been applied: its log record may have reached the disk, and a restart would replay it", fail.Message)
			unknown.Outcome = OutcomeUnknown
		}
		for _, r := range batch {
			if r.res.Err == nil {
				r.res = state.Result{Err: unknown}
			} else {
				r.res = state.Result{Err: fail}
			}
			if r.waiter != nil {
				db.queues.Cancel(r.waiter)
				r.waiter = nil
			}
			r.answer()
		}
		for _, h := range handed {
			if h.res.Err == nil {
				h.w.Finish(lease.Grant{}, unknown)
			} else {
				h.w.Finish(lease.Grant{}, fail)
			}
		}
		return
	}
	db.m.Publish(db.seq)
	if db.logged > 0 {
		db.commits.Add(1)
		if o := db.opts.Observer; o != nil {
			o.Committed(len(batch)+len(handed), db.lastSync)
		}
	}
	db.commands.Add(uint64(len(batch) + len(handed)))
	for _, r := range batch {
		r.answer()
	}
	for _, h := range handed {
		h.w.Finish(h.res.Grant, h.res.Err)
	}
	if db.sinceCkpt > 0 && (time.Since(db.lastCkpt) >= db.opts.CheckpointEvery || db.wal.Size() >= db.opts.CheckpointBytes) {
		if err := state.Safely(db.checkpoint); err != nil {
			db.fail(err)
		}
	}
}

// applyBatch applies the batch's commands, with the expiries and
// hand-offs they lead to, and builds its log record. Every command gets
// Now, the leader's time for the whole batch.
func (db *DB) applyBatch(batch []*request) (handed []handoff, err error) {
	now := db.now()
	db.startRecord()
	for _, r := range batch {
		c := &r.cmd
		c.Now = now
		if c.Op == state.OpAcquire && db.queues.Waiting(c.Lease.Name) > 0 {
			// Waiters come first: if the holder's lease is past due,
			// expire it now and hand the lock to the head of the queue.
			if handed, err = db.expire(now, c.Lease.Name, handed); err != nil {
				return handed, err
			}
		}
		if r.res, err = db.apply(c); err != nil {
			return handed, err
		}
		if c.Op == state.OpAcquire && r.wait > 0 && errors.Is(r.res.Err, ErrLockHeld) {
			w := lease.NewWaiter(c.Lease)
			if err := db.queues.Enqueue(w, db.opts.MaxWaiters); err != nil {
				r.res.Err = err
			} else {
				r.waiter = w
			}
		}
		if r.res.Freed {
			if handed, err = db.handOff(now, c.Lease.Name, handed); err != nil {
				return handed, err
			}
		}
	}
	return handed, nil
}

// apply applies c to the machine and, if it changed anything, adds it to
// the batch's log record (a refused command, or an expire with nothing
// due, changed nothing: replay needs neither). err is the machine's
// failure.
func (db *DB) apply(c *state.Command) (state.Result, error) {
	r, err := db.m.Apply(c)
	if err == nil && r.Err == nil && !r.Noop {
		db.rec = state.AppendCommand(db.rec, c)
		db.logged++
	}
	return r, err
}

// expire applies what is due on a lock, and hands it to a waiter if that
// freed it.
func (db *DB) expire(now time.Duration, name string, handed []handoff) ([]handoff, error) {
	res, err := db.apply(&state.Command{Op: state.OpExpire, Now: now, Lease: lease.Request{Name: name}})
	if err != nil || !res.Freed {
		return handed, err
	}
	return db.handOff(now, name, handed)
}

// handOff grants a freed lock to the first waiter still waiting, in the
// same transaction that freed it (FIFO; no thundering herd).
func (db *DB) handOff(now time.Duration, name string, handed []handoff) ([]handoff, error) {
	for {
		w := db.queues.Pop(name)
		if w == nil {
			return handed, nil
		}
		res, err := db.apply(&state.Command{Op: state.OpAcquire, Now: now, Lease: w.Req})
		handed = append(handed, handoff{w, res})
		if err != nil {
			return handed, err
		}
		if res.Err == nil && !res.Freed { // a semaphore may have permits left for the next
			return handed, nil
		}
	}
}

// startRecord begins the log record of a batch: the commands that change
// state, in the order they were applied. The record's number is seq+1.
func (db *DB) startRecord() {
	db.rec = state.AppendBatchHeader(db.rec[:0])
	db.logged = 0
}

// writeRecord appends the batch's record to the log and syncs it (G6). A
// batch that changed nothing writes nothing.
func (db *DB) writeRecord() error {
	if db.logged == 0 {
		return nil
	}
	start := time.Now()
	defer func() {
		db.lastSync = time.Since(start)
		db.syncNanos.Add(int64(db.lastSync))
	}()
	if err := db.wal.Append(db.seq+1, db.rec); err != nil {
		return err
	}
	if db.beforeSync != nil {
		if err := db.beforeSync(); err != nil {
			return err
		}
	}
	if !db.opts.NoSync {
		if err := db.wal.Sync(); err != nil {
			return err
		}
	}
	db.seq++
	db.sinceCkpt++
	if cap(db.rec) > 4<<20 {
		db.rec = nil // do not keep a huge buffer for good
	}
	return nil
}

// checkpoint commits the data file up to the last log record and empties
// the log. Called by the leader, and by Close once no one leads.
func (db *DB) checkpoint() error {
	if db.sinceCkpt == 0 {
		return nil
	}
	start := time.Now()
	defer func() {
		d := time.Since(start)
		db.checkpoints.Add(1)
		db.ckptNanos.Add(int64(d))
		if o := db.opts.Observer; o != nil {
			o.Checkpointed(d)
		}
	}()
	if diskfault.Enabled {
		if err := diskfault.Hit("data.checkpoint"); err != nil {
			return fmt.Errorf("fencekv: checkpoint: %w", err)
		}
	}
	if err := db.m.Checkpoint(); err != nil {
		return err
	}
	db.wal.Reset()
	db.sinceCkpt = 0
	db.lastCkpt = time.Now()
	return nil
}

// replay applies the log records the data file does not reflect yet (those
// after its last checkpoint), then checkpoints. Called by Open. Every
// logged command was accepted when it was first applied, so a refusal
// here means the log and the data file disagree: Open fails rather than
// diverge from what was answered.
func (db *DB) replay(recs []wal.Record) error {
	applied := db.m.Applied()
	db.seq = applied
	for _, rec := range recs {
		seq := rec.LSN
		if seq <= applied {
			continue // already in the data file
		}
		if seq != db.seq+1 {
			return fmt.Errorf("fencekv: the log jumps from record %d to %d", db.seq, seq)
		}
		err := state.EachCommand(rec.Payload, func(c *state.Command) error {
			r, err := db.m.Apply(c)
			if err == nil && r.Err != nil {
				err = fmt.Errorf("%v refused: %w", c.Op, r.Err)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("fencekv: replaying log record %d: %w", seq, err)
		}
		db.m.Publish(seq)
		db.seq = seq
		db.sinceCkpt++
	}
	if db.sinceCkpt > 0 {
		db.log.Info("replayed the write-ahead log", "records", db.sinceCkpt, "last", db.seq)
	}
	db.sinceCkpt = max(db.sinceCkpt, len(recs)) // a log of applied records is emptied too
	return db.checkpoint()
}
