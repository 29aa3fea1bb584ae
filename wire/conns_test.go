package wire_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// BenchmarkIdleConns measures fenced puts from 16 busy clients while a
// number of idle connections stay open, to show that idle connections
// cost memory, not throughput. FENCEKV_IDLE sets the count (default 5000;
// each costs two file descriptors in this process).
//
//	go test -run '^$' -bench IdleConns -benchtime 5s ./wire
func BenchmarkIdleConns(b *testing.B) {
	idle := 5000
	if s := os.Getenv("FENCEKV_IDLE"); s != "" {
		var err error
		if idle, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range []int{0, idle} {
		b.Run("idle="+strconv.Itoa(n), func(b *testing.B) {
			ts := startServer(b, func(o *fencekv.Options, c *wire.Config) {
				o.NoSync = false
				c.MaxConns = n + 100
			})
			for i := 0; i < n; i++ {
				c := dial(b, ts.Addr)
				if i%1000 == 0 {
					if _, err := c.Ping(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
			}
			deadline := time.Now().Add(time.Minute)
			for ts.Srv.Conns() < n {
				if time.Now().After(deadline) {
					b.Fatalf("%d of %d idle connections accepted", ts.Srv.Conns(), n)
				}
				time.Sleep(time.Millisecond) // polling the accept count
			}
			const busy = 16
			clients := make([]*wire.Client, busy)
			for i := range clients {
				clients[i] = dial(b, ts.Addr)
			}
			ctx := context.Background()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N/busy + 1
			start := time.Now()
			for i, c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					k := []byte("busy/" + strconv.Itoa(i))
					for j := 0; j < per; j++ {
						if _, err := c.Put(ctx, k, []byte("value"), fencekv.WriteOptions{Token: fencekv.Token(j + 1)}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(per*busy)/time.Since(start).Seconds(), "ops/s")
			b.ReportMetric(float64(ts.Srv.Conns()), "conns")
		})
	}
}
