package bench

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// DialFencekv returns a Dialer of fencekv servers at addr (host:port): each
// Driver is a wire.Client of its own. Acquire with a wait queues on the
// server (first come, first served); Put is a put with the token. addr
// may list a cluster's nodes, comma-separated: the Drivers are spread
// over them, one after another.
func DialFencekv(addr string) Dialer { return DialFencekvWith(addr, nil) }

// DialFencekvWith is DialFencekv with o's TLS and credentials.
func DialFencekvWith(addr string, o *wire.DialOptions) Dialer {
	addrs := strings.Split(addr, ",")
	var next atomic.Uint64
	return func(ctx context.Context) (Driver, error) {
		a := strings.TrimSpace(addrs[(next.Add(1)-1)%uint64(len(addrs))])
		c, err := wire.DialWith(ctx, a, o)
		if err != nil {
			return nil, err
		}
		return fencekvDriver{c}, nil
	}
}

type fencekvDriver struct{ c *wire.Client }

var _ Driver = fencekvDriver{}

func (f fencekvDriver) Acquire(ctx context.Context, lock string, ttl, wait time.Duration) (uint64, error) {
	l, err := f.c.Acquire(ctx, lock, ttl, &fencekv.AcquireOptions{Wait: wait})
	return uint64(l.Token), err
}

func (f fencekvDriver) Release(ctx context.Context, lock string, token uint64) error {
	return f.c.Release(ctx, lock, fencekv.Token(token))
}

func (f fencekvDriver) Put(ctx context.Context, key string, value []byte, token uint64) error {
	_, err := f.c.Put(ctx, []byte(key), value, fencekv.WriteOptions{Token: fencekv.Token(token)})
	return err
}

func (f fencekvDriver) Get(ctx context.Context, key string) ([]byte, bool, error) {
	e, err := f.c.Get(ctx, []byte(key))
	return e.Value, e.Found, err
}

func (f fencekvDriver) Close() error { return f.c.Close() }

// Commits is how much group commit batched on a fencekv server between two
// reads of its counters.
type Commits struct {
	Commits  uint64  `json:"commits"`  // transactions committed
	Commands uint64  `json:"commands"` // commands applied in them
	PerTx    float64 `json:"commands_per_commit"`
}

// CountCommits reads the counters of the fencekv server at addr (the first
// of a list) and returns a func that reads them again and reports the
// difference. Status reads are not commands, so they do not count
// themselves.
func CountCommits(ctx context.Context, addr string) (func(context.Context) (Commits, error), error) {
	return CountCommitsWith(ctx, addr, nil)
}

// CountCommitsWith is CountCommits with o's TLS and credentials (status
// needs the admin right on a server with an auth file).
func CountCommitsWith(ctx context.Context, addr string, o *wire.DialOptions) (func(context.Context) (Commits, error), error) {
	addr, _, _ = strings.Cut(addr, ",")
	status := func(ctx context.Context) (fencekv.Status, error) {
		c, err := wire.DialWith(ctx, addr, o)
		if err != nil {
			return fencekv.Status{}, err
		}
		defer c.Close()
		return c.Status(ctx)
	}
	before, err := status(ctx)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (Commits, error) {
		after, err := status(ctx)
		if err != nil {
			return Commits{}, err
		}
		c := Commits{Commits: after.Commits - before.Commits, Commands: after.Commands - before.Commands}
		if c.Commits > 0 {
			c.PerTx = float64(c.Commands) / float64(c.Commits)
		}
		return c, nil
	}, nil
}
