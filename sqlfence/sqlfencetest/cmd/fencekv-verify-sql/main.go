// Command fencekv-verify-sql runs fencekv verify's pause rounds and
// inventory run against a database fenced with fencekv's tokens
// (package sqlfence): fencekv grants the locks, the database refuses the
// stale writes.
//
//	fencekv-verify-sql --addr 127.0.0.1:7420 --sql postgres://user@host/db
//	fencekv-verify-sql --addr 127.0.0.1:7420 --sql sqlite:/tmp/fenced.db
//
// A client process acquires a lock and is stopped with SIGSTOP before its
// write, past its lease; a newer holder acquires and writes; the stopped
// client resumes and writes with its old token, and the database must
// refuse it. Then clients update two counters under one lock, some paused
// past the lease, and each counter must equal its acknowledged updates.
//
// It installs the fence schema (sqlfence's, idempotent) and a table
// fencekv_verify for its scratch rows, which it deletes at the end. The
// report and exit statuses are fencekv verify's: 0 no violation, 1 the run
// could not finish, 2 bad arguments, 7 a stale write was accepted.
//
// It is a program of its own, not a mode of the fencekv binary, so that
// the database drivers stay out of fencekv's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fencekv/fencekv/verify"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"
)

const (
	exitError     = 1
	exitUsage     = 2
	exitViolation = 7
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "client" {
		return client(args[1:], stdin, stdout, stderr)
	}
	fs := flag.NewFlagSet("fencekv-verify-sql", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:7420", "the fencekv server (or a cluster's nodes, comma-separated)")
	dsn := fs.String("sql", "", "the database: postgres://... or sqlite:PATH")
	rounds := fs.Int("rounds", verify.Defaults.Rounds, "pause-injection rounds")
	ttl := fs.Duration("ttl", verify.Defaults.TTL, "lease length of the rounds and the inventory run")
	clients := fs.Int("clients", verify.Defaults.Clients, "inventory clients, and pause rounds run at once")
	updates := fs.Int("updates", verify.Defaults.Updates, "inventory updates")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 || *dsn == "" || *rounds < 0 || *updates < 0 || *clients <= 0 || *ttl <= 0 {
		fmt.Fprintln(stderr, "usage: fencekv-verify-sql --sql postgres://...|sqlite:PATH [--addr ADDR] [--rounds N] [--ttl D] [--clients N] [--updates N]")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t, err := openTarget(ctx, *dsn)
	if err != nil {
		fmt.Fprintln(stderr, "fencekv-verify-sql:", err)
		return exitUsage
	}
	defer t.db.Close()
	if err := t.install(ctx); err != nil {
		fmt.Fprintln(stderr, "fencekv-verify-sql:", err)
		return exitError
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "fencekv-verify-sql:", err)
		return exitError
	}
	rep, err := verify.Run(ctx, verify.Config{
		Addr: *addr, Rounds: *rounds, TTL: *ttl, Clients: *clients, Updates: *updates,
		Client: func(args []string) *exec.Cmd {
			return exec.Command(self, append([]string{"client", "-sql", *dsn, "--"}, args...)...)
		},
		Progress: stderr,
		Target:   t,
	})
	if rep != nil {
		fmt.Fprintf(stdout, "target: %s database (%s)\n", t.d, redact(*dsn))
		fmt.Fprint(stdout, rep.String())
	}
	if err != nil {
		fmt.Fprintln(stderr, "fencekv-verify-sql: verify could not finish:", err)
		return exitError
	}
	if !rep.OK() {
		return exitViolation
	}
	return 0
}

// client is the paused client: verify's, writing to the database.
func client(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fencekv-verify-sql client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("sql", "", "the database")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	t, err := openTarget(context.Background(), *dsn)
	if err != nil {
		fmt.Fprintf(stdout, "error %v\n", err)
		return exitError
	}
	defer t.db.Close()
	return verify.ClientMainTarget(fs.Args(), stdin, stdout, nil, t)
}

// redact drops a password from a DSN for the report.
func redact(dsn string) string {
	if i, j := strings.Index(dsn, "://"), strings.LastIndex(dsn, "@"); i >= 0 && j > i {
		if k := strings.Index(dsn[i+3:j], ":"); k >= 0 {
			return dsn[:i+3+k] + ":xxx" + dsn[j:]
		}
	}
	return dsn
}

var errDSN = errors.New("--sql: want postgres://... (or postgresql://...) or sqlite:PATH")

// waitBusy is how long an SQLite writer waits for another's lock.
const waitBusy = 30 * time.Second
