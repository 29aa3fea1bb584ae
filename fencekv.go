// Package fencekv is the fencekv engine: a key-value store and a lock
// service in one transactional boundary, for embedding in Go programs. The
// TCP server (package wire) and the fencekv binary are built on it.
//
// A DB has three nouns: keys (with values, a fence and a revision), locks
// (leases with fencing tokens), and commands (the only way either changes).
//
//	db, err := fencekv.Open("data", nil)
//	l, err := db.Acquire(ctx, "inventory", 10*time.Second, nil)
//	_, err = db.Put(ctx, []byte("inventory/sku-1"), []byte("7"), fencekv.WriteOptions{Token: l.Token})
//	err = db.Release(ctx, "inventory", l.Token)
//
// # Guarantees
//
//   - G1: every grant draws its token from one store-wide sequence that
//     strictly increases across locks, restarts and crashes.
//   - G2: every key keeps its fence, the highest token any accepted write to
//     it carried, in the same transaction as its value; a write with a lower
//     token (or not higher, when Strict) is refused with ErrStaleToken. The
//     fence outlives a delete.
//   - G3: a write without a token is accepted only while the key's fence is 0.
//   - G4: a write naming a lock is accepted only if that lock is held by
//     exactly its token and the lease has not expired when it is applied.
//   - G5: grants, renewals, releases, expiries and writes are Commands,
//     applied one after another by one deterministic function inside bbolt
//     read-write transactions.
//   - G6: a call returns only after its command is durable: the commands
//     of a group commit are applied in one bbolt transaction and written as
//     one record to the write-ahead log, which is synced (fdatasync) before
//     any of them is answered. The data file is brought up to date from the
//     log at checkpoints; Open replays what it does not reflect yet.
//   - G7: leases are durations on the engine's monotonic clock; on Open every
//     live lease gets its full TTL again, and every lock in lock-delay its
//     full delay.
//   - G8: every refusal is an *Error with a stable Code and its facts; a
//     refused command changes nothing and does not fail others in its batch.
//
// Reads (Get, Scan, LockInfo, Locks, Status) run in read-only transactions
// concurrently with the writer; they see every acknowledged command and
// nothing that is not yet durable.
//
// # Caveats
//
// Tokens are compared, not authenticated: a caller that writes with a huge
// token it invented fences that key against every real holder. Waiter
// queues live in memory: a restart drops them (their callers get an error).
// An expired lock's record is kept for lease.Retention (10 minutes) after
// the lock became free, or until it is acquired again, so that a late
// holder is told lease_expired; after that it is told not_holder. Only one
// process may open a data dir.
//
// The engine is the root package, not a package of its own, so that
// embedding programs write fencekv.Open and errors.Is(err,
// fencekv.ErrStaleToken), and the same names serve the wire client.
package fencekv

// Version is the version of fencekv.
const Version = "0.1.0"

// DataFile is the name of the bbolt file inside a data dir, and LogFile
// the name of its write-ahead log. NodeFile, in a cluster node's data dir
// only, holds the node's name: a single node refuses such a dir.
const (
	DataFile = "fencekv.db"
	LogFile  = "fencekv.wal"
	NodeFile = "node"
)
