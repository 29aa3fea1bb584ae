package fencekv

import (
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
)

// Op names a command. The set is closed: these are the only ways the state
// changes (G5).
type Op uint8

// The commands.
const (
	OpPut     Op = iota + 1 // Key, Value, Write, Lock
	OpDelete                // Key, Write, Lock
	OpCAS                   // Key, Revision, Value, Write, Lock
	OpIncr                  // Key, Delta, Write, Lock
	OpAcquire               // Lease
	OpRenew                 // Lease.Name, Token
	OpRelease               // Lease.Name, Token
	OpExpire                // Lease.Name: apply what is due on the lock at Now
)

var opNames = [...]string{"", "put", "delete", "cas", "incr", "acquire", "renew", "release", "expire"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "op?"
}

// Command is one state change. Now is set by whoever proposes it (the
// commit loop, or a cluster leader) from its monotonic clock, so that
// applying the same commands in the same order gives the same state on
// every node.
type Command struct {
	Op       Op
	Now      time.Duration
	Key      []byte
	Value    []byte
	Revision Revision
	Delta    int64
	Write    kv.Write
	Lock     string        // held write (G4): the lock that must be held by Write.Token
	Lease    lease.Request // acquire; Lease.Name for renew, release, expire
	Token    Token         // renew, release
}

// Result is the outcome of applying a Command.
type Result struct {
	Err     error
	Entry   kv.Entry    // writes: the key's fence and revision after the write
	Deleted bool        // delete: a live key was removed
	Int     int64       // incr: the new value
	Grant   lease.Grant // acquire
	TTL     time.Duration
	Freed   bool // acquire/release/expire: the lock became acquirable
}

// apply is the state machine: it applies c to the transaction and the lease
// manager's index. It is deterministic in (state, c). A refused command
// changes nothing: every check comes before the first write.
//
// Called only from the commit loop (or a replicated log's apply).
func apply(tx *kv.Tx, leases *lease.Manager, c *Command) (r Result) {
	switch c.Op {
	case OpPut, OpDelete, OpCAS, OpIncr:
		if c.Lock != "" {
			if err := leases.Check(tx, c.Now, c.Lock, c.Write.Token); err != nil {
				r.Err = err
				return r
			}
		}
	}
	switch c.Op {
	case OpPut:
		r.Entry, r.Err = tx.Put(c.Key, c.Value, c.Write)
	case OpDelete:
		r.Deleted, r.Entry, r.Err = tx.Delete(c.Key, c.Write)
	case OpCAS:
		r.Entry, r.Err = tx.CAS(c.Key, c.Revision, c.Value, c.Write)
	case OpIncr:
		r.Int, r.Entry, r.Err = tx.Incr(c.Key, c.Delta, c.Write)
	case OpAcquire:
		r.Grant, r.Err = leases.Acquire(tx, c.Now, c.Lease)
	case OpRenew:
		r.TTL, r.Err = leases.Renew(tx, c.Now, c.Lease.Name, c.Token)
	case OpRelease:
		r.Err = leases.Release(tx, c.Now, c.Lease.Name, c.Token)
		r.Freed = r.Err == nil
	case OpExpire:
		r.Freed, r.Err = leases.Expire(tx, c.Now, c.Lease.Name)
	default:
		r.Err = kv.Errorf(kv.CodeBadRequest, "unknown command %d", c.Op)
	}
	return r
}
