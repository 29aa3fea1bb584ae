package sqlfencetest

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/sqlfence"
	"github.com/fencekv/fencekv/wire"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlstate is err's PostgreSQL SQLSTATE, or "".
func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// TestPostgresOverlap: the stale holder's transaction began first and
// tries to commit last, under each isolation level. Its write never lands:
// under READ COMMITTED the check refuses it (stale_token); under
// REPEATABLE READ and SERIALIZABLE PostgreSQL may refuse the check's
// upsert first with a serialization failure (40001), and the retry, in a
// new transaction, is refused as stale.
func TestPostgresOverlap(t *testing.T) {
	needPostgres(t)
	for _, level := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
		t.Run(level.String(), func(t *testing.T) {
			b := pgBackend
			db := b.open(t)
			ctx := context.Background()
			opts := &sql.TxOptions{Isolation: level}
			const older, newer = 33, 34
			// Both have written before: the fence row exists.
			if err := write(ctx, b, db, opts, older-1, 9, "earlier"); err != nil {
				t.Fatal(err)
			}
			a, err := db.BeginTx(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Rollback()
			var qty int
			if err := a.QueryRowContext(ctx, "SELECT qty FROM stock WHERE sku = 'apple'").Scan(&qty); err != nil {
				t.Fatal(err) // A's snapshot, under the stricter levels, is taken here
			}
			if err := write(ctx, b, db, opts, newer, 7, "B"); err != nil {
				t.Fatalf("B's write: %v", err)
			}
			err = b.d.Check(ctx, a, "inventory", older)
			switch {
			case errors.Is(err, fencekv.ErrStaleToken):
			case level != sql.LevelReadCommitted && sqlstate(err) == "40001":
				a.Rollback()
				err = write(ctx, b, db, opts, older, 3, "A")
				if !errors.Is(err, fencekv.ErrStaleToken) {
					t.Fatalf("A's retry: %v; want stale_token", err)
				}
			default:
				t.Fatalf("A's check with %d: %v; want stale_token (or 40001 under %v)", older, err, level)
			}
			a.Rollback()
			if qty, w := stock(t, b, db); qty != 7 || w != "B" {
				t.Fatalf("row = %d by %q; want B's 7", qty, w)
			}
		})
	}
}

// waitersOn counts the sessions of db's database waiting for a lock.
func waitersOn(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	err := db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPostgresCheckedThenPaused is what the fence does not promise: A
// passed the check, then paused holding the fence row's lock; B, the newer
// holder, waits at its check, and A's write lands first when A resumes.
// The commits still come in token order, and B's is last; lock_timeout
// bounds B's wait.
func TestPostgresCheckedThenPaused(t *testing.T) {
	b := pgBackend
	db := b.open(t)
	ctx := context.Background()
	a, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback()
	if err := b.d.Check(ctx, a, "inventory", 33); err != nil {
		t.Fatal(err)
	}
	// lock_timeout bounds the newer holder's wait: refused, 55P03.
	err = func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '50ms'"); err != nil {
			return err
		}
		return b.d.Check(ctx, tx, "inventory", 34)
	}()
	if sqlstate(err) != "55P03" {
		t.Fatalf("B's check under lock_timeout while A holds the row: %v; want 55P03 lock_not_available", err)
	}
	// Without it, B waits for A.
	done := make(chan error, 1)
	go func() { done <- write(ctx, b, db, nil, 34, 7, "B") }()
	fencekvtest.Eventually(t, 10*time.Second, "B to wait for the fence row's lock", func() bool { return waitersOn(t, db) == 1 })
	if _, err := a.ExecContext(ctx, "UPDATE stock SET qty = 3, writer = 'A' WHERE sku = 'apple'"); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(); err != nil {
		t.Fatalf("A's commit: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("B's write after A's commit: %v", err)
	}
	if qty, w := stock(t, b, db); qty != 7 || w != "B" {
		t.Fatalf("row = %d by %q; want B's 7, committed after A's", qty, w)
	}
	if f := fenceOf(t, b, db, "inventory"); f != 34 {
		t.Fatalf("fence = %d; want 34", f)
	}
}

// TestPostgresFunction: fencekv_fence, for programs in any language:
// SQLSTATE FK001 with the fence in the message and detail, and the
// transaction cannot commit.
func TestPostgresFunction(t *testing.T) {
	b := pgBackend
	db := b.open(t)
	ctx := context.Background()
	var got int64
	if err := db.QueryRowContext(ctx, "SELECT fencekv_fence('inventory', 34)").Scan(&got); err != nil || got != 34 {
		t.Fatalf("fencekv_fence 34 = %d, %v", got, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "UPDATE stock SET qty = 1 WHERE sku = 'apple'"); err != nil {
		t.Fatal(err)
	}
	err = tx.QueryRowContext(ctx, "SELECT fencekv_fence('inventory', 33)").Scan(&got)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "FK001" || pe.Detail != "fence=34 token=33" ||
		pe.Message != "stale_token: inventory is fenced at 34; token 33 refused" {
		t.Fatalf("stale fencekv_fence: %#v; want FK001 naming the fence", err)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("a transaction that raised FK001 committed")
	}
	if qty, _ := stock(t, b, db); qty != 10 {
		t.Fatalf("qty = %d after the refused transaction; want 10", qty)
	}
	for _, bad := range []string{"0", "-1", "NULL"} {
		err := db.QueryRowContext(ctx, "SELECT fencekv_fence('inventory', "+bad+")").Scan(&got)
		if sqlstate(err) != "22023" {
			t.Errorf("fencekv_fence token %s: %v; want 22023", bad, err)
		}
	}
	if f := fenceOf(t, b, db, "inventory"); f != 34 {
		t.Fatalf("fence = %d; want 34", f)
	}
}

// TestPostgresKilledInTransaction: a holder killed with -9 after its
// check and write, before its commit: PostgreSQL rolls its transaction
// back, its raise of the fence with it, and the row lock is freed.
func TestPostgresKilledInTransaction(t *testing.T) {
	b := pgBackend
	db, dsn := pgDB(t)
	ctx := context.Background()
	if err := write(ctx, b, db, nil, 30, 9, "earlier"); err != nil {
		t.Fatal(err)
	}
	cmd := fencekvtest.Child("TestHelperHolder", []string{dsn, "40", "hold"})
	out, stdin := pipes(t, cmd)
	if line := readLine(t, out); line != "written" {
		t.Fatalf("holder said %q; want written", line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	stdin.Close()
	// Its raise to 40 is gone: a holder of 35 passes, and the row lock is
	// free (the write does not wait).
	if err := write(ctx, b, db, nil, 35, 5, "next"); err != nil {
		t.Fatalf("write with 35 after the kill: %v", err)
	}
	if qty, w := stock(t, b, db); qty != 5 || w != "next" {
		t.Fatalf("row = %d by %q; want 5 by next (the killed holder's write rolled back)", qty, w)
	}
}

// TestPostgresPausedHolder is the seed with a real pause: holder A, a
// process of its own, gets the lock and is stopped with SIGSTOP before its
// write; its lease runs out on the server's real clock; B gets the lock
// and writes; A is continued, and its write is refused by the database.
func TestPostgresPausedHolder(t *testing.T) {
	b := pgBackend
	db, dsn := pgDB(t)
	opts := fencekv.DefaultOptions()
	opts.NoSync = true
	addr, _ := fencekvtest.Serve(t, &opts)
	c := dial(t, addr)
	ctx := context.Background()

	cmd := fencekvtest.Child("TestHelperHolder", []string{dsn, "acquire:" + addr, "wait"})
	out, stdin := pipes(t, cmd)
	line := readLine(t, out)
	aToken, err := strconv.ParseUint(strings.TrimPrefix(line, "token "), 10, 64)
	if err != nil {
		t.Fatalf("holder said %q; want its token", line)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	fencekvtest.Eventually(t, 20*time.Second, "A's lease to run out", func() bool {
		in, err := c.LockInfo(ctx, "inventory")
		return err == nil && !in.Held
	})
	bl, err := c.Acquire(ctx, "inventory", 10*time.Second, nil)
	if err != nil || bl.Token <= fence.Token(aToken) {
		t.Fatalf("B's acquire: %v, %v; want a token above %d", bl.Token, err, aToken)
	}
	if err := write(ctx, b, db, nil, bl.Token, 7, "B"); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, "go")
	if line, want := readLine(t, out), fmt.Sprintf("stale %d", bl.Token); line != want {
		t.Fatalf("A, continued, said %q; want %q", line, want)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	if qty, w := stock(t, b, db); qty != 7 || w != "B" {
		t.Fatalf("row = %d by %q; want B's 7", qty, w)
	}
}

// TestHelperHolder is a holder process: args DSN TOKEN-OR-acquire:ADDR
// MODE. It gets its token (given, or acquired from the fencekv server at
// ADDR with a TTL of 500ms and no renew); then, in mode hold, checks,
// writes and says "written" and waits to be killed; in mode wait, says
// "token N", waits for a line on stdin, then checks and writes and says
// "stale FENCE" or "wrote".
func TestHelperHolder(t *testing.T) {
	args := fencekvtest.AsChild(t)
	db, err := sql.Open("pgx", args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	var token fence.Token
	if addr, ok := strings.CutPrefix(args[1], "acquire:"); ok {
		c, err := wire.Dial(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Acquire(ctx, "inventory", 500*time.Millisecond, nil)
		if err != nil {
			t.Fatal(err)
		}
		token = l.Token
	} else {
		n, _ := strconv.ParseUint(args[1], 10, 64)
		token = fence.Token(n)
	}
	switch args[2] {
	case "hold":
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := sqlfence.Postgres.Check(ctx, tx, "inventory", token); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE stock SET qty = 1, writer = 'killed' WHERE sku = 'apple'"); err != nil {
			t.Fatal(err)
		}
		fmt.Println("written")
		io.Copy(io.Discard, os.Stdin) // until killed
	case "wait":
		fmt.Printf("token %d\n", token)
		bufio.NewReader(os.Stdin).ReadString('\n')
		err := write(ctx, pgBackend, db, nil, token, 3, "A")
		var fe *fence.Error
		switch {
		case err == nil:
			fmt.Println("wrote")
		case errors.As(err, &fe) && fe.Code == fence.CodeStaleToken:
			fmt.Printf("stale %d\n", fe.Fence)
		default:
			t.Fatal(err)
		}
	}
}

// pgDB is a fresh prepared database and its DSN, for child processes.
func pgDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	needPostgres(t)
	db, dsn := pg.newDB(t)
	prepare(t, sqlfence.Postgres, db)
	return db, dsn
}
