package main

// End-to-end tests of 'fencekv run-locked': the child's environment and
// exit status, mutual exclusion between concurrent run-locked processes,
// and what happens when the lease is lost while the child runs.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH && !zombie(pid) {
		t.Errorf("process %d still runs (kill 0: %v)", pid, err)
	}
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
	t.Cleanup(func() { syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT) })
	// A client command gives up on the silent server after --timeout.
	start := time.Now()
	c.fails(exitError, "get", "k", "--timeout", "300ms")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("get --timeout 300ms took %v", d)
	}
	for _, p := range []*proc{polite, stubborn} {
		r := p.wait(t, 10*time.Second)
		wantEqual(t, "run-locked exit status", r.code, exitFenced)
		wantContains(t, "run-locked stderr", r.stderr, "lease lost")
		if strings.Contains(r.stdout, "survived") {
			t.Errorf("the command outlived its lease: %v", r)
		}
	}
	// The lease of 1s is measured from the last renew's send, up to a
	// third of the TTL before the pause; then 300ms of grace.
	if d := time.Since(paused); d > 3*time.Second {
		t.Errorf("commands stopped %v after the server paused, want about the TTL (1s)", d)
	}
	wantGone(t, pid1)
	wantGone(t, pid2)

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
	r := p.wait(t, 10*time.Second)
	wantEqual(t, "run-locked exit status", r.code, exitFenced)
	wantContains(t, "run-locked stderr", r.stderr, "lease lost")
	if d := time.Since(killed); d > 3*time.Second {
		t.Errorf("command stopped %v after the server died, want about the TTL (1s)", d)
	}
	wantGone(t, pid)
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
