package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// TestSemaphoreHistoryKill9: eight clients take, hold and release permits
// of a semaphore of limit 3 on a real server that is killed (kill -9) and
// started again on its data and address. The history they saw never has
// more than 3 permits live at once, and its tokens are unique and rise
// with real time, across the restart (CheckSemaphore): the grants before
// the kill were durable, and the permits held at it came back held.
func TestSemaphoreHistoryKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes and real time")
	}
	dir := t.TempDir()
	s := startServer(t, dir)
	var clients []*wire.Client
	for range 8 {
		c, err := wire.Dial(context.Background(), s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		ps []fencekvtest.Permit
		st fencekvtest.SemStats
	}
	done := make(chan result, 1)
	var granted atomic.Int64
	const ttl = 2 * time.Second
	go func() {
		ps, st := fencekvtest.RunSemaphore(ctx, clients, fencekvtest.SemWorkload{
			Name: "S", Limit: 3, TTL: ttl, Hold: 10 * time.Millisecond,
			Wait: 500 * time.Millisecond, Retries: 10 * time.Second, Granted: &granted})
		done <- result{ps, st}
	}()
	fencekvtest.Eventually(t, 30*time.Second, "200 permits granted before the kill", func() bool { return granted.Load() >= 200 })
	s.kill() // SIGKILL, by PID
	killed, base := time.Now(), granted.Load()
	s = startServerCmd(t, dir, []string{bin, "serve", "--data", dir, "--listen", s.addr, "--http", ""})
	t.Logf("%d permits before the kill; serving again after %v", base, time.Since(killed).Round(time.Millisecond))
	fencekvtest.Eventually(t, 60*time.Second, "200 more permits, past the TTL after the restart", func() bool {
		return granted.Load() >= base+200 && time.Since(killed) > 2*ttl
	})
	cancel()
	r := <-done
	t.Logf("%d permits, %+v", len(r.ps), r.st)
	if err := fencekvtest.CheckSemaphore(r.ps, 3); err != nil {
		t.Fatal(err)
	}
	var before, after int
	for _, p := range r.ps {
		if p.Ack.Before(killed) {
			before++
		} else {
			after++
		}
	}
	// 200 counted before the kill, 200 more after it: of those, a few
	// (at most one per client) may have been answered just before it.
	if before < 200 || after < 200-len(clients) {
		t.Fatalf("%d permits granted before the kill, %d after; want at least 200 and %d", before, after, 200-len(clients))
	}
}

// TestRunLockedLimit: four 'run-locked --limit 3' commands on one name:
// three run at once, each with its own token, the fourth queues and runs
// when one ends; 'lock info' shows the limit, the three holders and the
// one waiting (text and --json); a plain acquire or another limit is
// limit_mismatch (exit 2), --limit over the maximum or with --lock-delay
// bad_request (exit 2), and none of them changes the holders.
func TestRunLockedLimit(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)
	dir := t.TempDir()
	// Each command marks that it runs (in.TOKEN) and waits for the go file.
	script := `echo "$FENCEKV_TOKEN" > "$0/in.$FENCEKV_TOKEN"; while [ ! -e "$0/go" ]; do sleep 0.01; done`
	var procs []*proc
	runs := func() int {
		n, _ := filepath.Glob(filepath.Join(dir, "in.*"))
		return len(n)
	}
	for i := 1; i <= 4; i++ {
		procs = append(procs, c.start("run-locked", "--limit", "3", "--ttl", "5s", "--wait", "60s", "--holder", fmt.Sprintf("job-%d", i),
			"batch", "--", "sh", "-c", script, dir))
		if i <= 3 {
			waitFor(t, 20*time.Second, fmt.Sprintf("command %d to run", i), func() bool { return runs() == i })
		}
	}
	waitFor(t, 20*time.Second, "the fourth to queue", func() bool {
		return c.jsonOK("lock", "info", "batch")["waiters"] == float64(1)
	})
	if n := runs(); n != 3 {
		t.Fatalf("%d commands run at once; want 3", n)
	}
	info := c.ok("lock", "info", "batch")
	wantContains(t, "lock info", info, "batch\t3 of 3 permits held, 1 waiting")
	for i := 1; i <= 3; i++ {
		wantContains(t, "lock info", info, fmt.Sprintf(`(holder "job-%d")`, i))
	}
	m := c.jsonOK("lock", "info", "batch")
	hs, _ := m["holders"].([]any)
	wantFields(t, m, map[string]any{"limit": 3, "held": true, "waiters": 1})
	wantEqual(t, "holders in --json", len(hs), 3)
	var last float64
	for _, h := range hs {
		tok := h.(map[string]any)["token"].(float64)
		if tok <= last {
			t.Fatalf("holders' tokens %v: want rising", hs)
		}
		last = tok
	}

	wantContains(t, "plain acquire", c.fails(exitUsage, "lock", "acquire", "batch").stderr, "limit_mismatch")
	wantContains(t, "another limit", c.fails(exitUsage, "lock", "acquire", "batch", "--limit", "2").stderr, "limit_mismatch")
	wantContains(t, "limit over max", c.fails(exitUsage, "lock", "acquire", "batch", "--limit", "257").stderr, "bad_request")
	wantContains(t, "lock-delay", c.fails(exitUsage, "lock", "acquire", "batch", "--limit", "3", "--lock-delay", "1s").stderr, "bad_request")
	if again := c.ok("lock", "info", "batch"); again[:strings.Index(again, "\n")] != info[:strings.Index(info, "\n")] {
		t.Fatalf("refusals changed the semaphore:\n%s\nwas\n%s", again, info)
	}

	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, p := range procs {
		if r := p.wait(t, 30*time.Second); r.code != 0 {
			t.Fatalf("command %d: %v", i+1, r)
		}
	}
	if n := runs(); n != 4 {
		t.Fatalf("%d commands ran; want 4", n)
	}
	wantEqual(t, "lock info after", c.ok("lock", "info", "batch"), "batch\tfree\n")
}
