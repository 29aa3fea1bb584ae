package sqlfencetest

import (
	"bufio"
	"context"
	"database/sql"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/sqlfence"
	"github.com/fencekv/fencekv/wire"
	_ "modernc.org/sqlite"
)

// A backend is one database the same scenario runs on.
type backend struct {
	name string
	d    *sqlfence.Dialect
	open func(t *testing.T) *sql.DB // a fresh database with the fence schema and a stock table
}

// q rewrites a statement written with ? placeholders for the backend.
func (b backend) q(stmt string) string { return b.d.Rebind(stmt) }

var (
	pgBackend = backend{"postgres", sqlfence.Postgres, func(t *testing.T) *sql.DB {
		needPostgres(t)
		db, _ := pg.newDB(t)
		prepare(t, sqlfence.Postgres, db)
		return db
	}}
	sqliteBackend = backend{"sqlite", sqlfence.SQLite, func(t *testing.T) *sql.DB {
		// BEGIN IMMEDIATE: a transaction takes the write lock when it
		// begins; busy_timeout: a second writer waits for it.
		dsn := "file:" + filepath.Join(t.TempDir(), "fenced.db") + "?_txlock=immediate&_pragma=busy_timeout(20000)&_pragma=journal_mode(wal)"
		db, err := sql.Open("sqlite", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		prepare(t, sqlfence.SQLite, db)
		return db
	}}
	backends = []backend{pgBackend, sqliteBackend}
)

// prepare installs the fence schema and a stock table with one row.
func prepare(t *testing.T, d *sqlfence.Dialect, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	if err := d.Install(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := d.Install(ctx, db); err != nil { // idempotent
		t.Fatalf("second install: %v", err)
	}
	for _, stmt := range []string{
		"CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL, writer TEXT NOT NULL DEFAULT '')",
		"INSERT INTO stock (sku, qty) VALUES ('apple', 10)",
		"CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, fence BIGINT NOT NULL DEFAULT 0)",
		"INSERT INTO accounts (id, balance) VALUES (1, 100)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

// stock reads the apple row: its quantity and who wrote it last.
func stock(t *testing.T, b backend, db *sql.DB) (qty int, writer string) {
	t.Helper()
	if err := db.QueryRow("SELECT qty, writer FROM stock WHERE sku = 'apple'").Scan(&qty, &writer); err != nil {
		t.Fatal(err)
	}
	return qty, writer
}

// fenceOf reads a resource's fence (0: no row).
func fenceOf(t *testing.T, b backend, db *sql.DB, resource string) int64 {
	t.Helper()
	var f int64
	err := db.QueryRow(b.q("SELECT token FROM fencekv_fences WHERE resource = ?"), resource).Scan(&f)
	if err == sql.ErrNoRows {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// lockService serves a fencekv store on a fake clock, on a real socket,
// and dials it.
func lockService(t *testing.T) (*wire.Client, *fencekvtest.Clock, string) {
	t.Helper()
	clock := fencekvtest.NewClock()
	opts := fencekv.DefaultOptions()
	opts.NoSync = true
	opts.Clock = clock
	addr, _ := fencekvtest.Serve(t, &opts)
	return dial(t, addr), clock, addr
}

func dial(t *testing.T, addr string) *wire.Client {
	t.Helper()
	c, err := wire.Dial(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// expire runs the fake clock past l's TTL and waits until the server has
// expired it.
func expire(t *testing.T, c *wire.Client, clock *fencekvtest.Clock, l fencekv.Lease) {
	t.Helper()
	clock.Advance(l.TTL + time.Second)
	fencekvtest.Eventually(t, 10*time.Second, "the lease to expire", func() bool {
		in, err := c.LockInfo(context.Background(), l.Name)
		return err == nil && !in.Held
	})
}

// write is one holder's fenced update of the apple row: check, then write,
// then commit. It returns the check's error (the transaction rolled back).
func write(ctx context.Context, b backend, db *sql.DB, opts *sql.TxOptions, token fencekv.Token, qty int, writer string) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := b.d.Check(ctx, tx, "inventory", token); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, b.q("UPDATE stock SET qty = ?, writer = ? WHERE sku = 'apple'"), qty, writer); err != nil {
		return err
	}
	return tx.Commit()
}

// pipes starts cmd with its stdout read line by line and its stdin
// written by the test, and kills it (by its PID) if the test ends first.
func pipes(t *testing.T, cmd *exec.Cmd) (*bufio.Reader, io.WriteCloser) {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	return bufio.NewReader(out), in
}

// readLine reads one line, failing the test if the process ends first.
func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("the child process ended (%v) after %q", err, line)
	}
	return strings.TrimSuffix(line, "\n")
}
