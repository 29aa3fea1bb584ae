package fencekv

import (
	"context"
	"time"

	"github.com/fencekv/fencekv/lease"
	"github.com/fencekv/fencekv/state"
)

// expiryLoop submits an expire command for each lock whose lease or
// lock-delay is due, sleeping until the earliest one otherwise. Correctness
// does not depend on its promptness: every command judges leases by its own
// time. It only frees locks for waiters and keeps records tidy.
func (db *DB) expiryLoop() {
	defer db.wg.Done()
	for {
		at, ok := db.m.NextDue()
		var timer Timer
		var fire <-chan time.Time
		if ok {
			now := db.now()
			if at <= now {
				if !db.expireDue(now) {
					return
				}
				continue
			}
			timer = db.clock.NewTimer(at - now)
			// The clock may have moved past at between reading now and
			// arming the timer. The timer then fires late, and on a fake
			// clock (which moves only when told) never: check again.
			if db.now() >= at {
				timer.Stop()
				continue
			}
			fire = timer.C()
		}
		select {
		case <-fire:
		case <-db.m.Wake():
		case <-db.stop:
			if timer != nil {
				timer.Stop()
			}
			return
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// expireDue submits expire commands for what is due at now and waits for
// them. It returns false when the DB is closing or failed.
func (db *DB) expireDue(now time.Duration) bool {
	return db.applyExpiries(context.Background(), db.m.DueLocks(now, db.opts.MaxBatch)) == nil
}

// applyExpiries submits an expire command for each of the locks, in one
// batch, and waits for them: it returns ctx's error if ctx ended before the
// batch took them, a refusal (the DB is closing or failed), or nil.
func (db *DB) applyExpiries(ctx context.Context, names []string) error {
	if len(names) == 0 {
		return nil
	}
	reqs := make([]*request, len(names))
	for i, name := range names {
		reqs[i] = newRequest(state.Command{Op: state.OpExpire, Lease: lease.Request{Name: name}})
	}
	defer func() {
		for _, r := range reqs {
			r.free()
		}
	}()
	if err := db.submit(ctx, reqs...); err != nil {
		return err
	}
	for i, r := range reqs {
		if r.res.Err != nil {
			return r.res.Err
		}
		if !r.res.Noop {
			// The audit trail (the wire server logs grants and releases):
			// a lease ran out, a lock-delay ended or an expired record
			// was forgotten; freed when the lock became free.
			db.log.Debug("lock expiry applied", "lock", names[i], "freed", r.res.Freed)
		}
	}
	return nil
}

// drainWaiters fails every queued waiter. Called by Close once no one
// leads.
func (db *DB) drainWaiters() {
	for _, name := range db.queues.QueuedLocks() {
		for w := db.queues.Pop(name); w != nil; w = db.queues.Pop(name) {
			w.Finish(lease.Grant{}, errClosed)
		}
	}
}
