package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fence"
)

// TestCheckBadInput: bad input is bad_request before anything is sent (the
// tests against real databases are in sqlfencetest, a module of its own).
func TestCheckBadInput(t *testing.T) {
	ctx := context.Background()
	tx := &sql.Tx{} // never used: every case is refused first
	for _, c := range []struct {
		tx       *sql.Tx
		resource string
		token    fence.Token
		want     string
	}{
		{nil, "r", 1, "needs a transaction"},
		{tx, "r", 0, "want 1 to"},
		{tx, "r", math.MaxInt64 + 1, "want 1 to"},
		{tx, "", 1, "empty resource"},
		{tx, strings.Repeat("r", MaxResource+1), 1, "at most 1024"},
	} {
		for _, d := range []*Dialect{Postgres, SQLite} {
			err := d.Check(ctx, c.tx, c.resource, c.token)
			if !errors.Is(err, fencekv.ErrBadRequest) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s.Check(%.10q, %d): %v; want bad_request (%s)", d, c.resource, c.token, err, c.want)
			}
		}
	}
}

// TestSchemasMatchLimits: the shipped SQL states the limits Check checks.
func TestSchemasMatchLimits(t *testing.T) {
	for _, d := range []*Dialect{Postgres, SQLite} {
		s := d.Schema()
		for _, want := range []string{"CREATE TABLE IF NOT EXISTS " + Table, "BETWEEN 1 AND 1024", "token > 0"} {
			if !strings.Contains(s, want) {
				t.Errorf("%s schema lacks %q", d, want)
			}
		}
	}
	if !strings.Contains(Postgres.Schema(), "ERRCODE = 'FK001'") {
		t.Error("postgres schema: no FK001 refusal")
	}
}

// TestRebind: ? placeholders become $n for PostgreSQL only.
func TestRebind(t *testing.T) {
	const stmt = "UPDATE t SET a = ?, b = ? WHERE id = ?"
	if got, want := Postgres.Rebind(stmt), "UPDATE t SET a = $1, b = $2 WHERE id = $3"; got != want {
		t.Errorf("Postgres.Rebind = %q; want %q", got, want)
	}
	if got := SQLite.Rebind(stmt); got != stmt {
		t.Errorf("SQLite.Rebind = %q; want it unchanged", got)
	}
}
