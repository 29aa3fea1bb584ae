package bench

import (
	"context"
	"time"
)

// Driver is one client's connection to a store under test: the handful of
// operations the workloads need, each a blocking call answered only after
// the store acknowledged it. Run gives each client its own Driver and calls
// it from that client's goroutine only, one call at a time, so a Driver
// need not be safe for concurrent use and must not pipeline.
//
// Tokens are the store's fencing tokens: every grant's token is above the
// token of every earlier grant of the same lock, and a Put with a token
// below the key's fence is refused.
type Driver interface {
	// Acquire takes lock with a lease of ttl and returns its fencing
	// token. With wait 0 it fails at once if the lock is held; otherwise
	// it waits up to wait for its turn, however the store queues (a FIFO
	// on the server, a watch, or polling).
	Acquire(ctx context.Context, lock string, ttl, wait time.Duration) (token uint64, err error)
	// Release frees lock if token still holds it.
	Release(ctx context.Context, lock string, token uint64) error
	// Put writes value to key, fenced by token: refused if token is below
	// the highest token that wrote key, else the key's fence becomes
	// token, atomically with the value. Token 0 is accepted only on a key
	// no fenced write touched.
	Put(ctx context.Context, key string, value []byte, token uint64) error
	// Get reads key.
	Get(ctx context.Context, key string) (value []byte, found bool, err error)
	// Close ends the connection.
	Close() error
}

// Dialer opens one Driver: one new connection to the store.
type Dialer func(ctx context.Context) (Driver, error)
