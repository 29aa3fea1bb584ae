package wire_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// BenchmarkRoundTrip measures round trips per second through one client
// connection over loopback TCP: one goroutine calling and waiting for each
// answer ("sequential"), against many goroutines sharing the client, whose
// calls are pipelined on the connection ("pipelined"). Gets are reads; puts
// are durable writes (fsync on), so pipelined puts show group commit.
//
//	go test -run '^$' -bench RoundTrip ./wire
func BenchmarkRoundTrip(b *testing.B) {
	ts := startServer(b, func(o *fencekv.Options, _ *wire.Config) { o.NoSync = false })
	c := dial(b, ts.Addr)
	ctx := context.Background()
	for i := range 1000 {
		if _, err := c.Put(ctx, key(i), []byte("value"), fencekv.WriteOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	ops := map[string]func(i int) error{
		"get": func(i int) error {
			_, err := c.Get(ctx, key(i%1000))
			return err
		},
		"put": func(i int) error {
			_, err := c.Put(ctx, key(i%1000), []byte("value"), fencekv.WriteOptions{})
			return err
		},
	}
	for _, name := range []string{"get", "put"} {
		op := ops[name]
		b.Run(name+"/sequential", func(b *testing.B) {
			i := 0
			for b.Loop() {
				if err := op(i); err != nil {
					b.Fatal(err)
				}
				i++
			}
			opsPerSec(b)
		})
		b.Run(name+"/pipelined", func(b *testing.B) {
			// 64 goroutines per GOMAXPROCS share the one client.
			b.SetParallelism(64)
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := op(int(n.Add(1))); err != nil {
						b.Error(err)
						return
					}
				}
			})
			opsPerSec(b)
		})
	}
}

func key(i int) []byte { return []byte(fmt.Sprintf("bench/%04d", i)) }

func opsPerSec(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "ops/s")
	}
}
