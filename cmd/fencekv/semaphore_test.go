package main

import (
	"context"
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
	if before < 200 || after < 200 {
		t.Fatalf("%d permits granted before the kill, %d after; want both at least 200", before, after)
	}
}
