package lease

import (
	"sync"
	"sync/atomic"

	"github.com/fencekv/fencekv/fence"
)

// Waiter is a caller queued for a lock. Its outcome is set by the commit
// loop after the grant is durable; Done is closed then.
type Waiter struct {
	Req   Request
	Grant Grant
	Err   error

	state atomic.Int32 // waiting -> popped | cancelled
	done  chan struct{}
}

const (
	waiting int32 = iota
	popped
	cancelled
)

// NewWaiter returns a Waiter for req.
func NewWaiter(req Request) *Waiter {
	return &Waiter{Req: req, done: make(chan struct{})}
}

// Done is closed when the waiter's outcome is set.
func (w *Waiter) Done() <-chan struct{} { return w.done }

// Finish sets the outcome and closes Done. Called once, by the batch leader.
func (w *Waiter) Finish(g Grant, err error) {
	w.Grant, w.Err = g, err
	close(w.done)
}

type queue struct{ ws []*Waiter }

// Queues are the FIFO queues of callers waiting for locks, one per lock:
// in memory, owned by the driver that serves the acquires (a single node;
// a cluster's leader), never replicated. Safe for concurrent use.
type Queues struct {
	mu      sync.Mutex // guards waiters, n
	waiters map[string]*queue
	n       int
}

// NewQueues returns empty queues.
func NewQueues() *Queues { return &Queues{waiters: make(map[string]*queue)} }

// ErrTooManyWaiters is returned by Enqueue when max waiters are queued.
var ErrTooManyWaiters = &fence.Error{Code: fence.CodeLimitExceeded, Message: "too many waiters"}

// Enqueue puts w at the tail of its lock's queue unless max waiters (0:
// unlimited) are already queued store-wide.
func (qs *Queues) Enqueue(w *Waiter, max int) error {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if max > 0 && qs.n >= max {
		return ErrTooManyWaiters
	}
	q := qs.waiters[w.Req.Name]
	if q == nil {
		q = &queue{}
		qs.waiters[w.Req.Name] = q
	}
	q.ws = append(q.ws, w)
	qs.n++
	return nil
}

// Pop removes and returns the first waiter of name that has not given up,
// or nil. A popped waiter can no longer cancel: it will get an outcome.
func (qs *Queues) Pop(name string) *Waiter {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.waiters[name]
	for q != nil && len(q.ws) > 0 {
		w := q.ws[0]
		q.ws[0] = nil
		q.ws = q.ws[1:]
		qs.n--
		if w.state.CompareAndSwap(waiting, popped) {
			qs.dropIfEmpty(name, q)
			return w
		}
	}
	qs.dropIfEmpty(name, q)
	return nil
}

func (qs *Queues) dropIfEmpty(name string, q *queue) {
	if q != nil && len(q.ws) == 0 {
		delete(qs.waiters, name)
	}
}

// Requeue puts w, popped but not granted (the lock was taken before its
// grant could be applied), back at the head of its queue, waiting again.
func (qs *Queues) Requeue(w *Waiter) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	w.state.Store(waiting)
	q := qs.waiters[w.Req.Name]
	if q == nil {
		q = &queue{}
		qs.waiters[w.Req.Name] = q
	}
	q.ws = append([]*Waiter{w}, q.ws...)
	qs.n++
}

// Cancel takes w out of its queue. It returns false if w was already popped:
// then an outcome is coming on Done, and the caller must wait for it.
func (qs *Queues) Cancel(w *Waiter) bool {
	if !w.state.CompareAndSwap(waiting, cancelled) {
		return false
	}
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if q := qs.waiters[w.Req.Name]; q != nil {
		for i, x := range q.ws {
			if x == w {
				q.ws = append(q.ws[:i], q.ws[i+1:]...)
				qs.n--
				break
			}
		}
		qs.dropIfEmpty(w.Req.Name, q)
	}
	return true
}

// Waiting is the number of callers queued for name.
func (qs *Queues) Waiting(name string) int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if q := qs.waiters[name]; q != nil {
		return len(q.ws)
	}
	return 0
}

// Total is the number of callers queued for all locks.
func (qs *Queues) Total() int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.n
}

// QueuedLocks returns the names of the locks that have waiters.
func (qs *Queues) QueuedLocks() []string {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	names := make([]string, 0, len(qs.waiters))
	for name := range qs.waiters {
		names = append(names, name)
	}
	return names
}
