package fencekv

import "github.com/fencekv/fencekv/lease"

// Semaphores: Acquire with AcquireOptions.Limit = N > 1 takes one of the N
// permits of the lock name. Each permit is a lease with its own token from
// the store-wide sequence; Renew, Release and held writes (WriteOptions.Lock)
// take the lock's name and the permit's token, as for a plain lock. Waiters
// queue FIFO and each freed permit goes to the next. LockInfo's Sem lists
// the live permits (LockInfo.Holders). See docs/semaphores.md.
//
// The limit is fixed by the first acquire while any permit is live: an
// acquire with another limit (a plain acquire, limit 1, included) is
// ErrLimitMismatch and changes nothing. A limit outside 0..MaxPermits, or a
// lock-delay with a limit over 1, is ErrBadRequest.

// MaxPermits is the largest semaphore limit.
const MaxPermits = lease.MaxPermits

// CodeLimitMismatch: an acquire's limit is not the lock's while a permit is live.
const CodeLimitMismatch = lease.CodeLimitMismatch

// ErrLimitMismatch is returned when an acquire's limit is not the lock's.
var ErrLimitMismatch = &Error{Code: CodeLimitMismatch}

// Holder is one live permit of a lock (LockInfo.Holders).
type Holder = lease.Holder

// checkLimit refuses a limit (given, not 0) outside 1..MaxPermits and a
// lock-delay on a semaphore.
func checkLimit(ao AcquireOptions) error { return lease.CheckLimit(ao.Limit, ao.LockDelay) }

// SemInfo is what LockInfo adds for a semaphore: its limit and live permits.
type SemInfo = lease.SemInfo
