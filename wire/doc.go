// Package wire is fencekv over the network: the MessagePack-RPC server
// that `fencekv serve` runs, and the Go client for it. PROTOCOL.md, in
// this directory, is the protocol's contract, for clients in any language.
//
// # Client
//
// Dial connects to one server, DialCluster to any node of a cluster (each
// serves every request). A Client has the methods of the embedded engine,
// fencekv.DB, with the same refusals: errors.Is(err, fencekv.ErrStaleToken)
// works either way, and errors.As gives the *fencekv.Error with the facts
// (the key's fence, the holder's token, the time to wait).
//
//	c, err := wire.DialCluster(ctx, []string{"10.0.0.1:7420", "10.0.0.2:7420"}, nil)
//	if err != nil { ... }
//	defer c.Close()
//	l, err := c.Acquire(ctx, "inventory", 10*time.Second, nil)
//	...
//	_, err = c.Put(ctx, key, value, fencekv.WriteOptions{Token: l.Token, Lock: "inventory"})
//
// A Client is safe for concurrent use; calls from many goroutines share
// its one connection. When the connection breaks, the calls in flight
// fail with a *ConnError and the next call dials again (see Client): a
// write whose call failed that way may or may not have been applied
// (ConnError.Outcome), like a fencekv.Error with Code unavailable and
// Outcome fencekv.OutcomeUnknown. All these errors match ErrClientClosed,
// as do calls after Close.
//
// # Locks
//
// WithLock runs a function while holding a lock: it acquires it, renews
// the lease in the background (through reconnects), cancels the
// function's context with cause ErrLeaseLost as soon as the lease may be
// lost (measured on this machine's clock, so it never trusts a lease
// longer than the server does), and releases the lock after. Pass the
// lease's token with every write the lock protects, and its name too for
// keys in fencekv (a held write): the fence refuses a write that was
// already on its way when the lease ran out.
//
// # Server
//
// NewServer serves any Engine (a *fencekv.DB, or a cluster node) with
// the limits of a Config; Serve and Shutdown run and stop it.
package wire
