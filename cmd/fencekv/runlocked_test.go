package main

// End-to-end tests of 'fencekv run-locked': the child's environment and
// exit status, mutual exclusion between concurrent run-locked processes,
// and what happens when the lease is lost while the child runs.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv/cluster/clustertest"
)

// readFile returns the file's content, or "" if it does not exist yet.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// childInfo waits for a child to write "PID TOKEN" to path, and kills the
// child's process group when the test ends in case it outlived run-locked.
func childInfo(t *testing.T, path string) (pid int, token uint64) {
	t.Helper()
	var f []string
	waitFor(t, 10*time.Second, "the child to write "+filepath.Base(path), func() bool {
		f = strings.Fields(readFile(t, path))
		return len(f) == 2
	})
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatalf("%s: %q", path, f)
	}
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	return pid, parseToken(t, f[1])
}

// wantGone checks that a process no longer runs: it is gone, or a zombie
// waiting to be reaped (a command killed together with its guard is
// reaped by init, a moment later).
func wantGone(t *testing.T, pid int) {
	t.Helper()
	if !gone(pid) {
		t.Errorf("process %d still runs", pid)
	}
}

// gone reports whether a process no longer runs (see wantGone).
func gone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH || zombie(pid)
}

// A child script that records its pid and token, then sleeps.
const recordAndSleep = `echo $$ $FENCEKV_TOKEN > "$DIR/$FENCEKV_LOCK"; exec sleep 30`

func TestRunLockedEnv(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	// --addr, not FENCEKV_ADDR: the child is told the address either way.
	c := &shell{t: t}
	out := c.ok("run-locked", "jobs/env", "--addr", s.addr, "--", "sh", "-c", `echo "$FENCEKV_TOKEN $FENCEKV_LOCK $FENCEKV_ADDR"`)
	f := strings.Fields(out)
	if len(f) != 3 {
		t.Fatalf("child printed %q, want token, lock and address", out)
	}
	tok := parseToken(t, f[0])
	wantEqual(t, "FENCEKV_LOCK", f[1], "jobs/env")
	wantEqual(t, "FENCEKV_ADDR", f[2], s.addr)

	// The lock is released when the child ends, and the token is the lock's.
	sc := s.shell(t)
	wantFields(t, sc.jsonOK("lock", "info", "jobs/env"), map[string]any{"held": false})
	if next := parseToken(t, sc.ok("lock", "acquire", "jobs/env")); next <= tok {
		t.Errorf("token after run-locked = %d, want above %d", next, tok)
	}

	// The child's writes with its token are fenced writes; its arguments
	// after "--" are its own, flags included.
	c = s.shell(t, "FENCEKV_BIN="+bin)
	c.ok("run-locked", "jobs/w", "--", "sh", "-c", `"$FENCEKV_BIN" put out --token "$FENCEKV_TOKEN" --lock "$FENCEKV_LOCK" -- "$1"`, "sh", "--json")
	m := sc.jsonOK("get", "out")
	wantFields(t, m, map[string]any{"value": "--json"})
	if fence := m["fence"].(float64); fence <= float64(tok) {
		t.Errorf("fence after the child's write = %v, want above %d", fence, tok)
	}
}

func TestRunLockedExitStatus(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)
	for _, tc := range []struct {
		argv []string
		want int
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "exit 7"}, 7},
		{[]string{"sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM)},
		{[]string{"/nonexistent/command"}, 127},
	} {
		args := append([]string{"run-locked", "jobs/status", "--"}, tc.argv...)
		if r := c.run(args...); r.code != tc.want {
			t.Errorf("want exit %d, got %v", tc.want, r)
		}
		wantFields(t, c.jsonOK("lock", "info", "jobs/status"), map[string]any{"held": false})
	}
}

// TestRunLockedMutualExclusion: run-locked processes started together on
// one name run their commands one after the other, with increasing tokens.
func TestRunLockedMutualExclusion(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	log, release := filepath.Join(dir, "log"), filepath.Join(dir, "release")
	c := s.shell(t, "LOG="+log, "RELEASE="+release)
	// Each child marks its start, holds on until the test creates the
	// release file, then marks its end.
	script := `echo "start $FENCEKV_TOKEN" >> "$LOG"
while [ ! -e "$RELEASE" ]; do sleep 0.01; done
echo "end $FENCEKV_TOKEN" >> "$LOG"`
	const n = 3
	ps := make([]*proc, n)
	for i := range ps {
		ps[i] = c.start("run-locked", "mx", "--wait", "20s", "--", "sh", "-c", script)
	}
	// One runs; the others queue on the server.
	waitFor(t, 10*time.Second, "one command to start", func() bool {
		return strings.Contains(readFile(t, log), "start")
	})
	waitFor(t, 10*time.Second, "the others to queue", func() bool {
		return c.jsonOK("lock", "info", "mx")["waiters"] == float64(n-1)
	})
	if got := readFile(t, log); strings.Count(got, "start") != 1 {
		t.Fatalf("with the lock held by one, the log is %q", got)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if r := p.wait(t, 20*time.Second); r.code != 0 {
			t.Errorf("want exit 0, got %v", r)
		}
	}

	lines := strings.Split(strings.TrimSpace(readFile(t, log)), "\n")
	if len(lines) != 2*n {
		t.Fatalf("log has %d lines, want %d: %q", len(lines), 2*n, lines)
	}
	var last uint64
	for i := 0; i < len(lines); i += 2 {
		var start, end uint64
		if _, err := fmt.Sscanf(lines[i], "start %d", &start); err != nil {
			t.Fatalf("line %d: %q, want a start: %v", i, lines[i], err)
		}
		if _, err := fmt.Sscanf(lines[i+1], "end %d", &end); err != nil || end != start {
			t.Fatalf("line %d: %q, want the end of %d (overlap?): %q", i+1, lines[i+1], start, lines)
		}
		if start <= last {
			t.Errorf("token %d ran after token %d, want increasing", start, last)
		}
		last = start
	}
}

// TestRunLockedWaitRunsOut: exit 4 when the lock stays held for all of
// --wait, and the command does not run.
func TestRunLockedWaitRunsOut(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)
	c.ok("lock", "acquire", "busy", "--ttl", "30s")
	ran := filepath.Join(t.TempDir(), "ran")
	r := c.fails(exitLockHeld, "run-locked", "busy", "--wait", "300ms", "--", "touch", ran)
	wantContains(t, "stderr", r.stderr, "lock_held")
	if _, err := os.Stat(ran); err == nil {
		t.Error("the command ran without the lock")
	}
}

// TestRunLockedServerPaused: the server stops answering (SIGSTOP) past the
// TTL. run-locked cannot renew, so it stops the command within about the
// TTL and exits 3: with SIGTERM, or with SIGKILL after --grace for a
// command that ignores SIGTERM. After the server resumes, the lease has
// expired and the old token no longer holds the lock.
func TestRunLockedServerPaused(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "paused"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := s.shell(t, "DIR="+dir)
	polite := c.start("run-locked", "paused/polite", "--ttl", "1s", "--", "sh", "-c", recordAndSleep)
	stubborn := c.start("run-locked", "paused/stubborn", "--ttl", "1s", "--grace", "300ms", "--",
		"sh", "-c", `trap "" TERM; echo $$ $FENCEKV_TOKEN > "$DIR/$FENCEKV_LOCK"; sleep 30; echo survived`)
	pid1, tok1 := childInfo(t, filepath.Join(dir, "paused", "polite"))
	pid2, _ := childInfo(t, filepath.Join(dir, "paused", "stubborn"))

	s.signal(t, syscall.SIGSTOP)
	paused := time.Now()
	// The signal is delivered to every thread in turn: wait until none
	// runs, or the first request could still be answered.
	waitFor(t, 10*time.Second, "the server's threads to stop", func() bool { return stopped(s.cmd.Process.Pid) })
	t.Cleanup(func() { syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT) })
	// A client command gives up on the silent server after --timeout.
	start := time.Now()
	c.fails(exitError, "get", "k", "--timeout", "300ms")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("get --timeout 300ms took %v", d)
	}
	wantFields(t, decodeJSON(t, c.fails(exitError, "get", "k", "--timeout", "300ms", "--json").stdout), map[string]any{"error": "timeout"})
	waitFor(t, 10*time.Second, "both commands to be stopped", func() bool { return gone(pid1) && gone(pid2) })
	// The lease of 1s is measured from the last renew's send, up to a
	// third of the TTL before the pause; then 300ms of grace.
	if d := time.Since(paused); d > 3*time.Second {
		t.Errorf("commands stopped %v after the server paused, want about the TTL (1s)", d)
	}
	// Then run-locked tries to release the lock (for up to the TTL) and
	// exits.
	for _, p := range []*proc{polite, stubborn} {
		r := p.wait(t, 10*time.Second)
		wantEqual(t, "run-locked exit status", r.code, exitFenced)
		wantContains(t, "run-locked stderr", r.stderr, "lease lost")
		if strings.Contains(r.stdout, "survived") {
			t.Errorf("the command outlived its lease: %v", r)
		}
	}

	s.signal(t, syscall.SIGCONT)
	sc := s.shell(t)
	tok := strconv.FormatUint(tok1, 10)
	next := parseToken(t, sc.ok("lock", "acquire", "paused/polite", "--wait", "10s"))
	if next <= tok1 {
		t.Errorf("token after the lease expired = %d, want above %d", next, tok1)
	}
	sc.fails(exitFenced, "put", "k", "v", "--token", tok, "--lock", "paused/polite")
	sc.fails(exitFenced, "lock", "renew", "paused/polite", "--token", tok)
}

// TestRunLockedLockReleasedUnderIt: someone releases the lock with the
// command's token; the next renew is refused, the command is stopped and
// run-locked exits 3.
func TestRunLockedLockReleasedUnderIt(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	c := s.shell(t, "DIR="+dir)
	p := c.start("run-locked", "stolen", "--ttl", "1s", "--", "sh", "-c", recordAndSleep)
	pid, tok := childInfo(t, filepath.Join(dir, "stolen"))
	c.ok("lock", "release", "stolen", "--token", strconv.FormatUint(tok, 10))
	r := p.wait(t, 10*time.Second)
	wantEqual(t, "run-locked exit status", r.code, exitFenced)
	wantContains(t, "run-locked stderr", r.stderr, "not_holder")
	wantGone(t, pid)
}

// TestRunLockedClientPaused is the failure fencing exists for. run-locked
// itself is paused (SIGSTOP) past its TTL while its command goes on
// writing with the token. The lease expires, another client takes the lock
// and writes with a newer token; from then on the store refuses the
// command's writes (exit 3 from its 'fencekv put'). When run-locked
// resumes it finds the lease lost, stops the command and exits 3.
func TestRunLockedClientPaused(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	c := s.shell(t, "DIR="+dir, "FENCEKV_BIN="+bin)
	p := c.start("run-locked", "report", "--ttl", "1s", "--", "sh", "-c", `echo $$ $FENCEKV_TOKEN > "$DIR/pid"
while :; do
	"$FENCEKV_BIN" put report/latest "written by $FENCEKV_TOKEN" --token "$FENCEKV_TOKEN" >/dev/null 2>&1
	echo "$?" >> "$DIR/status"
	sleep 0.02
done`)
	pid, tok := childInfo(t, filepath.Join(dir, "pid"))
	sc := s.shell(t)
	waitFor(t, 10*time.Second, "the command's first write", func() bool {
		return strings.HasPrefix(readFile(t, filepath.Join(dir, "status")), "0\n")
	})

	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT) })
	// The lease runs out on the server; the next holder gets a newer token.
	newer := parseToken(t, sc.ok("lock", "acquire", "report", "--wait", "10s", "--ttl", "30s"))
	if newer <= tok {
		t.Fatalf("new token %d, want above %d", newer, tok)
	}
	sc.ok("put", "report/latest", "written by the new holder", "--token", strconv.FormatUint(newer, 10))
	waitFor(t, 10*time.Second, "the store to refuse the command's write", func() bool {
		return strings.Contains(readFile(t, filepath.Join(dir, "status")), fmt.Sprintf("%d\n", exitFenced))
	})
	wantFields(t, sc.jsonOK("get", "report/latest"), map[string]any{"value": "written by the new holder", "fence": int(newer)})
	if p.exited() {
		t.Fatal("run-locked exited while stopped")
	}

	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t, 10*time.Second)
	wantEqual(t, "run-locked exit status", r.code, exitFenced)
	wantContains(t, "run-locked stderr", r.stderr, "lease lost")
	wantGone(t, pid)
	// run-locked did not release the newer holder's lock.
	wantFields(t, sc.jsonOK("lock", "info", "report"), map[string]any{"held": true, "token": int(newer)})
}

// TestRunLockedForwardsSignals: SIGTERM to run-locked goes to the command;
// run-locked exits with the command's status and releases the lock.
func TestRunLockedForwardsSignals(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	c := s.shell(t, "DIR="+dir)
	p := c.start("run-locked", "sig", "--", "sh", "-c",
		`trap 'echo got TERM; exit 42' TERM; echo $$ $FENCEKV_TOKEN > "$DIR/pid"; sleep 30 & wait`)
	childInfo(t, filepath.Join(dir, "pid"))
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t, 10*time.Second)
	wantEqual(t, "run-locked exit status", r.code, 42)
	wantEqual(t, "command output", r.stdout, "got TERM\n")
	wantFields(t, c.jsonOK("lock", "info", "sig"), map[string]any{"held": false})
}

// TestRunLockedServerKilled: the server dies (SIGKILL) while the command
// runs; with no renew possible, run-locked stops the command within about
// the TTL and exits 3.
func TestRunLockedServerKilled(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	c := s.shell(t, "DIR="+dir)
	p := c.start("run-locked", "gone", "--ttl", "1s", "--", "sh", "-c", recordAndSleep)
	pid, _ := childInfo(t, filepath.Join(dir, "gone"))
	s.kill()
	killed := time.Now()
	waitFor(t, 10*time.Second, "the command to be stopped", func() bool { return gone(pid) })
	if d := time.Since(killed); d > 3*time.Second {
		t.Errorf("command stopped %v after the server died, want about the TTL (1s)", d)
	}
	r := p.wait(t, 10*time.Second)
	wantEqual(t, "run-locked exit status", r.code, exitFenced)
	wantContains(t, "run-locked stderr", r.stderr, "lease lost")
}

// TestRunLockedKilledTakesItsJob: kill -9 of run-locked stops its command
// and the command's own children (the whole process group) within the
// grace period, so a job never outlives the process that holds its lock.
func TestRunLockedKilledTakesItsJob(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	c := s.shell(t, "DIR="+dir)
	// The command records its own pid and a grandchild's, then waits.
	p := c.start("run-locked", "orphan", "--grace", "1s", "--", "sh", "-c",
		`sleep 30 & echo $! > "$DIR/grandchild"; echo $$ $FENCEKV_TOKEN > "$DIR/pid"; wait`)
	pid, _ := childInfo(t, filepath.Join(dir, "pid"))
	grandchild, err := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(dir, "grandchild"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(grandchild, syscall.SIGKILL) })
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 10*time.Second)
	for _, proc := range []int{pid, grandchild} {
		waitFor(t, 10*time.Second, fmt.Sprintf("process %d to be stopped", proc), func() bool {
			return syscall.Kill(proc, 0) == syscall.ESRCH || zombie(proc)
		})
		wantGone(t, proc)
	}
}

// zombie reports whether pid has exited but not been reaped yet (its
// parent, the guard, may be on its way out too).
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] == "Z"
}

// A child script that records its pid and token, then runs until the test
// creates the file $DIR/done.
const recordAndWait = `echo $$ $FENCEKV_TOKEN > "$DIR/$FENCEKV_LOCK"
while [ ! -e "$DIR/done" ]; do sleep 0.05; done`

// stillRunning checks, for the whole of d, that run-locked has not exited
// and its command runs: the lease was never given up meanwhile.
func stillRunning(t *testing.T, p *proc, pid int, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if p.exited() || gone(pid) {
			t.Fatalf("run-locked gave up (command gone: %v): %v", gone(pid), p.wait(t, 10*time.Second))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRunLockedServerRestart: the server is restarted gracefully (well
// within the TTL) under a running run-locked. run-locked reconnects and
// renews, so its command keeps running past a whole TTL after the
// restart, and the lock stays held by its token until the command ends.
func TestRunLockedServerRestart(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	c := s.shell(t, "DIR="+dir)
	const ttl = 4 * time.Second
	p := c.start("run-locked", "restarted", "--ttl", ttl.String(), "--", "sh", "-c", recordAndWait)
	pid, tok := childInfo(t, filepath.Join(dir, "restarted"))

	down := time.Now()
	s.stop(t)
	s = startServer(t, s.dir, "--listen", s.addr)
	t.Logf("the server was down for %v", time.Since(down))
	stillRunning(t, p, pid, ttl+ttl/2)
	wantFields(t, s.shell(t).jsonOK("lock", "info", "restarted"), map[string]any{"held": true, "token": int(tok)})

	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := p.wait(t, 10*time.Second); r.code != 0 {
		t.Fatalf("want exit 0, got %v", r)
	}
	wantFields(t, s.shell(t).jsonOK("lock", "info", "restarted"), map[string]any{"held": false})
}

// TestRunLockedServerDownPastTTL: the server stops and stays down past
// the TTL. run-locked gives the lease up: the command is stopped, and
// run-locked exits with --lost-status; meanwhile the server comes back
// (having given the lease its full TTL again, as after any restart), and
// run-locked releases the lock that was still its. With --json, its
// report says so on stderr.
func TestRunLockedServerDownPastTTL(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	c := s.shell(t, "DIR="+dir)
	const ttl = 4 * time.Second
	p := c.start("run-locked", "down", "--ttl", ttl.String(), "--grace", "1s", "--lost-status", "75", "--json",
		"--", "sh", "-c", recordAndWait)
	pid, tok := childInfo(t, filepath.Join(dir, "down"))

	s.stop(t)
	stopped := time.Now()
	waitFor(t, 3*ttl, "the command to be stopped", func() bool { return gone(pid) })
	// Not at the disconnect: only once no renew was acknowledged for a TTL
	// (from the last acknowledged one's send, at most a renew period, a
	// third of the TTL, before the stop; more on a slow machine).
	if d := time.Since(stopped); d < ttl/3 {
		t.Errorf("command stopped %v after the server stopped, before its lease could run out (TTL %v)", d, ttl)
	}
	// run-locked now tries, for up to the TTL, to release the lock.
	s = startServer(t, s.dir, "--listen", s.addr)
	r := p.wait(t, 3*ttl)
	wantEqual(t, "run-locked exit status", r.code, 75)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	report := decodeJSON(t, lines[len(lines)-1])
	wantFields(t, report, map[string]any{"lock": "down", "token": int(tok), "status": 75, "lease_lost": true, "error": "lease_lost"})
	// Released: without the release, the restarted server would hold it
	// for a full TTL from its start.
	wantFields(t, s.shell(t).jsonOK("lock", "info", "down"), map[string]any{"held": false})
}

// TestRunLockedLostStatus: --lost-status picks the status of a lost
// lease, so that it cannot be confused with the command's own; the
// command's status still passes through, and a bad value is a usage error.
func TestRunLockedLostStatus(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	c := s.shell(t, "DIR="+dir)
	c.fails(3, "run-locked", "st", "--lost-status", "75", "--", "sh", "-c", "exit 3")
	p := c.start("run-locked", "st", "--ttl", "1s", "--lost-status", "75", "--", "sh", "-c", recordAndSleep)
	pid, tok := childInfo(t, filepath.Join(dir, "st"))
	c.ok("lock", "release", "st", "--token", strconv.FormatUint(tok, 10))
	r := p.wait(t, 10*time.Second)
	wantEqual(t, "run-locked exit status", r.code, 75)
	wantContains(t, "stderr", r.stderr, "not_holder")
	wantGone(t, pid)
	for _, bad := range []string{"0", "256"} {
		c.fails(exitUsage, "run-locked", "st", "--lost-status", bad, "--", "true")
	}
	// --json: the report of a command that ended by itself, on stderr.
	r = c.fails(7, "run-locked", "st", "--json", "--", "sh", "-c", "echo out; exit 7")
	wantEqual(t, "stdout", r.stdout, "out\n")
	wantFields(t, decodeJSON(t, r.stderr), map[string]any{"lock": "st", "status": 7, "command_status": 7, "lease_lost": false})
	// ... and of one that could not get the lock.
	c.ok("lock", "acquire", "st", "--ttl", "30s")
	r = c.fails(exitLockHeld, "run-locked", "st", "--wait", "100ms", "--json", "--", "true")
	wantEqual(t, "stdout", r.stdout, "")
	wantFields(t, decodeJSON(t, r.stderr), map[string]any{"lock": "st", "status": exitLockHeld, "error": "lock_held"})
}

// TestRunLockedClusterLeaderKilled: run-locked is given all three nodes
// of a cluster, the leader's first; the leader is killed (kill -9) while
// the command runs, and with it run-locked's connection. A
// new leader is elected within the TTL and gives the lease its full TTL
// again; run-locked renews through whichever node answers, so the command
// keeps running past a whole TTL after the kill and the lock stays held.
func TestRunLockedClusterLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster of real processes")
	}
	t.Parallel()
	cl := clustertest.Start(t, bin, 3, nil)
	// The leader first: run-locked connects to it, so the kill also
	// breaks its connection, and it must reconnect to another node.
	leader := cl.Leader(t)
	addrs := []string{leader.Client}
	for _, nd := range cl.Others(leader) {
		addrs = append(addrs, nd.Client)
	}
	all := strings.Join(addrs, ",")
	dir := t.TempDir()
	c := &shell{t: t, env: []string{"FENCEKV_ADDR=" + all, "DIR=" + dir}}
	const ttl = 6 * time.Second // a new leader within it, on a loaded machine too
	p := c.start("run-locked", "failover", "--ttl", ttl.String(), "--", "sh", "-c", recordAndWait)
	pid, tok := childInfo(t, filepath.Join(dir, "failover"))

	cl.Kill(leader)
	killed := time.Now()
	next := cl.Leader(t)
	t.Logf("killed leader %s; %s leads %v later", leader.Name, next.Name, time.Since(killed))
	stillRunning(t, p, pid, ttl+ttl/2)
	wantFields(t, c.jsonOK("lock", "info", "failover"), map[string]any{"held": true, "token": int(tok)})

	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := p.wait(t, 20*time.Second); r.code != 0 {
		t.Fatalf("want exit 0, got %v", r)
	}
	wantFields(t, c.jsonOK("lock", "info", "failover"), map[string]any{"held": false})
}

// stopped reports whether every thread of the process is stopped (state
// T in /proc).
func stopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		if f := strings.Fields(rest); len(f) == 0 || f[0] != "T" && f[0] != "t" {
			return false
		}
	}
	return true
}

// TestRunLockedStopsLeftovers: what the command leaves running in its
// process group (here a loop that ignores SIGTERM) does not outlive
// run-locked, nor hold on past the lock: it is stopped (SIGTERM, then
// SIGKILL after --grace) before the lock is released, when the command
// exits and when the lease is lost. Before, a background job went on
// writing with the old token after the next holder had the lock.
func TestRunLockedStopsLeftovers(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	for _, tt := range []struct {
		name, command string
		lose          bool
		want          int
	}{
		{"command exits", `sh "$DIR/straggler.sh" & until [ -s "$DIR/straggler.pid" ]; do sleep 0.01; done; exit 0`, false, 0},
		{"lease lost", `sh "$DIR/straggler.sh" & ` + recordAndSleep, true, exitFenced},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			script := `trap '' TERM; echo $$ > "$DIR/straggler.pid"; while :; do echo x >> "$DIR/log"; sleep 0.05; done`
			if err := os.WriteFile(filepath.Join(dir, "straggler.sh"), []byte(script), 0o600); err != nil {
				t.Fatal(err)
			}
			c := s.shell(t, "DIR="+dir)
			lock := strings.ReplaceAll(tt.name, " ", "-")
			p := c.start("run-locked", lock, "--ttl", "2s", "--grace", "300ms", "--", "sh", "-c", tt.command)
			var straggler int
			waitFor(t, 10*time.Second, "the straggler to start", func() bool {
				straggler, _ = strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(dir, "straggler.pid"))))
				return straggler > 0
			})
			t.Cleanup(func() { syscall.Kill(straggler, syscall.SIGKILL) })
			if tt.lose {
				_, tok := childInfo(t, filepath.Join(dir, lock))
				c.ok("lock", "release", lock, "--token", strconv.FormatUint(tok, 10))
			}
			r := p.wait(t, 10*time.Second)
			wantEqual(t, "run-locked exit status", r.code, tt.want)
			wantGone(t, straggler)
			n := len(readFile(t, filepath.Join(dir, "log")))
			time.Sleep(200 * time.Millisecond) // the loop writes every 50ms, if it runs
			if m := len(readFile(t, filepath.Join(dir, "log"))); m != n {
				t.Errorf("the command's leftover went on writing after run-locked exited (%d bytes, then %d)", n, m)
			}
		})
	}
}

// TestRunLockedSignalWhileWaiting: SIGTERM or SIGINT to a run-locked that
// is still queued for its lock ends the wait at once (exit 128+signal),
// and the command never runs. Before, the signal waited in a channel until
// the lock was granted, and was then delivered to the command it started.
func TestRunLockedSignalWhileWaiting(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			c := s.shell(t)
			lock := "busy-" + strconv.Itoa(int(sig))
			c.ok("lock", "acquire", lock, "--ttl", "30s")
			ran := filepath.Join(t.TempDir(), "ran")
			p := c.start("run-locked", lock, "--wait", "30s", "--json", "--", "touch", ran)
			waitFor(t, 10*time.Second, "run-locked to queue", func() bool {
				return c.jsonOK("lock", "info", lock)["waiters"] == float64(1)
			})
			if err := syscall.Kill(p.cmd.Process.Pid, sig); err != nil {
				t.Fatal(err)
			}
			r := p.wait(t, 5*time.Second)
			wantEqual(t, "run-locked exit status", r.code, 128+int(sig))
			wantContains(t, "stderr", r.stderr, "while waiting for the lock")
			wantFields(t, decodeJSON(t, r.stderr), map[string]any{"error": "signalled", "status": float64(128 + int(sig))})
			if _, err := os.Stat(ran); err == nil {
				t.Error("the command ran after run-locked was told to stop")
			}
			waitFor(t, 10*time.Second, "the queued acquire to be gone", func() bool {
				return c.jsonOK("lock", "info", lock)["waiters"] == float64(0)
			})
		})
	}
}

// TestRunLockedTerminalStdin: a command run from a terminal that reads its
// standard input gets end of file rather than stopping for good. It runs in
// a process group of its own, out of the terminal's foreground, where a
// read of the terminal stops it (SIGTTIN) while run-locked goes on renewing
// the lock. Run under script(1), which gives it a terminal; skipped where
// script is missing.
func TestRunLockedTerminalStdin(t *testing.T) {
	t.Parallel()
	script, err := exec.LookPath("script")
	if err != nil {
		t.Skip("no script(1) here")
	}
	s := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	line := bin + ` run-locked tty --ttl 2s -- sh -c 'read a; echo "got=[$a]"'`
	cmd := exec.CommandContext(ctx, script, "-qec", line, "/dev/null")
	cmd.Env = cleanEnv("FENCEKV_ADDR=" + s.addr)
	cmd.Stdin = strings.NewReader("typed\n")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("run-locked under a terminal still ran after 15s (a command reading the terminal was stopped): %q", out)
	}
	if err != nil || !strings.Contains(string(out), "got=[]") {
		t.Fatalf("run-locked under a terminal: %v, %q; want the command to read end of file", err, out)
	}
	wantFields(t, s.shell(t).jsonOK("lock", "info", "tty"), map[string]any{"held": false})
}
