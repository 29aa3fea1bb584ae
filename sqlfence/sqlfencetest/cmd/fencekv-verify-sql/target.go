package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/sqlfence"
	"github.com/fencekv/fencekv/verify"
)

// target is verify.Target on a database: the scratch rows in
// fencekv_verify, each fenced by sqlfence's check with the row's key as
// the resource, in the same transaction as the write.
type target struct {
	db *sql.DB
	d  *sqlfence.Dialect
}

var _ verify.Target = (*target)(nil)

func openTarget(ctx context.Context, dsn string) (*target, error) {
	var t target
	var err error
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		t.d = sqlfence.Postgres
		t.db, err = sql.Open("pgx", dsn)
	case strings.HasPrefix(dsn, "sqlite:"):
		t.d = sqlfence.SQLite
		// BEGIN IMMEDIATE: a transaction takes the write lock as it
		// begins; busy_timeout: another writer waits for it.
		t.db, err = sql.Open("sqlite", fmt.Sprintf("file:%s?_txlock=immediate&_pragma=busy_timeout(%d)&_pragma=journal_mode(wal)",
			strings.TrimPrefix(dsn, "sqlite:"), waitBusy.Milliseconds()))
	default:
		return nil, errDSN
	}
	if err != nil {
		return nil, err
	}
	if err := t.db.PingContext(ctx); err != nil {
		t.db.Close()
		return nil, fmt.Errorf("%s: %w", t.d, err)
	}
	return &t, nil
}

// q rewrites ? placeholders for the dialect.
func (t *target) q(stmt string) string { return t.d.Rebind(stmt) }

func (t *target) install(ctx context.Context) error {
	if err := t.d.Install(ctx, t.db); err != nil {
		return err
	}
	_, err := t.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS fencekv_verify (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
	return err
}

// fenced runs fn in a transaction after the token check on key.
func (t *target) fenced(ctx context.Context, key string, token fencekv.Token, fn func(tx *sql.Tx) error) error {
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := t.d.Check(ctx, tx, key, token); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func (t *target) set(ctx context.Context, tx *sql.Tx, key, value string) error {
	_, err := tx.ExecContext(ctx, t.q("INSERT INTO fencekv_verify (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"), key, value)
	return err
}

func (t *target) Put(ctx context.Context, key string, value []byte, token fencekv.Token) error {
	return t.fenced(ctx, key, token, func(tx *sql.Tx) error { return t.set(ctx, tx, key, string(value)) })
}

func (t *target) Incr(ctx context.Context, key string, delta int64, token fencekv.Token) error {
	return t.fenced(ctx, key, token, func(tx *sql.Tx) error {
		var v string
		err := tx.QueryRowContext(ctx, t.q("SELECT value FROM fencekv_verify WHERE key = ?"), key).Scan(&v)
		var n int64
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		default:
			if n, err = strconv.ParseInt(v, 10, 64); err != nil {
				return fmt.Errorf("counter %s holds %q", key, v)
			}
		}
		return t.set(ctx, tx, key, strconv.FormatInt(n+delta, 10))
	})
}

func (t *target) Get(ctx context.Context, key string) ([]byte, bool, error) {
	var v string
	err := t.db.QueryRowContext(ctx, t.q("SELECT value FROM fencekv_verify WHERE key = ?"), key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	return []byte(v), err == nil, err
}

func (t *target) Delete(ctx context.Context, keys ...string) error {
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, k := range keys {
		if _, err := tx.ExecContext(ctx, t.q("DELETE FROM fencekv_verify WHERE key = ?"), k); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, t.q("DELETE FROM "+sqlfence.Table+" WHERE resource = ?"), k); err != nil {
			return err
		}
	}
	return tx.Commit()
}
