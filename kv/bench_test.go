package kv

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkPutWhileScanning measures the writer's Put + Publish (and a
// Checkpoint every 256 puts, as the engine's batches and checkpoints go)
// while four readers scan back to back, as the outside tester's four
// clients did: over a range of 100k deleted keys (scan=deleted), or the
// first 100 of 10k live keys (scan=live); idle has no readers. It reports
// the mean (ns/op) and the median and 99th percentile of one Put +
// Publish (+ Checkpoint).
func BenchmarkPutWhileScanning(b *testing.B) {
	for _, bb := range []struct {
		name     string
		scanners int
		prefix   string
	}{
		{"idle", 0, ""},
		{"scan=deleted", 4, "dead/"},
		{"scan=live", 4, "scan/"},
	} {
		b.Run(bb.name, func(b *testing.B) { benchPutWhileScanning(b, bb.scanners, bb.prefix) })
	}
}

func benchPutWhileScanning(b *testing.B, scanners int, prefix string) {
	s, err := Open(filepath.Join(b.TempDir(), "kv.db"), Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	w, err := s.Writer()
	if err != nil {
		b.Fatal(err)
	}
	for i := range 100_000 {
		key := fmt.Appendf(nil, "dead/%07d", i)
		if _, err := w.Put(key, []byte("value"), Write{Token: w.NextToken()}); err != nil {
			b.Fatal(err)
		}
		if _, _, err := w.Delete(key, Write{Token: w.LastToken()}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 10_000 {
		if _, err := w.Put(fmt.Appendf(nil, "scan/%05d", i), make([]byte, 100), Write{}); err != nil {
			b.Fatal(err)
		}
	}
	s.Publish()
	if err := s.Checkpoint(Marks{}); err != nil {
		b.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range scanners {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = s.View(func(tx *Tx) error {
					tx.Scan([]byte(prefix), nil, 100, 1<<20)
					return nil
				})
			}
		})
	}

	value := make([]byte, 100)
	lat := make([]time.Duration, 0, 1<<16)
	i := 0
	for b.Loop() {
		start := time.Now()
		w, err := s.Writer()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := w.Put(fmt.Appendf(nil, "live/%04d", i%1000), value, Write{}); err != nil {
			b.Fatal(err)
		}
		s.Publish()
		if i%256 == 255 {
			if err := s.Checkpoint(Marks{Applied: uint64(i)}); err != nil {
				b.Fatal(err)
			}
		}
		lat = append(lat, time.Since(start))
		i++
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}
