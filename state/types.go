package state

import (
	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
)

// Token is a fencing token; Revision counts accepted writes store-wide.
type (
	Token    = fence.Token
	Revision = fence.Revision
)

// Entry is a key's state as a read or write left it.
type Entry struct {
	Key      []byte
	Value    []byte
	Found    bool
	Fence    Token
	Revision Revision
}

// entry converts the storage's entry.
func entry(e kv.Entry) Entry { return Entry(e) }

// LockInfo describes a lock as a read sees it.
type LockInfo = lease.Info

// Counters are the store-wide counters a status report shows.
type Counters struct {
	LastToken Token
	Revision  Revision
	Keys      uint64
	DataSize  int64
	Locks     int // leases held
	Waiters   int // callers queued for locks
	Grants    uint64
	Expiries  uint64
}

// MaxCommandBytes bounds the keys and values of one command, the largest
// transaction the limits allow.
const MaxCommandBytes = 512 << 20
