package sqlfence

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/fencekv/fencekv/fence"
)

// MaxResource is the longest resource name, in bytes, the fence table
// holds (its CHECK constraint says the same).
const MaxResource = 1024

// Table is the fence table the schemas create and Check uses.
const Table = "fencekv_fences"

// A Dialect is one database's fence: its schema and its statements.
// Postgres and SQLite are the two there are.
type Dialect struct {
	name   string
	schema string
	raise  string // check and raise in one statement; a row back means the token holds
	read   string // the resource's fence, after a refusal
}

//go:embed postgres.sql
var postgresSchema string

//go:embed sqlite.sql
var sqliteSchema string

// Postgres is the fence for PostgreSQL 12 and later.
var Postgres = &Dialect{
	name:   "postgres",
	schema: postgresSchema,
	raise: `INSERT INTO fencekv_fences AS f (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE f.token <= excluded.token
RETURNING f.token`,
	read: `SELECT token FROM fencekv_fences WHERE resource = $1`,
}

// SQLite is the fence for SQLite 3.35 and later (RETURNING).
var SQLite = &Dialect{
	name:   "sqlite",
	schema: sqliteSchema,
	raise: `INSERT INTO fencekv_fences (resource, token) VALUES (?, ?)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE fencekv_fences.token <= excluded.token
RETURNING token`,
	read: `SELECT token FROM fencekv_fences WHERE resource = ?`,
}

// Rebind rewrites a statement written with ? placeholders for the
// dialect: $1, $2, ... for PostgreSQL; unchanged for SQLite.
func (d *Dialect) Rebind(stmt string) string {
	if d != Postgres {
		return stmt
	}
	var b strings.Builder
	n := 0
	for _, r := range stmt {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// String returns the dialect's name.
func (d *Dialect) String() string { return d.name }

// Schema returns the SQL that creates the fence table (and, for
// PostgreSQL, the fencekv_fence function), the file shipped beside this
// package. Applying it again changes nothing.
func (d *Dialect) Schema() string { return d.schema }

// Install applies the schema to db.
func (d *Dialect) Install(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, d.schema); err != nil {
		return fmt.Errorf("sqlfence: install the %s schema: %w", d.name, err)
	}
	return nil
}

// Check checks token against resource's fence and raises the fence to it,
// in tx, in one statement. It returns nil if token is not below the fence
// (an equal token is the same holder again); then commit tx as usual. A
// token below the fence is an *fence.Error with code stale_token and the
// fence (errors.Is(err, fencekv.ErrStaleToken)): roll tx back, its writes
// must not land.
//
// The statement takes the resource's row lock until tx ends, also when it
// refuses: a newer holder's Check waits for tx, so the order of the tokens
// is the order of the commits, under every isolation level. Call Check
// before the writes it protects, so that they are made under that lock.
//
// A token of 0 or above 2^63-1 (the SQL bigint), an empty resource, one
// longer than MaxResource, or a nil tx is bad_request, and nothing is
// sent.
func (d *Dialect) Check(ctx context.Context, tx *sql.Tx, resource string, token fence.Token) error {
	if err := checkArgs(tx, resource, token); err != nil {
		return err
	}
	var got int64
	err := tx.QueryRowContext(ctx, d.raise, resource, int64(token)).Scan(&got)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlfence: check %q: %w", resource, err)
	}
	var current int64
	if err := tx.QueryRowContext(ctx, d.read, resource).Scan(&current); err != nil {
		return fmt.Errorf("sqlfence: read the fence of %q after a refusal: %w", resource, err)
	}
	return &fence.Error{
		Code:    fence.CodeStaleToken,
		Message: fmt.Sprintf("%s is fenced at %d; token %d refused", resource, current, token),
		Fence:   fence.Token(current),
		Key:     resource,
	}
}

func checkArgs(tx *sql.Tx, resource string, token fence.Token) error {
	switch {
	case tx == nil:
		return fence.Errorf(fence.CodeBadRequest, "a fence check needs a transaction (the check and the writes it protects commit together)")
	case token == 0 || token > math.MaxInt64:
		return fence.Errorf(fence.CodeBadRequest, "fencing token %d: want 1 to %d (SQL bigint)", token, int64(math.MaxInt64))
	}
	return checkResource(resource)
}

func checkResource(resource string) error {
	switch {
	case resource == "":
		return fence.Errorf(fence.CodeBadRequest, "empty resource name")
	case len(resource) > MaxResource:
		return fence.Errorf(fence.CodeBadRequest, "resource name of %d bytes: at most %d", len(resource), MaxResource)
	}
	return nil
}
