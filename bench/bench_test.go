package bench_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/bench"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

func TestWorkloads(t *testing.T) {
	addr := serve(t)
	for _, wl := range bench.Workloads {
		t.Run(string(wl), func(t *testing.T) {
			cfg := bench.DefaultConfig()
			cfg.Workload = wl
			cfg.Clients = 4
			cfg.Warmup = 50 * time.Millisecond
			cfg.Duration = 200 * time.Millisecond
			cfg.Keys = 20
			var progress bytes.Buffer
			cfg.Progress = &progress
			res, err := bench.Run(context.Background(), bench.DialFencekv(addr), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Errors != 0 {
				t.Errorf("%d errors, the first: %s", res.Errors, res.FirstError)
			}
			if res.Ops == 0 || res.OpsPerSec <= 0 {
				t.Errorf("ops %d, %v ops/s: want some", res.Ops, res.OpsPerSec)
			}
			if res.Latency.Count != res.Ops || res.Latency.P50 <= 0 || res.Latency.P50 > res.Latency.P99 || res.Latency.P99 > res.Latency.Max {
				t.Errorf("latency %+v does not add up for %d ops", res.Latency, res.Ops)
			}
			if res.Elapsed < cfg.Duration || res.Interrupted {
				t.Errorf("elapsed %v (interrupted %v), want at least %v", res.Elapsed, res.Interrupted, cfg.Duration)
			}
			if wl == bench.Contended {
				var sum int64
				for _, g := range res.Grants {
					sum += g
				}
				if len(res.Grants) != cfg.Clients || sum != res.Ops || res.GrantsMin > res.GrantsMax || res.Fairness <= 0 || res.Fairness > 1 {
					t.Errorf("grants %v (min %d max %d, fairness %v) for %d ops", res.Grants, res.GrantsMin, res.GrantsMax, res.Fairness, res.Ops)
				}
			}
		})
	}
}

// TestOnMeasureBracketsTheWindow: the hook benchpeers reads server CPU time
// with opens once, after the warm-up, and closes once, after the window.
func TestOnMeasureBracketsTheWindow(t *testing.T) {
	addr := serve(t)
	cfg := bench.DefaultConfig()
	cfg.Clients = 2
	cfg.Warmup = 100 * time.Millisecond
	cfg.Duration = 200 * time.Millisecond
	var began, opened, closed time.Time
	opens, closes := 0, 0
	cfg.OnMeasure = func() func() {
		opens++
		opened = time.Now()
		return func() { closes++; closed = time.Now() }
	}
	began = time.Now()
	res, err := bench.Run(context.Background(), bench.DialFencekv(addr), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if opens != 1 || closes != 1 {
		t.Fatalf("opened %d times, closed %d times; want once each", opens, closes)
	}
	if opened.Sub(began) < cfg.Warmup || closed.Sub(opened) < cfg.Duration || closed.Sub(opened) > res.Elapsed+time.Second {
		t.Errorf("window opened %v after the start and lasted %v; want after the %v warm-up and about %v (elapsed %v)",
			opened.Sub(began), closed.Sub(opened), cfg.Warmup, cfg.Duration, res.Elapsed)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	addr := serve(t)
	cfg := bench.DefaultConfig()
	cfg.Clients = 2
	cfg.Warmup = 0
	cfg.Duration = time.Minute
	// The context also bounds the run's set-up (dials, durable writes),
	// which a slow machine may take a while over; it ends long before the
	// minute the run would take.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	res, err := bench.Run(ctx, bench.DialFencekv(addr), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Interrupted || time.Since(start) > 15*time.Second {
		t.Errorf("interrupted %v after %v, want an early stop", res.Interrupted, time.Since(start))
	}
}

func TestRunReportsRefusals(t *testing.T) {
	addr := serve(t)
	ctx := context.Background()
	// Fence every client's own key far ahead of any token the run will get.
	c, err := wire.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Put(ctx, []byte("bench/own/0"), []byte("x"), fencekv.WriteOptions{Token: 1 << 40}); err != nil {
		t.Fatal(err)
	}
	cfg := bench.DefaultConfig()
	cfg.Clients = 1
	cfg.Warmup = 0
	cfg.Duration = 5 * time.Second
	_, err = bench.Run(ctx, bench.DialFencekv(addr), cfg)
	if err == nil || !strings.Contains(err.Error(), "stale_token") && !strings.Contains(err.Error(), "below") {
		t.Errorf("err %v, want the client to give up on stale_token", err)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []func(*bench.Config){
		func(c *bench.Config) { c.Workload = "nope" },
		func(c *bench.Config) { c.Clients = 0 },
		func(c *bench.Config) { c.Duration = 0 },
		func(c *bench.Config) { c.Keys = 0 },
		func(c *bench.Config) { c.GetPercent = 101 },
		func(c *bench.Config) { c.Workload, c.Wait = bench.Contended, 0 },
	}
	for i, f := range bad {
		c := bench.DefaultConfig()
		f(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("case %d: %+v validated, want an error", i, c)
		}
	}
	if err := bench.DefaultConfig().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestBaselines(t *testing.T) {
	rtt, err := bench.LoopbackRTT(50)
	if err != nil || rtt.Count != 50 || rtt.P50 <= 0 {
		t.Errorf("LoopbackRTT: %+v, %v", rtt, err)
	}
	fs, err := bench.FsyncLatency(t.TempDir(), 5)
	if err != nil || fs.Count != 5 || fs.P50 <= 0 {
		t.Errorf("FsyncLatency: %+v, %v", fs, err)
	}
	ping, err := bench.PingFencekv(context.Background(), serve(t), 20)
	if err != nil || ping.Count != 20 {
		t.Errorf("PingFencekv: %+v, %v", ping, err)
	}

	// The synced echo (in process here; benchpeers runs it in another).
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- bench.ServeSyncedEcho(ln, dir) }()
	echo, err := bench.SyncedEchoRTT(ln.Addr().String(), 10)
	if err != nil || echo.Count != 10 || echo.P50 <= 0 {
		t.Errorf("SyncedEchoRTT: %+v, %v", echo, err)
	}
	ln.Close()
	if err := <-served; !errors.Is(err, net.ErrClosed) {
		t.Errorf("ServeSyncedEcho after its listener closed: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("ServeSyncedEcho left %d files in its dir", len(left))
	}
}

// serve starts an in-process server on a fresh store for the test.
func serve(t *testing.T) string {
	addr, _ := fencekvtest.Serve(t, nil)
	return addr
}
