//go:build unix

package wire_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// The tests in this file run real processes on the real clock: a client
// or a server is stopped with SIGSTOP, which no fake clock can stand in
// for. The children are this test binary run again (fencekvtest.Child);
// TestHelperClient and TestHelperServer are their bodies.

const (
	envAddr   = "FENCEKV_WIRE_ADDR"   // client: the server to dial
	envName   = "FENCEKV_WIRE_NAME"   // client: holder name, also the value it writes
	envTTL    = "FENCEKV_WIRE_TTL_MS" // client: lease TTL
	envWait   = "FENCEKV_WIRE_WAIT"   // client: "1" to wait for a line on stdin before writing
	envDir    = "FENCEKV_WIRE_DIR"    // server: data dir
	envListen = "FENCEKV_WIRE_LISTEN" // server: the address to listen on (default: a free port)

	seedLock = "inventory"
	seedKey  = "inventory/sku-1"
)

// say prints a line for the parent, which reads lines starting "helper: ".
func say(format string, args ...any) {
	fmt.Printf("helper: "+format+"\n", args...)
}

// TestHelperClient is client A or B of the seed scenario: it acquires the
// lock, says its token, optionally waits for a line on stdin, then writes
// its name to the key with its token and says what the server answered.
func TestHelperClient(t *testing.T) {
	fencekvtest.AsChild(t) // of TestSeedScenarioProcesses
	ctx := context.Background()
	name := os.Getenv(envName)
	ttl, err := strconv.Atoi(os.Getenv(envTTL))
	if err != nil {
		t.Fatal(err)
	}
	c, err := wire.Dial(ctx, os.Getenv(envAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, seedLock, time.Duration(ttl)*time.Millisecond, &fencekv.AcquireOptions{Holder: name})
	if err != nil {
		say("acquire %v", err)
		t.Fatal(err)
	}
	say("token %d", l.Token)
	if os.Getenv(envWait) == "1" {
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.Put(ctx, []byte(seedKey), []byte(name), fencekv.WriteOptions{Token: l.Token})
	var fe *fencekv.Error
	switch {
	case err == nil:
		say("put ok")
	case errors.As(err, &fe):
		say("put %s fence %d", fe.Code, fe.Fence)
	default:
		say("put failed: %v", err)
	}
}

// TestHelperServer is a fencekv server: it opens the store in the given
// dir, listens on 127.0.0.1 (on the given address, if any), says its
// address, and serves until stdin is closed; then it shuts down
// gracefully.
func TestHelperServer(t *testing.T) {
	fencekvtest.AsChild(t) // of TestWithLockServerPaused, TestClientServerRestart
	db, err := fencekv.Open(os.Getenv(envDir), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // after the server has shut down
	listen := os.Getenv(envListen)
	if listen == "" {
		_, addr := fencekvtest.ServeEngine(t, db, wire.DefaultConfig())
		say("addr %s", addr)
		io.Copy(io.Discard, os.Stdin)
		return
	}
	srv, err := wire.NewServer(db, wire.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	say("addr %s", ln.Addr())
	io.Copy(io.Discard, os.Stdin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Error(err)
	}
	<-served
}

// child is a helper process. Cleanup resumes it if it is stopped, kills
// it by its PID if it is still running, and reaps it.
type child struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string   // its stdout, line by line; closed at EOF
	exited chan struct{} // closed once it has been reaped
	err    error         // its exit status, once exited is closed
	stderr fencekvtest.Buffer
}

func startChild(t *testing.T, name, body string, env ...string) *child {
	t.Helper()
	cmd := fencekvtest.Child(body, nil, env...)
	c := &child{t: t, name: name, cmd: cmd, lines: make(chan string, 100), exited: make(chan struct{})}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.stdin = stdin
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = cmd.Wait() // after the last read from stdout, as Wait requires
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
			cmd.Process.Kill() // by PID
		}
		stdin.Close()
		go func() {
			for range c.lines { // drain, so the reader can reach Wait
			}
		}()
		<-c.exited
	})
	return c
}

// expect returns the rest of the child's next "helper: <prefix>" line,
// logging other output, and fails the test if none comes within d.
func (c *child) expect(prefix string, d time.Duration) string {
	c.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case line, open := <-c.lines:
			if !open {
				c.t.Fatalf("%s exited before saying %q; stderr:\n%s", c.name, prefix, c.stderr.String())
			}
			if rest, found := strings.CutPrefix(line, "helper: "+prefix); found {
				return strings.TrimSpace(rest)
			}
			c.t.Logf("%s: %s", c.name, line)
		case <-timeout:
			c.t.Fatalf("%s did not say %q within %v; stderr:\n%s", c.name, prefix, d, c.stderr.String())
		}
	}
}

func (c *child) signal(sig syscall.Signal) {
	c.t.Helper()
	if err := syscall.Kill(c.cmd.Process.Pid, sig); err != nil {
		c.t.Fatalf("signal %v to %s: %v", sig, c.name, err)
	}
}

// wait waits for the child to exit and fails the test unless it exited 0.
func (c *child) wait(d time.Duration) {
	c.t.Helper()
	go func() {
		for line := range c.lines {
			c.t.Logf("%s: %s", c.name, line)
		}
	}()
	select {
	case <-c.exited:
		if c.err != nil {
			c.t.Fatalf("%s exited with %v; stderr:\n%s", c.name, c.err, c.stderr.String())
		}
	case <-time.After(d):
		c.t.Fatalf("%s did not exit within %v", c.name, d)
	}
}

// TestSeedScenarioProcesses is the README's story over the wire, with real
// processes: client A gets token 33 and is stopped (SIGSTOP) past its
// lease; client B gets 34 and writes; A is resumed and writes with 33, and
// the store refuses it.
func TestSeedScenarioProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes and real time")
	}
	ts := startServer(t, nil)
	ctx := context.Background()
	for range 32 { // tokens 1..32, so that A gets 33 as in the story
		l, err := ts.DB.Acquire(ctx, "warmup", time.Second, nil)
		ok(t, err)
		ok(t, ts.DB.Release(ctx, "warmup", l.Token))
	}
	const ttl = 500 * time.Millisecond
	env := func(name, wait string) []string {
		return []string{envAddr + "=" + ts.Addr, envName + "=" + name, envTTL + "=" + strconv.Itoa(int(ttl.Milliseconds())), envWait + "=" + wait}
	}

	a := startChild(t, "client A", "TestHelperClient", env("A", "1")...)
	if tok := a.expect("token", 30*time.Second); tok != "33" {
		t.Fatalf("A's token %s; want 33", tok)
	}
	a.signal(syscall.SIGSTOP)
	paused := time.Now()
	// A is frozen; wait, on the real clock, until the server sees its
	// lease run out.
	c := dial(t, ts.Addr)
	eventually(t, 10*time.Second, "A's lease to expire", func() bool {
		in, err := c.LockInfo(ctx, seedLock)
		return err == nil && !in.Held
	})
	if waited := time.Since(paused); waited < ttl-50*time.Millisecond {
		t.Fatalf("A's lease ended %v after the pause; its TTL is %v", waited, ttl)
	}

	bc := startChild(t, "client B", "TestHelperClient", env("B", "0")...)
	if tok := bc.expect("token", 30*time.Second); tok != "34" {
		t.Fatalf("B's token %s; want 34", tok)
	}
	if res := bc.expect("put", 30*time.Second); res != "ok" {
		t.Fatalf("B's put: %s", res)
	}
	bc.wait(30 * time.Second)

	a.signal(syscall.SIGCONT)
	if _, err := io.WriteString(a.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if res := a.expect("put", 30*time.Second); res != "stale_token fence 34" {
		t.Fatalf("A's put after the pause: %q; want stale_token fence 34", res)
	}
	a.wait(30 * time.Second)

	e, err := c.Get(ctx, []byte(seedKey))
	ok(t, err)
	if string(e.Value) != "B" || e.Fence != 34 {
		t.Fatalf("%s = %q with fence %d; want B's write with fence 34", seedKey, e.Value, e.Fence)
	}
}

// TestWithLockServerPaused runs the server in a child process and stops it
// with SIGSTOP while a WithLock callback runs: the callback's context must
// be cancelled with ErrLeaseLost about one TTL after the renews stopped
// getting through, and not while they were.
func TestWithLockServerPaused(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes and real time")
	}
	srv := startChild(t, "server", "TestHelperServer", envDir+"="+t.TempDir())
	addr := srv.expect("addr", 30*time.Second)
	ctx := context.Background()
	c := dial(t, addr)

	const ttl, every = time.Second, 100 * time.Millisecond
	var stopped time.Time
	var lostAfter time.Duration
	var cause error
	var token fencekv.Token
	err := c.WithLock(ctx, "job", ttl, &wire.LockOptions{RenewEvery: every, ReleaseTimeout: 500 * time.Millisecond}, func(lctx context.Context, l fencekv.Lease) error {
		token = l.Token
		// While the server runs, renews keep the lease: twice its TTL
		// passes without a cancel.
		select {
		case <-lctx.Done():
			t.Errorf("cancelled while the server was running: %v", context.Cause(lctx))
			return nil
		case <-time.After(2 * ttl):
		}
		srv.signal(syscall.SIGSTOP)
		stopped = time.Now()
		select {
		case <-lctx.Done():
			lostAfter, cause = time.Since(stopped), context.Cause(lctx)
		case <-time.After(ttl + 10*time.Second):
			t.Errorf("not cancelled %v after the server was stopped", ttl+10*time.Second)
		}
		return nil
	})
	srv.signal(syscall.SIGCONT)
	if t.Failed() {
		return
	}
	if !errors.Is(err, wire.ErrLeaseLost) || !errors.Is(cause, wire.ErrLeaseLost) {
		t.Fatalf("WithLock = %v, cause %v; want ErrLeaseLost", err, cause)
	}
	// The client measures the lease from the send of the last renew that
	// got through, so it gives up at most TTL after the stop (plus timer
	// and scheduling slack): never later than the server could expire the
	// lease. It may give up earlier when renews were slow to come back on
	// a loaded machine (it renews one at a time): that is safe, and what
	// matters above is that it held on while the server ran.
	if lostAfter < ttl/4 || lostAfter > ttl+time.Second {
		t.Fatalf("cancelled %v after the server stopped; want about %v", lostAfter, ttl)
	}
	t.Logf("cancelled %v after SIGSTOP (TTL %v, renew every %v): %v", lostAfter, ttl, every, cause)

	// The resumed server has measured the same lease on its own clock, from
	// later: it expires there too, and a held write with the token is
	// refused.
	eventually(t, 10*time.Second, "the resumed server to expire the lease", func() bool {
		in, err := c.LockInfo(ctx, "job")
		return err == nil && !in.Held
	})
	_, err = c.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{Token: token, Lock: "job"})
	wantCode(t, err, fencekv.CodeLeaseExpired)

	// Stop the server: closing its stdin asks for a graceful shutdown.
	c.Close()
	srv.stdin.Close()
	srv.wait(30 * time.Second)
}

// TestClientServerRestart restarts the server (a real process, stopped
// gracefully and started again on the same address and data dir) under a
// client that holds a lock with WithLock: while the server is down, calls
// fail with a *ConnError and nothing sent; once it is back, calls work on
// a new connection, and the renews go on, so the lock is kept and the
// callback's context is never cancelled.
func TestClientServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes and real time")
	}
	dir := t.TempDir()
	srv := startChild(t, "server", "TestHelperServer", envDir+"="+dir)
	addr := srv.expect("addr", 30*time.Second)
	ctx := context.Background()
	c := dial(t, addr)
	_, err := c.Put(ctx, []byte("k"), []byte("before"), fencekv.WriteOptions{})
	ok(t, err)

	const ttl = 4 * time.Second
	held := make(chan fencekv.Lease)
	restarted := make(chan struct{})
	locked := make(chan error, 1)
	go func() {
		locked <- c.WithLock(ctx, "job", ttl, nil, func(lctx context.Context, l fencekv.Lease) error {
			held <- l
			<-restarted
			// Past the TTL after the server came back, only renews sent
			// through the new connection can have kept the lease.
			select {
			case <-lctx.Done():
				return context.Cause(lctx)
			case <-time.After(ttl + ttl/2):
			}
			_, err := c.Put(lctx, []byte("k"), []byte("held"), fencekv.WriteOptions{Token: l.Token, Lock: "job"})
			return err
		})
	}()
	l := <-held

	srv.stdin.Close() // a graceful shutdown
	srv.wait(30 * time.Second)
	down := time.Now()
	_, err = c.Get(ctx, []byte("k"))
	if !errors.Is(err, wire.ErrClientClosed) {
		t.Fatalf("get while the server is down = %v; want ErrClientClosed", err)
	}
	_, err = c.Put(ctx, []byte("k"), []byte("while down"), fencekv.WriteOptions{})
	wantConnError(t, err, "")

	srv = startChild(t, "server again", "TestHelperServer", envDir+"="+dir, envListen+"="+addr)
	srv.expect("addr", 30*time.Second)
	t.Logf("the server was down for %v", time.Since(down))
	eventually(t, 10*time.Second, "a call to work after the restart", func() bool {
		_, err := c.Ping(ctx)
		return err == nil
	})
	e, err := c.Get(ctx, []byte("k"))
	if err != nil || string(e.Value) != "before" {
		t.Fatalf("get after the restart = %q, %v; want before", e.Value, err)
	}
	close(restarted)
	select {
	case err := <-locked:
		ok(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("WithLock did not return")
	}
	in, err := c.LockInfo(ctx, "job")
	if err != nil || in.Held {
		t.Fatalf("lock after WithLock = %+v, %v; want released", in, err)
	}
	if e, err := c.Get(ctx, []byte("k")); err != nil || string(e.Value) != "held" || e.Fence != l.Token {
		t.Fatalf("k = %q (fence %d), %v; want the held write with token %d", e.Value, e.Fence, err, l.Token)
	}
	c.Close()
	srv.stdin.Close()
	srv.wait(30 * time.Second)
}
