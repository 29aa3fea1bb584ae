package sqlfencetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// A PostgreSQL server of the test run's own: initdb into a temporary
// directory, postgres on a free loopback port, stopped by its PID.
type postgres struct {
	cmd    *exec.Cmd
	exited chan error // the server's exit, once it has exited (kept for every reader)
	dir    string
	port   int
	dbs    atomic.Int64 // databases created, for their names
}

var (
	pg     *postgres
	pgSkip string // why pg is nil
)

// postgresBin finds a PostgreSQL server's binaries: $FENCEKV_PG_BIN, or
// Debian's newest /usr/lib/postgresql/N/bin.
func postgresBin() (string, error) {
	if dir := os.Getenv("FENCEKV_PG_BIN"); dir != "" {
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a > b
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server (apt-get install postgresql, or set FENCEKV_PG_BIN)")
}

// startPostgres starts the server. Run as root, it runs initdb and
// postgres as nobody, since PostgreSQL refuses to run as root.
func startPostgres() (*postgres, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fencekv-sqlfencetest-")
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 65534, Gid: 65534}
		if err := os.Chown(dir, 65534, 65534); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
		return cmd
	}
	data := filepath.Join(dir, "data")
	if out, err := run("initdb", "-D", data, "-U", "fencekv", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		log, err := os.Create(filepath.Join(dir, "postgres.log"))
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		cmd := run("postgres", "-D", data, "-p", strconv.Itoa(port), "-k", dir,
			"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=60")
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			log.Close()
			os.RemoveAll(dir)
			return nil, err
		}
		p := &postgres{cmd: cmd, exited: make(chan error, 1), dir: dir, port: port}
		go func() { p.exited <- cmd.Wait(); log.Close() }()
		if err := p.ready(); err != nil {
			out, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			if attempt < 3 && !p.running() {
				continue // the port was taken between freePort and the bind
			}
			p.stop()
			os.RemoveAll(dir)
			return nil, fmt.Errorf("postgres: %v\n%s", err, out)
		}
		return p, nil
	}
}

func (p *postgres) running() bool {
	select {
	case err := <-p.exited:
		p.exited <- err
		return false
	default:
		return true
	}
}

// ready waits until the server accepts connections, or exits.
func (p *postgres) ready() error {
	db, err := sql.Open("pgx", p.dsn("postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if !p.running() {
			return fmt.Errorf("exited before it was ready: %v", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within a minute: %v", err)
		}
		select {
		case e := <-p.exited:
			p.exited <- e
		case <-time.After(wait):
		}
	}
}

// stop shuts the server down fast (SIGINT to its PID) and waits for it.
func (p *postgres) stop() {
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

func (p *postgres) dsn(db string) string {
	return fmt.Sprintf("postgres://fencekv@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

// newDB creates a database of the test's own and opens it.
func (p *postgres) newDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	admin, err := sql.Open("pgx", p.dsn("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	name := fmt.Sprintf("t%d", p.dbs.Add(1))
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", p.dsn(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, p.dsn(name)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func TestMain(m *testing.M) {
	if os.Getenv("FENCEKVTEST_CHILD") != "" {
		os.Exit(m.Run()) // a child process: it connects to its parent's servers
	}
	var err error
	if pg, err = startPostgres(); err != nil {
		pgSkip = err.Error()
		fmt.Fprintf(os.Stderr, "sqlfencetest: PostgreSQL tests skipped: %v\n", err)
	}
	code := m.Run()
	removeBin()
	if pg != nil {
		pg.stop()
		os.RemoveAll(pg.dir)
	}
	os.Exit(code)
}

// needPostgres skips t where no PostgreSQL server could be started.
func needPostgres(t *testing.T) {
	t.Helper()
	if pg == nil {
		t.Skip("PostgreSQL: " + pgSkip)
	}
}
