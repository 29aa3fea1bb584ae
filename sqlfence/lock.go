package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// Locker is what WithLock needs of a fencekv client; *wire.Client is one.
type Locker interface {
	WithLock(ctx context.Context, name string, ttl time.Duration, o *wire.LockOptions,
		fn func(ctx context.Context, l fencekv.Lease) error) error
}

var _ Locker = (*wire.Client)(nil)

// LockOptions tune WithLock.
type LockOptions struct {
	wire.LockOptions
	// Resource is the fence's resource; "": the lock's name.
	Resource string
	// Tx is passed to BeginTx (isolation level, read-only); nil: the
	// database's defaults.
	Tx *sql.TxOptions
}

// WithLock runs fn in a transaction of db under the fencekv lock name: it
// acquires the lock through c (renewing it while fn runs, as
// wire.Client.WithLock does), begins a transaction, checks the lease's
// token against the resource's fence (Check), calls fn, and commits, then
// releases the lock. fn's writes land only if the token was not stale.
//
// The transaction runs under the lease's context: once the lease may be
// lost (a renew refused, or no renew within the TTL less o.Margin), the
// context is cancelled, database/sql rolls the transaction back, and
// WithLock does not commit; its error matches wire.ErrLeaseLost. What this
// bounds, and what it cannot: a commit sent just before the lease was lost
// may reach the database after it, but a newer holder's Check waits on the
// fence row's lock until that commit ends, so the commits still come in
// token order. Bound the wait with the database's lock_timeout.
//
// fn's error rolls the transaction back and is returned; a stale token is
// an *fence.Error matching fencekv.ErrStaleToken, and fn is not called.
func (d *Dialect) WithLock(ctx context.Context, c Locker, db *sql.DB, name string, ttl time.Duration, o *LockOptions,
	fn func(ctx context.Context, tx *sql.Tx, l fencekv.Lease) error) error {
	var lo LockOptions
	if o != nil {
		lo = *o
	}
	resource := lo.Resource
	if resource == "" {
		resource = name
	}
	if err := checkResource(resource); err != nil {
		return err
	}
	return c.WithLock(ctx, name, ttl, &lo.LockOptions, func(lctx context.Context, l fencekv.Lease) error {
		tx, err := db.BeginTx(lctx, lo.Tx)
		if err != nil {
			return leaseCause(lctx, fmt.Errorf("sqlfence: begin: %w", err))
		}
		defer tx.Rollback()
		if err := d.Check(lctx, tx, resource, l.Token); err != nil {
			return leaseCause(lctx, err)
		}
		if err := fn(lctx, tx, l); err != nil {
			return leaseCause(lctx, err)
		}
		// The last moment to stop: a lease that may be lost does not
		// commit.
		if err := context.Cause(lctx); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return leaseCause(lctx, fmt.Errorf("sqlfence: commit: %w", err))
		}
		return nil
	})
}

// leaseCause adds the lease's loss to err when the lease's context ended.
func leaseCause(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, cause)
}
