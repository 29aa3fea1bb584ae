package peers_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv/bench"
	"github.com/fencekv/fencekv/bench/peers"
)

// The drivers are checked against real servers when the environment names
// them (run.sh's servers, or your own):
//
//	BENCH_ETCD=http://127.0.0.1:2379 BENCH_REDIS=127.0.0.1:6379 go test ./...

func TestEtcd(t *testing.T) {
	ep := os.Getenv("BENCH_ETCD")
	if ep == "" {
		t.Skip("BENCH_ETCD is not set")
	}
	checkDriver(t, peers.DialEtcd(strings.Split(ep, ",")))
}

func TestRedis(t *testing.T) {
	addr := os.Getenv("BENCH_REDIS")
	if addr == "" {
		t.Skip("BENCH_REDIS is not set")
	}
	checkDriver(t, peers.DialRedis(addr))
}

// checkDriver checks the fencing semantics the workloads rely on, then runs
// each workload briefly.
func checkDriver(t *testing.T, dial bench.Dialer) {
	ctx := context.Background()
	a, err := dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	lock, key := "test/"+run+"/lock", "test/"+run+"/key"

	t1, err := a.Acquire(ctx, lock, 5*time.Second, 0)
	if err != nil || t1 == 0 {
		t.Fatalf("acquire: token %d, %v", t1, err)
	}
	if _, err := b.Acquire(ctx, lock, 5*time.Second, 0); !errors.Is(err, peers.ErrHeld) {
		t.Fatalf("second acquire: %v, want ErrHeld", err)
	}
	if err := a.Put(ctx, key, []byte("one"), t1); err != nil {
		t.Fatalf("put with token %d: %v", t1, err)
	}
	if err := a.Put(ctx, key, []byte("again"), t1); err != nil {
		t.Fatalf("put again with token %d: %v", t1, err)
	}
	if err := a.Put(ctx, key, []byte("stale"), t1-1); !errors.Is(err, peers.ErrStale) {
		t.Fatalf("put with token %d below fence %d: %v, want ErrStale", t1-1, t1, err)
	}
	if err := a.Put(ctx, key, []byte("unfenced"), 0); !errors.Is(err, peers.ErrStale) {
		t.Fatalf("put without token on a fenced key: %v, want ErrStale", err)
	}
	if v, found, err := b.Get(ctx, key); err != nil || !found || string(v) != "again" {
		t.Fatalf("get: %q %v %v, want \"again\"", v, found, err)
	}
	if _, found, err := b.Get(ctx, key+"/missing"); err != nil || found {
		t.Fatalf("get of a missing key: found %v, %v", found, err)
	}

	// b queues; a's release hands it the lock with a higher token.
	got := make(chan error, 1)
	var t2 uint64
	go func() {
		var err error
		t2, err = b.Acquire(ctx, lock, 5*time.Second, 5*time.Second)
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := a.Release(ctx, lock, t1); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting acquire: %v", err)
	}
	if t2 <= t1 {
		t.Fatalf("token %d after %d: want it higher", t2, t1)
	}
	if err := b.Put(ctx, key, []byte("two"), t2); err != nil {
		t.Fatalf("put with token %d: %v", t2, err)
	}
	if err := a.Put(ctx, key, []byte("late"), t1); !errors.Is(err, peers.ErrStale) {
		t.Fatalf("late put with the old token: %v, want ErrStale", err)
	}
	if err := b.Release(ctx, lock, t2); err != nil {
		t.Fatalf("release: %v", err)
	}

	for _, wl := range bench.Workloads {
		t.Run(string(wl), func(t *testing.T) {
			cfg := bench.DefaultConfig()
			cfg.Workload, cfg.Clients, cfg.Keys = wl, 4, 20
			cfg.Warmup, cfg.Duration = 50*time.Millisecond, 200*time.Millisecond
			cfg.Prefix = "test/" + run + "/"
			res, err := bench.Run(ctx, dial, cfg)
			if err != nil || res.Errors > 0 || res.Ops == 0 {
				t.Fatalf("%d ops, %d errors (%s): %v", res.Ops, res.Errors, res.FirstError, err)
			}
		})
	}
}
