package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv/sqlfence"
)

// The test binary runs the example's main when asked: each move is a
// process of its own, as a user runs it.
func TestMain(m *testing.M) {
	if os.Getenv("INVENTORY_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestInventory runs the example against a real PostgreSQL and a real
// fencekv server: a move, a move refused for want of stock, one refused
// for a stale token (nothing written), and three at once.
func TestInventory(t *testing.T) {
	pgbin := postgresBin()
	if pgbin == "" {
		t.Skip("no PostgreSQL server (apt-get install postgresql, or set FENCEKV_PG_BIN)")
	}
	addr := startFencekv(t)
	dsn := startPostgres(t, pgbin)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := sqlfence.Postgres.Install(ctx, db); err != nil {
		t.Fatal(err)
	}
	exec1 := func(q string) {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec1("CREATE TABLE inventory (sku text PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0))")
	exec1("INSERT INTO inventory VALUES ('apple', 100), ('pear', 100)")
	qty := func(sku string) (n int) {
		if err := db.QueryRowContext(ctx, "SELECT qty FROM inventory WHERE sku = $1", sku).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "INVENTORY_RUN_MAIN=1", "FENCEKV_ADDR="+addr, "DATABASE_URL="+dsn)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}

	out, err := run("apple", "pear", "5")
	if err != nil || !regexp.MustCompile(`^moved 5 from apple to pear under token \d+: apple 95, pear 105$`).MatchString(out) {
		t.Fatalf("move: %v: %s", err, out)
	}
	if out, err := run("apple", "pear", "1000"); err == nil || !strings.Contains(out, "not that many") {
		t.Fatalf("not enough apples: %v: %s", err, out)
	}
	exec1("UPDATE fencekv_fences SET token = 9000000000000000000 WHERE resource = 'inventory'")
	if out, err := run("pear", "apple", "1"); err == nil || !strings.Contains(out, "refused, nothing written") || !strings.Contains(out, "9000000000000000000") {
		t.Fatalf("stale token: %v: %s", err, out)
	}
	if qty("apple") != 95 || qty("pear") != 105 {
		t.Fatalf("a refused move changed the table: apple %d, pear %d", qty("apple"), qty("pear"))
	}
	exec1("DELETE FROM fencekv_fences")

	var wg sync.WaitGroup
	outs := make([]string, 3)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := run("pear", "apple", "2")
			outs[i] = fmt.Sprint(o, err)
		}()
	}
	wg.Wait()
	tokens := map[string]bool{}
	for _, o := range outs {
		m := regexp.MustCompile(`^moved 2 from pear to apple under token (\d+): .*<nil>$`).FindStringSubmatch(o)
		if m == nil {
			t.Fatalf("concurrent move: %s", o)
		}
		tokens[m[1]] = true
	}
	if len(tokens) != 3 || qty("pear") != 99 || qty("apple") != 101 {
		t.Fatalf("3 concurrent moves: tokens %v, apple %d, pear %d", tokens, qty("apple"), qty("pear"))
	}
}

func postgresBin() string {
	if d := os.Getenv("FENCEKV_PG_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d
		}
		return ""
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	sort.Strings(dirs) // one digit more sorts after; fine for 12..99
	if len(dirs) == 0 {
		return ""
	}
	return filepath.Dir(dirs[len(dirs)-1])
}

// startFencekv runs fencekv serve ($FENCEKV_BIN, or built from the tree)
// on a port it picks, and returns its address.
func startFencekv(t *testing.T) string {
	bin := os.Getenv("FENCEKV_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "fencekv")
		build := exec.Command("go", "build", "-o", bin, "./cmd/fencekv")
		build.Dir = "../../.."
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build fencekv: %v\n%s", err, out)
		}
	}
	cmd := exec.Command(bin, "serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--http", "")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`msg="fencekv serving".* addr=(\S+)`)
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			if m := re.FindStringSubmatch(s.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case a := <-found:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("fencekv serve did not start")
		return ""
	}
}

// startPostgres runs initdb and postgres (as nobody when root: PostgreSQL
// refuses root) on a free loopback port, creates a database, returns its URL.
func startPostgres(t *testing.T, bin string) string {
	dir, err := os.MkdirTemp("", "fencekv-inventory-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	attr := &syscall.SysProcAttr{}
	if os.Geteuid() == 0 {
		attr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
		os.Chown(dir, 65534, 65534)
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "fencekv", "-A", "trust", "-E", "UTF8", "--no-sync")
	initdb.Dir, initdb.SysProcAttr, initdb.Env = dir, attr, append(os.Environ(), "LC_ALL=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	pg := exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"), "-p", fmt.Sprint(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off")
	pg.Dir, pg.SysProcAttr, pg.Env = dir, attr, append(os.Environ(), "LC_ALL=C")
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Process.Signal(os.Interrupt); pg.Wait() })
	admin, _ := sql.Open("pgx", fmt.Sprintf("postgres://fencekv@127.0.0.1:%d/postgres", port))
	defer admin.Close()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err = admin.Exec("CREATE DATABASE shop"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres did not start: %v", err)
		}
	}
	return fmt.Sprintf("postgres://fencekv@127.0.0.1:%d/shop", port)
}
