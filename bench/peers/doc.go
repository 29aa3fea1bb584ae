// Package peers holds bench.Driver implementations for the stores fencekv
// is compared with, so that the same workloads run against each side by
// side: etcd (DialEtcd) and Redis (DialRedis).
//
// It is a Go module of its own, so that the etcd and Redis clients and
// their dependencies never become dependencies of fencekv.
//
// Each driver does what a careful user of that store would do to get
// fencekv's guarantee, a write refused when its token is below the highest
// token that wrote the key, in as few round trips as the store allows:
//
//   - etcd: a lock is a concurrency.Mutex on a session (one session per
//     client); its token is the revision at which the grant was made (the
//     lock key's create revision when uncontended). A fenced put is one
//     Txn: unless "fence/<key>" holds a higher token, put the value and
//     the token. Gets are etcd's default linearizable reads.
//   - Redis: a lock is SET NX PX with a per-grant holder value, and the
//     token is INCR of a counter, in one Lua script; release is a Lua
//     compare-and-delete; a fenced put is a Lua script that compares the
//     token with the fence kept beside the value (a hash with fields v and
//     f) and writes both. Redis has no lock queue: a waiting acquire polls
//     with a short jittered exponential backoff (1 ms doubling to 16 ms),
//     as Redis lock clients do.
//
// Tokens are compared as fencekv does by default: a put is accepted when
// its token is at or above the fence (t >= fence).
package peers
