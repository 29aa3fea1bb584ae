package fencekv_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

// BenchmarkScale shows that live leases and keys cost memory and time in
// proportion: it grants N leases and writes N/10 keys, then reports heap and
// RSS per lease, and the cost of expiring every lease (driven by a fake
// clock, through the real expiry loop and batch leader).
//
// It runs without fsync (NoSync): it measures memory and CPU per lease, not
// the disk. Run it with
//
//	go test -run '^$' -bench Scale -benchtime 1x .
//
// and FENCEKV_SCALE=1000000 for the million-lease figure (default 100000).
func BenchmarkScale(b *testing.B) {
	n := 100_000
	if s := os.Getenv("FENCEKV_SCALE"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < b.N; i++ {
		scale(b, n)
	}
}

func scale(b *testing.B, n int) {
	ctx := context.Background()
	clock := fencekvtest.NewClock()
	o := fencekv.DefaultOptions()
	o.Clock = clock
	o.NoSync = true
	db, err := fencekv.Open(b.TempDir(), &o)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()

	heap0, rss0 := memory()
	start := time.Now()
	const workers = 64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += workers {
				l, err := db.Acquire(ctx, "lease/"+strconv.Itoa(i), time.Minute, nil)
				if err != nil {
					b.Error(err)
					return
				}
				if i%10 == 0 {
					if _, err := db.Put(ctx, []byte("key/"+strconv.Itoa(i)), []byte("value"), fencekv.WriteOptions{Token: l.Token}); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	grant := time.Since(start)
	heap1, rss1 := memory()
	st, err := db.Status(ctx)
	if err != nil || st.Locks != n || st.Keys != uint64(n/10) {
		b.Fatalf("status = %+v, %v; want %d locks and %d keys", st, err, n, n/10)
	}

	// Expire them all: one clock step past every deadline.
	start = time.Now()
	clock.Advance(2 * time.Minute)
	for {
		st, err := db.Status(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if st.Locks == 0 {
			break
		}
		if time.Since(start) > 10*time.Minute {
			b.Fatalf("%d leases still held after %v", st.Locks, time.Since(start))
		}
		time.Sleep(time.Millisecond) // polling a counter; nothing to wait on
	}
	expire := time.Since(start)

	b.ReportMetric(float64(n), "leases")
	b.ReportMetric(float64(grant.Nanoseconds())/float64(n), "ns/grant")
	b.ReportMetric(float64(expire.Nanoseconds())/float64(n), "ns/expiry")
	b.ReportMetric(float64(heap1-heap0)/float64(n), "heap-B/lease")
	b.ReportMetric(float64(rss1-rss0)/float64(n), "rss-B/lease")
	b.Logf("%d leases + %d keys: grants %v (%v each), expiry of all %v (%v each), heap +%d MiB, RSS +%d MiB, file %d MiB",
		n, n/10, grant.Round(time.Millisecond), grant/time.Duration(n), expire.Round(time.Millisecond), expire/time.Duration(n),
		(heap1-heap0)>>20, (rss1-rss0)>>20, st.DataSize>>20)
}

// memory returns the live heap after a GC, and the process's RSS.
func memory() (heap, rss int64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap = int64(ms.HeapAlloc)
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		f := strings.Fields(string(b))
		if len(f) > 1 {
			var pages int64
			fmt.Sscan(f[1], &pages)
			rss = pages * int64(os.Getpagesize())
		}
	}
	return heap, rss
}
