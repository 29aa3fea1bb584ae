package main

// End-to-end tests of 'fencekv elect' and 'fencekv leader' with the real
// binary: hand-over on a paused (SIGSTOP) and a killed (kill -9) leader,
// fenced writes of a deposed leader refused, and the history of accepted
// writes never interleaving epochs out of order.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A leader's child: records "PID EPOCH" in $DIR/$FENCEKV_VALUE, then
// writes hist/k with its epoch on the election's lock, recording each
// write's exit status.
const electChild = `echo $$ $FENCEKV_TOKEN > "$DIR/$FENCEKV_VALUE.tmp"; mv "$DIR/$FENCEKV_VALUE.tmp" "$DIR/$FENCEKV_VALUE"
i=0
while :; do
	i=$((i+1))
	"$FENCEKV_BIN" put hist/k "$FENCEKV_TOKEN $i" --lock "$FENCEKV_LOCK" --token "$FENCEKV_TOKEN" >/dev/null 2>&1
	echo "$FENCEKV_TOKEN $?" >> "$DIR/$FENCEKV_VALUE.status"
	sleep 0.03
done`

// leaderChild waits until the child of candidate value leads with an
// epoch above after, and returns its pid and epoch.
func leaderChild(t *testing.T, dir, value string, after uint64) (pid int, epoch uint64) {
	t.Helper()
	path := filepath.Join(dir, value)
	waitFor(t, 20*time.Second, value+"'s child to lead above epoch "+strconv.FormatUint(after, 10), func() bool {
		f := strings.Fields(readFile(t, path))
		if len(f) != 2 {
			return false
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil || n <= after {
			return false
		}
		pid, _ = strconv.Atoi(f[0])
		epoch = n
		return true
	})
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	return pid, epoch
}

// statusSeen reports whether the child of value recorded a write with
// epoch that exited with code.
func statusSeen(t *testing.T, dir, value string, epoch uint64, code int) bool {
	return strings.Contains(readFile(t, filepath.Join(dir, value+".status")), fmt.Sprintf("%d %d\n", epoch, code))
}

// checkHistory checks a 'fencekv watch --json' log of hist/: the accepted
// writes, in revision order, never go back to an older epoch, and each
// write's fence is its epoch. It returns the epochs seen, in order.
func checkHistory(t *testing.T, log string) []uint64 {
	t.Helper()
	var epochs []uint64
	var lastRev float64
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("watch line %q: %v", line, err)
		}
		if e["type"] != "put" {
			continue
		}
		rev := e["revision"].(float64)
		if rev <= lastRev {
			t.Fatalf("revision %v after %v", rev, lastRev)
		}
		lastRev = rev
		f := strings.Fields(e["value"].(string))
		epoch, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			t.Fatalf("value %q", e["value"])
		}
		if n := len(epochs); n > 0 && epoch < epochs[n-1] {
			t.Fatalf("accepted write of epoch %d at revision %v after one of epoch %d: epochs interleaved", epoch, rev, epochs[n-1])
		}
		if fence := uint64(e["fence"].(float64)); fence != epoch {
			t.Fatalf("write of epoch %d has fence %d", epoch, fence)
		}
		if n := len(epochs); n == 0 || epochs[n-1] != epoch {
			epochs = append(epochs, epoch)
		}
	}
	return epochs
}

// TestElectHandOver: two 'fencekv elect' on one server. The leading one
// is paused (SIGSTOP) past its TTL: the other leads with a higher epoch;
// the paused one's child goes on writing and is refused; resumed, the
// paused one stops its child and campaigns again. Then the leader is
// killed (kill -9): its child is stopped by the guard, and the first
// leads again after the TTL. 'fencekv leader --watch' sees each hand-over;
// the accepted writes never interleave epochs.
func TestElectHandOver(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	sc := s.shell(t)
	c := s.shell(t, "DIR="+dir, "FENCEKV_BIN="+bin)
	hist := sc.start("watch", "hist/", "--json")
	watch := sc.start("leader", "e", "--watch", "--json")
	waitFor(t, 10*time.Second, "the leader watch's first line", func() bool {
		return strings.Contains(watch.stdout.String(), `"held":false`)
	})

	a := c.start("elect", "e", "--value", "a", "--ttl", "1s", "--", "sh", "-c", electChild)
	apid, aep := leaderChild(t, dir, "a", 0)
	wantFields(t, sc.jsonOK("leader", "e"), map[string]any{"held": true, "value": "a", "epoch": int(aep)})
	wantContains(t, "leader (human)", sc.ok("leader", "e"), fmt.Sprintf(`led by "a", epoch %d`, aep))
	b := c.start("elect", "e", "--value", "b", "--ttl", "1s", "--", "sh", "-c", electChild)
	waitFor(t, 10*time.Second, "b to queue", func() bool {
		return sc.jsonOK("lock", "info", "e")["waiters"] == float64(1)
	})
	waitFor(t, 10*time.Second, "a's first accepted write", func() bool { return statusSeen(t, dir, "a", aep, 0) })

	// a pauses past its TTL; its child does not.
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT) })
	stoppedAt := time.Now()
	bpid, bep := leaderChild(t, dir, "b", aep)
	t.Logf("SIGSTOP of the leader (ttl 1s) -> the other's child leads: %v", time.Since(stoppedAt).Round(time.Millisecond))
	waitFor(t, 10*time.Second, "b's first accepted write", func() bool { return statusSeen(t, dir, "b", bep, 0) })
	waitFor(t, 10*time.Second, "a's child's write to be refused", func() bool { return statusSeen(t, dir, "a", aep, exitFenced) })
	if a.exited() {
		t.Fatal("elect a exited while stopped")
	}
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a to stop its child", func() bool { return gone(apid) })
	waitFor(t, 10*time.Second, "a to campaign again", func() bool {
		return strings.Contains(a.stderr.String(), "campaigning again") &&
			sc.jsonOK("lock", "info", "e")["waiters"] == float64(1)
	})
	wantFields(t, sc.jsonOK("leader", "e"), map[string]any{"held": true, "value": "b", "epoch": int(bep)})

	// b dies by kill -9: its child is stopped; a leads after the TTL.
	if err := syscall.Kill(b.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	_, aep2 := leaderChild(t, dir, "a", bep)
	t.Logf("kill -9 of the leader (ttl 1s) -> the other's child leads: %v", time.Since(killedAt).Round(time.Millisecond))
	waitFor(t, 10*time.Second, "b's child to be stopped", func() bool { return gone(bpid) })
	waitFor(t, 10*time.Second, "a's accepted write in its new epoch", func() bool { return statusSeen(t, dir, "a", aep2, 0) })

	// The watch saw every hand-over, epochs rising.
	waitFor(t, 10*time.Second, "the leader watch to see a lead again", func() bool {
		return strings.Contains(watch.stdout.String(), fmt.Sprintf(`"epoch":%d`, aep2))
	})
	var seen []string
	var top float64
	for _, line := range strings.Split(strings.TrimSpace(watch.stdout.String()), "\n") {
		m := decodeJSON(t, line)
		if m["held"] == true {
			if ep := m["epoch"].(float64); ep <= top {
				t.Fatalf("leader --watch: epoch %v after %v", ep, top)
			} else {
				top = ep
			}
			seen = append(seen, fmt.Sprintf("%v@%v", m["value"], m["epoch"]))
		}
	}
	want := []string{fmt.Sprintf("a@%d", aep), fmt.Sprintf("b@%d", bep), fmt.Sprintf("a@%d", aep2)}
	if strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Errorf("leader --watch saw %v; want %v", seen, want)
	}

	// a ends (SIGTERM goes to its child, which dies of it); the lock is
	// released.
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := a.wait(t, 20*time.Second)
	wantEqual(t, "elect a's exit status", r.code, 128+int(syscall.SIGTERM))
	wantFields(t, sc.jsonOK("leader", "e"), map[string]any{"held": false})

	// The accepted writes: epochs never interleaved, all three leaders'.
	waitFor(t, 10*time.Second, "the history watch to see a's new epoch", func() bool {
		return strings.Contains(hist.stdout.String(), fmt.Sprintf(`"fence":%d`, aep2))
	})
	epochs := checkHistory(t, hist.stdout.String())
	if fmt.Sprint(epochs) != fmt.Sprint([]uint64{aep, bep, aep2}) {
		t.Errorf("epochs of the accepted writes, in revision order: %v; want %v", epochs, []uint64{aep, bep, aep2})
	}
}

// TestElectOnce: with --once, a lost leadership (the lock released behind
// its back) stops the command and exits with --lost-status; a command
// that ends ends elect with its status, resigning.
func TestElectOnce(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	sc := s.shell(t)
	c := s.shell(t, "DIR="+dir, "FENCEKV_BIN="+bin)
	p := c.start("elect", "once", "--value", "a", "--ttl", "2s", "--once", "--lost-status", "9", "--", "sh", "-c", electChild)
	pid, ep := leaderChild(t, dir, "a", 0)
	sc.ok("lock", "release", "once", "--token", strconv.FormatUint(ep, 10))
	r := p.wait(t, 10*time.Second)
	wantEqual(t, "elect --once exit status", r.code, 9)
	wantContains(t, "elect stderr", r.stderr, "lease lost")
	waitFor(t, 10*time.Second, "the child to be stopped", func() bool { return gone(pid) })

	// The command's own end: its status, and the election is free.
	r = c.run("elect", "once", "--value", "b", "--", "sh", "-c", `echo "$FENCEKV_VALUE $FENCEKV_LOCK $FENCEKV_TOKEN"; exit 7`)
	wantEqual(t, "elect exit status", r.code, 7)
	f := strings.Fields(r.stdout)
	if len(f) != 3 || f[0] != "b" || f[1] != "once" || parseToken(t, f[2]) <= ep {
		t.Errorf("child printed %q; want value b, lock once and an epoch above %d", r.stdout, ep)
	}
	wantFields(t, sc.jsonOK("leader", "once"), map[string]any{"held": false})
	wantContains(t, "leader (human)", sc.ok("leader", "once"), "once\tno leader")
}

// TestElectBadInput: bad arguments exit 2 (usage) and take nothing.
func TestElectBadInput(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	sc := s.shell(t)
	for _, args := range [][]string{
		{"elect", "e", "--value", "", "--", "true"},
		{"elect", "e", "--value", strings.Repeat("v", 4097), "--", "true"},
		{"elect", "e", "--ttl", "0s", "--", "true"},
		{"elect", "e", "--grace", "5s", "--ttl", "1s", "--", "true"},
		{"elect", "e", "--lost-status", "0", "--", "true"},
		{"elect", "e"},
		{"elect", "e", "--"},
		{"elect", "", "--", "true"},
		{"leader"},
		{"leader", ""},
	} {
		r := sc.run(args...)
		if r.code != exitUsage {
			t.Errorf("want exit %d, got %v", exitUsage, r)
		}
	}
	m := decodeJSON(t, sc.fails(exitUsage, "elect", "e", "--value", "", "--json", "--", "true").stderr)
	wantFields(t, m, map[string]any{"error": "usage"})
	wantFields(t, sc.jsonOK("leader", "e"), map[string]any{"held": false, "epoch": 0})
	if _, err := os.Stat(s.dir); err != nil {
		t.Fatal(err)
	}
}

// TestElectServerFaults: two 'fencekv elect' on one server, and the
// server fails under them: killed with -9 and restarted on its data (a
// restart gives the leadership's lease its full TTL again, so the leader
// renews through its next connection), then paused with SIGSTOP past the
// TTL (the leader gives up by its own clock, and once the server runs
// again the lease expires and the queue moves on). After each, someone
// leads and writes; over the whole run the accepted writes, replayed from
// the server's durable history, never go back to an older epoch, and each
// carries its epoch as fence: never two leaders whose epochs are both
// accepted out of order.
func TestElectServerFaults(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := t.TempDir()
	c := s.shell(t, "DIR="+dir, "FENCEKV_BIN="+bin)
	const ttl = 2 * time.Second
	a := c.start("elect", "e", "--value", "a", "--ttl", ttl.String(), "--", "sh", "-c", electChild)
	_, aep := leaderChild(t, dir, "a", 0)
	b := c.start("elect", "e", "--value", "b", "--ttl", ttl.String(), "--", "sh", "-c", electChild)
	waitFor(t, 10*time.Second, "b to queue", func() bool {
		return s.shell(t).jsonOK("lock", "info", "e")["waiters"] == float64(1)
	})
	waitFor(t, 10*time.Second, "a's first accepted write", func() bool { return statusSeen(t, dir, "a", aep, 0) })

	// acceptedAfter waits for a write accepted (exit 0) in an epoch at or
	// above min, by either candidate, and returns the highest epoch seen.
	acceptedAfter := func(what string, min uint64) uint64 {
		t.Helper()
		var top uint64
		waitFor(t, 30*time.Second, what, func() bool {
			for _, v := range []string{"a", "b"} {
				for _, line := range strings.Split(readFile(t, filepath.Join(dir, v+".status")), "\n") {
					f := strings.Fields(line)
					if len(f) != 2 || f[1] != "0" {
						continue
					}
					if ep, err := strconv.ParseUint(f[0], 10, 64); err == nil && ep >= min && ep > top {
						top = ep
					}
				}
			}
			return top >= min && top != 0
		})
		return top
	}

	// kill -9 of the server, restarted on its data at the same address.
	before := readFile(t, filepath.Join(dir, "a.status"))
	s.kill()
	s = startServer(t, s.dir, "--listen", s.addr)
	waitFor(t, 30*time.Second, "a write accepted after the restart", func() bool {
		for _, v := range []string{"a", "b"} {
			st := readFile(t, filepath.Join(dir, v+".status"))
			if v == "a" {
				st = strings.TrimPrefix(st, before)
			}
			if strings.Contains(st, " 0\n") {
				return true
			}
		}
		return false
	})
	top := acceptedAfter("a leader's write after the restart", aep)

	// SIGSTOP of the server past the TTL.
	s.signal(t, syscall.SIGSTOP)
	time.Sleep(ttl + ttl/2) // the pause lasts past the TTL: the point of it
	s.signal(t, syscall.SIGCONT)
	next := acceptedAfter("a leader in a new epoch after the pause", top+1)
	t.Logf("epochs: first %d, after the restart up to %d, after the pause %d", aep, top, next)

	// The whole history of accepted writes, from revision 1.
	hist := s.shell(t).start("watch", "hist/", "--from", "1", "--json")
	waitFor(t, 10*time.Second, "the replay to reach the new epoch", func() bool {
		return strings.Contains(hist.stdout.String(), fmt.Sprintf(`"fence":%d`, next))
	})
	epochs := checkHistory(t, hist.stdout.String())
	if len(epochs) < 2 || epochs[0] != aep || epochs[len(epochs)-1] < next {
		t.Fatalf("epochs of the accepted writes, in revision order: %v; want from %d up to at least %d", epochs, aep, next)
	}
	for _, p := range []*proc{a, b} {
		syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM)
	}
}
