package fencekv_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
)

// The benchmarks run the real engine with its default options, fsync
// included, on a temp dir. Besides ns/op they report ops/s over all callers
// and, for writes, cmds/commit: how many commands group commit put in each
// transaction (and so each fsync).

var benchCallers = []int{1, 16, 64}

// benchOpen opens a durable engine in a temp dir.
func benchOpen(b *testing.B) *fencekv.DB {
	b.Helper()
	db, err := fencekv.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

// benchRun runs b.N calls of op spread over callers goroutines (op gets the
// caller's number) and reports throughput and commands per commit.
func benchRun(b *testing.B, db *fencekv.DB, callers int, op func(caller int) error) {
	b.Helper()
	ctx := context.Background()
	before, err := db.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for c := range callers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := op(c); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	after, err := db.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	if commits := after.Commits - before.Commits; commits > 0 {
		b.ReportMetric(float64(after.Commands-before.Commands)/float64(commits), "cmds/commit")
	}
}

// BenchmarkPut is a fenced put: each caller holds its own lock and writes
// its own key with the lock's token.
func BenchmarkPut(b *testing.B) {
	value := make([]byte, 100)
	for _, callers := range benchCallers {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			db := benchOpen(b)
			ctx := context.Background()
			keys, tokens := fencedKeys(b, db, callers)
			benchRun(b, db, callers, func(c int) error {
				_, err := db.Put(ctx, keys[c], value, fencekv.WriteOptions{Token: tokens[c]})
				return err
			})
		})
	}
}

// BenchmarkAcquireRelease is a lock cycle: each caller acquires its own
// lock and releases it (two commands per op).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, callers := range benchCallers {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			db := benchOpen(b)
			ctx := context.Background()
			names := make([]string, callers)
			for c := range callers {
				names[c] = fmt.Sprintf("bench/lock%d", c)
			}
			benchRun(b, db, callers, func(c int) error {
				l, err := db.Acquire(ctx, names[c], time.Minute, nil)
				if err != nil {
					return err
				}
				return db.Release(ctx, names[c], l.Token)
			})
		})
	}
}

// BenchmarkGet reads keys written with a token; reads run in read-only
// transactions beside the writer and commit nothing.
func BenchmarkGet(b *testing.B) {
	const nkeys = 1000
	for _, callers := range benchCallers {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			db := benchOpen(b)
			ctx := context.Background()
			l, err := db.Acquire(ctx, "bench/lock", time.Hour, nil)
			if err != nil {
				b.Fatal(err)
			}
			keys := make([][]byte, nkeys)
			var wg sync.WaitGroup
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "bench/key%04d", i)
				wg.Go(func() {
					if _, err := db.Put(ctx, keys[i], make([]byte, 100), fencekv.WriteOptions{Token: l.Token}); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			if b.Failed() {
				b.FailNow()
			}
			benchRun(b, db, callers, func(int) error {
				e, err := db.Get(ctx, keys[rand.IntN(nkeys)])
				if err == nil && !e.Found {
					err = fmt.Errorf("get %s: not found", e.Key)
				}
				return err
			})
		})
	}
}

// BenchmarkPutWatched is BenchmarkPut at 64 callers with 0 or 100
// watchers reading every event (one on each key's prefix, the rest on
// all keys): writes must keep their speed while watched.
func BenchmarkPutWatched(b *testing.B) {
	value := make([]byte, 100)
	const callers = 64
	for _, watchers := range []int{0, 100} {
		b.Run(fmt.Sprintf("watchers=%d", watchers), func(b *testing.B) {
			db := benchOpen(b)
			ctx := context.Background()
			keys, tokens := fencedKeys(b, db, callers)
			var wg sync.WaitGroup
			for i := range watchers {
				prefix := []byte("bench/")
				if i < callers {
					prefix = keys[i]
				}
				w, err := db.Watch(ctx, fencekv.WatchOptions{Prefix: prefix, Buffer: 1 << 16})
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for range w.Events() {
					}
				})
				b.Cleanup(w.Close)
			}
			benchRun(b, db, callers, func(c int) error {
				_, err := db.Put(ctx, keys[c], value, fencekv.WriteOptions{Token: tokens[c]})
				return err
			})
			b.StopTimer()
			db.Close() // ends the watchers
			wg.Wait()
		})
	}
}

// fencedKeys gives each caller its own key and the token of its own lock.
func fencedKeys(b *testing.B, db *fencekv.DB, callers int) ([][]byte, []fencekv.Token) {
	keys := make([][]byte, callers)
	tokens := make([]fencekv.Token, callers)
	for c := range callers {
		l, err := db.Acquire(context.Background(), fmt.Sprintf("bench/lock%d", c), time.Hour, nil)
		if err != nil {
			b.Fatal(err)
		}
		keys[c], tokens[c] = fmt.Appendf(nil, "bench/key%d", c), l.Token
	}
	return keys, tokens
}
