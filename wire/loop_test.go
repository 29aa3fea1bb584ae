package wire_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// eachMode runs test on a server whose connections are served by the event
// loop, and on one that serves each from a goroutine.
func eachMode(t *testing.T, test func(t *testing.T, loop bool)) {
	for _, loop := range []bool{true, false} {
		t.Run(fmt.Sprintf("event loop %v", loop), func(t *testing.T) { test(t, loop) })
	}
}

func withLoop(loop bool) func(*fencekv.Options, *wire.Config) {
	return func(_ *fencekv.Options, c *wire.Config) { c.EventLoop = loop }
}

// TestHalfClosedClientGetsItsAnswers: a client that sends its requests and
// shuts its side down (end of stream) gets every answer before the server
// closes, writes applied; so does one whose requests and end of stream
// arrive together.
func TestHalfClosedClientGetsItsAnswers(t *testing.T) {
	eachMode(t, func(t *testing.T, loop bool) {
		ts := startServer(t, withLoop(loop))
		raw := dialRaw(t, ts.Addr)
		var msgs []any
		for i := range 20 {
			msgs = append(msgs, []any{0, i, "put", []any{map[string]any{"key": fmt.Sprint("hc/", i), "value": "v"}}})
		}
		msgs = append(msgs, []any{0, 20, "get", []any{map[string]any{"key": "hc/0"}}})
		raw.send(msgs...)
		if err := raw.nc.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got := map[uint64]bool{}
		for range 21 {
			p := raw.reply()
			if p.err != nil {
				t.Fatalf("answer %+v", p)
			}
			got[p.id] = true
		}
		if len(got) != 21 {
			t.Fatalf("answers to %v; want 0..20", got)
		}
		raw.expectClosed()
		for i := range 20 {
			if e, _ := ts.DB.Get(context.Background(), []byte(fmt.Sprint("hc/", i))); !e.Found {
				t.Fatalf("hc/%d not written", i)
			}
		}
	})
}

// TestMessagesCutAnywhere: requests that arrive cut at every byte, and
// many in one segment, are framed and answered alike.
func TestMessagesCutAnywhere(t *testing.T) {
	eachMode(t, func(t *testing.T, loop bool) {
		ts := startServer(t, withLoop(loop))
		raw := dialRaw(t, ts.Addr)
		big := bytes.Repeat([]byte("x"), 200<<10) // longer than one read of the loop
		req := marshal(t, []any{0, 1, "put", []any{map[string]any{"key": "cut", "value": big}}})
		// The first bytes one at a time, then the rest in odd pieces.
		for i := range 40 {
			raw.write(req[i : i+1])
			time.Sleep(time.Millisecond) // separate segments, not synchronisation
		}
		for off := 40; off < len(req); off += 7777 {
			raw.write(req[off:min(off+7777, len(req))])
		}
		if p := raw.reply(); p.id != 1 || p.err != nil {
			t.Fatalf("cut put: %+v", p)
		}
		// Fifty small requests in one write.
		var msgs []any
		for i := range 50 {
			msgs = append(msgs, []any{0, 100 + i, "get", []any{map[string]any{"key": "cut"}}})
		}
		raw.send(msgs...)
		for i := range 50 {
			p := raw.reply()
			if p.id != uint64(100+i) || p.err != nil || !bytes.Equal(p.res["value"].([]byte), big) {
				t.Fatalf("get %d: id %d err %v", i, p.id, p.err)
			}
		}
	})
}

// TestManyClientsEachGetTheirOwnAnswers: many connections writing and
// reading at once (the event loop shares one read buffer among them, and
// answers writes from the committing goroutine) each get the answers to
// their own requests, with their own values.
func TestManyClientsEachGetTheirOwnAnswers(t *testing.T) {
	eachMode(t, func(t *testing.T, loop bool) {
		ts := startServer(t, withLoop(loop))
		ctx := context.Background()
		var wg sync.WaitGroup
		for c := range 32 {
			wg.Go(func() {
				cl := dial(t, ts.Addr)
				l, err := cl.Acquire(ctx, fmt.Sprint("own/", c), time.Minute, nil)
				if err != nil {
					t.Error(err)
					return
				}
				for i := range 100 {
					key := []byte(fmt.Sprintf("own/%d/%d", c, i%5))
					val := []byte(fmt.Sprintf("%d-%d", c, i))
					r, err := cl.Put(ctx, key, val, fencekv.WriteOptions{Token: l.Token, Lock: fmt.Sprint("own/", c)})
					if err != nil || r.Fence != l.Token {
						t.Errorf("client %d put %d: %+v, %v", c, i, r, err)
						return
					}
					e, err := cl.Get(ctx, key)
					if err != nil || !bytes.Equal(e.Value, val) {
						t.Errorf("client %d get %d: %q, %v; want %q", c, i, e.Value, err, val)
						return
					}
				}
				if err := cl.Release(ctx, fmt.Sprint("own/", c), l.Token); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	})
}

// TestWritesBeyondOneBatch: a burst of writes larger than one batch, in
// one segment (on the event loop, a round of only writes, which the loop
// commits itself: one batch, then a committer for the rest), and a burst
// of writes and reads together (handed to a committer): every request is
// answered once, and every write applied once.
func TestWritesBeyondOneBatch(t *testing.T) {
	eachMode(t, func(t *testing.T, loop bool) {
		ts := startServer(t, func(o *fencekv.Options, c *wire.Config) { o.MaxBatch = 4; c.EventLoop = loop })
		raw := dialRaw(t, ts.Addr)
		var msgs []any
		for i := range 40 {
			msgs = append(msgs, []any{0, i, "incr", []any{map[string]any{"key": "n", "delta": 1}}})
		}
		raw.send(msgs...)
		msgs = msgs[:0]
		for i := range 40 {
			method, params := "incr", map[string]any{"key": "n", "delta": 1}
			if i%2 == 1 {
				method, params = "get", map[string]any{"key": "n"}
			}
			msgs = append(msgs, []any{0, 100 + i, method, []any{params}})
		}
		raw.send(msgs...)
		got := map[uint64]bool{}
		for range 80 {
			p := raw.reply()
			if p.err != nil || got[p.id] {
				t.Fatalf("answer %+v (answered before: %v)", p, got[p.id])
			}
			got[p.id] = true
		}
		if e, err := ts.DB.Get(context.Background(), []byte("n")); err != nil || string(e.Value) != "60" {
			t.Fatalf("n = %q, %v; want 60", e.Value, err)
		}
	})
}

// TestLockReadsAtExpiry: lock_info and locks, sent in one write with puts
// while a thousand leases have just run out and their expiries are being
// applied, are all answered, each lock reported either free or held with
// no time left (its expiry not applied yet, which a read on the event loop
// does not wait for: TestLockInfoWithoutCommitWait), and then the expiry
// loop frees them all.
func TestLockReadsAtExpiry(t *testing.T) {
	eachMode(t, func(t *testing.T, loop bool) {
		clock := fencekvtest.NewClock()
		ts := startServer(t, func(o *fencekv.Options, c *wire.Config) { o.Clock = clock; c.EventLoop = loop })
		c := dial(t, ts.Addr)
		ctx := context.Background()
		const locks = 1000
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < locks; i += 4 {
					if _, err := c.Acquire(ctx, fmt.Sprint("x/", i), time.Second, nil); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		raw := dialRaw(t, ts.Addr)
		clock.Advance(time.Second)
		var msgs []any
		for i := range locks {
			msgs = append(msgs, []any{0, 2 * i, "put", []any{map[string]any{"key": "k", "value": "v"}}},
				[]any{0, 2*i + 1, "lock_info", []any{map[string]any{"lock": fmt.Sprint("x/", locks-1-i)}}})
		}
		msgs = append(msgs, []any{0, 2 * locks, "locks", []any{map[string]any{"prefix": "x/"}}})
		raw.send(msgs...)
		pending := 0
		for range len(msgs) {
			r := raw.reply() // fails the test if none comes within 10s
			if r.err != nil {
				t.Fatalf("reply %d: %v", r.id, r.err)
			}
			if r.id%2 == 0 || r.id == 2*locks {
				continue
			}
			switch {
			case r.res["held"] == false:
			case num(t, r.res["ttl_ms"]) == 0:
				pending++
			default:
				t.Fatalf("lock_info after every lease ran out = %v", r.res)
			}
		}
		t.Logf("%d of %d lock_info answers found the expiry pending", pending, locks)
		// And the expiry loop frees them all.
		for deadline := time.Now().Add(10 * time.Second); ; {
			held, _, err := c.Locks(ctx, "x/", "", 0)
			ok(t, err)
			if len(held) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d locks still listed held 10s after their leases ran out", len(held))
			}
			time.Sleep(time.Millisecond)
		}
	})
}
