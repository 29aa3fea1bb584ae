package state

import "github.com/fencekv/fencekv/lease"

// Semaphores (lease/semaphore.go) are acquires with Lease.Limit > 1. The
// limit is carried by commands of encoding version 3 (encodingV3): a binary
// that predates it refuses a batch holding one with ErrVersion, and a
// semaphore's lock record with a record-version error, instead of applying
// a semaphore acquire as a plain one.

// maxLimit bounds the limit a decoded command may carry: a larger one is a
// damaged command (errBadCommand), not a refusal.
const maxLimit = lease.MaxPermits

// Holder is one live permit of a lock (LockInfo.Holders).
type Holder = lease.Holder
