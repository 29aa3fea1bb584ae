package verify

import (
	"context"
	"errors"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// A Target is where a run's fenced writes go when they are not fencekv's
// own keys: a database the tokens fence (package sqlfence), say. fencekv
// still grants the locks; the target must refuse a write whose token is
// below the highest it accepted for the key.
//
// With a Target, every pause round is a stale-token round (a database
// knows tokens, not leases: a held write has no meaning there), and both
// inventory counters are updated with Incr, a read-modify-write the target
// makes after its token check, in one transaction.
type Target interface {
	// Put sets key to value if token is not below the key's fence, and
	// raises the fence to token; a stale token is refused with an error
	// matching fencekv.ErrStaleToken, changing nothing.
	Put(ctx context.Context, key string, value []byte, token fencekv.Token) error
	// Incr adds delta to key's decimal integer (absent: 0), fenced as Put.
	Incr(ctx context.Context, key string, delta int64, token fencekv.Token) error
	// Get reads key's value; found is false if it was never written.
	Get(ctx context.Context, key string) (value []byte, found bool, err error)
	// Delete removes keys and their fences: the run's scratch data.
	Delete(ctx context.Context, keys ...string) error
}

// put writes key with w through the run's target: fencekv's keys (retried
// through failovers), or cfg.Target (token only: it knows no leases).
func put(ctx context.Context, cfg Config, c *conn, key string, value []byte, w fencekv.WriteOptions) error {
	if cfg.Target != nil {
		return cfg.Target.Put(ctx, key, value, w.Token)
	}
	var perr error
	if err := c.call(ctx, func(cl *wire.Client) error {
		_, perr = cl.Put(ctx, []byte(key), value, w)
		if errors.Is(perr, fencekv.ErrStaleToken) {
			return nil // an answer: not retried
		}
		return perr
	}); err != nil {
		return err
	}
	return perr
}

// get reads key from the run's target.
func get(ctx context.Context, cfg Config, c *conn, key string) (fencekv.Entry, error) {
	if cfg.Target != nil {
		v, found, err := cfg.Target.Get(ctx, key)
		return fencekv.Entry{Key: []byte(key), Value: v, Found: found}, err
	}
	var e fencekv.Entry
	err := c.call(ctx, func(cl *wire.Client) error {
		var err error
		e, err = cl.Get(ctx, []byte(key))
		return err
	})
	return e, err
}
