package fencekv

import (
	"context"
	"time"

	"github.com/fencekv/fencekv/lease"
)

// expiryLoop submits an expire command for each lock whose lease or
// lock-delay is due, sleeping until the earliest one otherwise. Correctness
// does not depend on its promptness: every command judges leases by its own
// time. It only frees locks for waiters and keeps records tidy.
func (db *DB) expiryLoop() {
	defer db.wg.Done()
	for {
		at, ok := db.m.leases.Arm()
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
		case <-db.m.leases.Wake():
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
	names := db.m.leases.Due(now, db.opts.MaxBatch)
	if len(names) == 0 {
		return true
	}
	reqs := make([]*request, len(names))
	for i, name := range names {
		reqs[i] = newRequest(Command{Op: OpExpire, Lease: lease.Request{Name: name}})
	}
	defer func() {
		for _, r := range reqs {
			r.free()
		}
	}()
	if err := db.submit(context.Background(), reqs...); err != nil {
		return false
	}
	for i, r := range reqs {
		if r.res.Err != nil {
			return false
		}
		if !r.res.Noop {
			// The audit trail (the wire server logs grants and releases):
			// a lease ran out, a lock-delay ended or an expired record
			// was forgotten; freed when the lock became free.
			db.log.Debug("lock expiry applied", "lock", names[i], "freed", r.res.Freed)
		}
	}
	return true
}

// drainWaiters fails every queued waiter. Called by Close once no one
// leads.
func (db *DB) drainWaiters() {
	for _, name := range db.m.leases.QueuedLocks() {
		for w := db.m.leases.Pop(name); w != nil; w = db.m.leases.Pop(name) {
			w.Finish(lease.Grant{}, errClosed)
		}
	}
}
