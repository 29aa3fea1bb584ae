// Command inventory moves N units between two rows of an inventory table in
// PostgreSQL under the fencekv lock "inventory", fenced: the transaction
// checks the lease's token against the fence (sqlfence) before it writes,
// so a holder that paused past its lease cannot commit over a newer one.
//
//	FENCEKV_ADDR=127.0.0.1:7420 DATABASE_URL=postgres://localhost/shop \
//	    go run . apple pear 5
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/sqlfence"
	"github.com/fencekv/fencekv/wire"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

func main() {
	if len(os.Args) != 4 {
		fail(errors.New("usage: inventory FROM TO N"))
	}
	from, to := os.Args[1], os.Args[2]
	n, err := strconv.Atoi(os.Args[3])
	if err != nil || n < 1 {
		fail(fmt.Errorf("N %q: want a positive integer", os.Args[3]))
	}
	ctx := context.Background()
	db, err := sql.Open("pgx", env("DATABASE_URL", "postgres://localhost/shop"))
	if err != nil {
		fail(err)
	}
	defer db.Close()
	c, err := wire.DialCluster(ctx, strings.Split(env("FENCEKV_ADDR", "127.0.0.1:7420"), ","), nil)
	if err != nil {
		fail(err)
	}
	defer c.Close()

	// WithLock: acquire (queueing up to 30s), BEGIN, check the token
	// against the fence, run fn, COMMIT unless the lease may be lost, release.
	opts := &sqlfence.LockOptions{LockOptions: wire.LockOptions{AcquireOptions: fencekv.AcquireOptions{Wait: 30 * time.Second}}}
	err = sqlfence.Postgres.WithLock(ctx, c, db, "inventory", 10*time.Second, opts,
		func(ctx context.Context, tx *sql.Tx, l fencekv.Lease) error {
			var left, now int
			err := tx.QueryRowContext(ctx, "UPDATE inventory SET qty = qty - $1 WHERE sku = $2 AND qty >= $1 RETURNING qty", n, from).Scan(&left)
			if err != nil {
				return fmt.Errorf("take %d from %s (not that many?): %w", n, from, err)
			}
			if err := tx.QueryRowContext(ctx, "UPDATE inventory SET qty = qty + $1 WHERE sku = $2 RETURNING qty", n, to).Scan(&now); err != nil {
				return fmt.Errorf("put %d into %s: %w", n, to, err)
			}
			fmt.Printf("moved %d from %s to %s under token %d: %s %d, %s %d\n", n, from, to, l.Token, from, left, to, now)
			return nil
		})
	if errors.Is(err, fencekv.ErrStaleToken) { // a newer holder wrote first: nothing of ours landed
		fail(fmt.Errorf("refused, nothing written: %w", err))
	}
	if err != nil { // rolled back, the lock released
		fail(err)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "inventory:", err)
	os.Exit(1)
}
