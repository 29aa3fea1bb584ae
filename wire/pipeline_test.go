package wire_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// TestPipelineRaw writes many requests before reading any response: every
// one is answered exactly once, matched by msgid.
func TestPipelineRaw(t *testing.T) {
	ts := startServer(t, nil)
	raw := dialRaw(t, ts.Addr)
	const n = 300 // below the default in-flight limit of 1024
	var buf []byte
	for i := range n {
		buf = append(buf, marshal(t, []any{0, 3 * i, "incr", []any{map[string]any{"key": "ctr", "delta": 1}}})...)
		buf = append(buf, marshal(t, []any{0, 3*i + 1, "put", []any{map[string]any{"key": fmt.Sprintf("p/%03d", i), "value": "v"}}})...)
		buf = append(buf, marshal(t, []any{0, 3*i + 2, "ping", []any{}})...)
	}
	raw.write(buf)
	seen := make(map[uint64]bool)
	counts := make(map[int64]bool) // the incr results: each of 1..n once
	for range 3 * n {
		p := raw.reply()
		if seen[p.id] || p.id >= 3*n {
			t.Fatalf("msgid %d answered twice or never asked", p.id)
		}
		seen[p.id] = true
		if p.err != nil {
			t.Fatalf("request %d refused: %v", p.id, p.err)
		}
		switch p.id % 3 {
		case 0:
			counts[snum(t, p.res["value"])] = true
		case 1:
			if _, has := p.res["revision"]; !has {
				t.Fatalf("put %d answered %v", p.id, p.res)
			}
		case 2:
			if p.res["version"] != fencekv.Version {
				t.Fatalf("ping %d answered %v", p.id, p.res)
			}
		}
	}
	for v := int64(1); v <= n; v++ {
		if !counts[v] {
			t.Fatalf("no incr answered %d; the increments were not applied one at a time", v)
		}
	}
	items, _, err := ts.DB.Scan(context.Background(), fencekv.ScanOptions{Prefix: b("p/")})
	ok(t, err)
	if len(items) != n {
		t.Fatalf("%d keys written; want %d", len(items), n)
	}
}

// TestPipelineOutOfOrder has a blocked acquire in flight on a connection
// while later requests on the same connection are answered first.
func TestPipelineOutOfOrder(t *testing.T) {
	ts, holder, l := lockHeld(t, nil)
	ctx := context.Background()

	raw := dialRaw(t, ts.Addr)
	raw.send(
		[]any{0, 1, "acquire", []any{map[string]any{"lock": "L", "ttl_ms": 5000, "wait_ms": 60_000}}},
		[]any{0, 2, "ping", []any{}},
		[]any{0, 3, "put", []any{map[string]any{"key": "k", "value": "v"}}},
		[]any{0, 4, "get", []any{map[string]any{"key": "k"}}},
	)
	// 2 and 3 are independent; 4 may run before 3, so only its layout is
	// checked. All three come back while 1 still waits.
	got := map[uint64]reply{}
	for range 3 {
		p := raw.reply()
		got[p.id] = p
	}
	if _, early := got[1]; early {
		t.Fatalf("the blocked acquire was answered while the lock was held: %+v", got[1])
	}
	if got[2].err != nil || got[3].err != nil || got[4].err != nil {
		t.Fatalf("requests behind the blocked acquire: %+v", got)
	}
	// The acquire is served by a goroutine of its own: it may reach the
	// queue after the answers behind it have gone.
	eventually(t, 10*time.Second, "the raw connection's acquire to queue", func() bool { return waiters(t, ts.DB, "L") == 1 })
	ok(t, holder.Release(ctx, "L", l.Token))
	p := raw.reply()
	if p.id != 1 || p.err != nil || num(t, p.res["token"]) <= uint64(l.Token) {
		t.Fatalf("the queued acquire = %+v; want a grant above token %d", p, l.Token)
	}

	// The Go client does the same: a blocked Acquire holds up nothing.
	l2 := fencekv.Token(num(t, p.res["token"]))
	c := dial(t, ts.Addr)
	granted := make(chan fencekv.Lease, 1)
	go func() {
		l, err := c.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: time.Minute})
		if err != nil {
			t.Errorf("queued acquire: %v", err)
		}
		granted <- l
	}()
	eventually(t, 10*time.Second, "the client's acquire to queue", func() bool { return waiters(t, ts.DB, "L") == 1 })
	for i := range 20 {
		if _, err := c.Put(ctx, b("k"), b(fmt.Sprint(i)), fencekv.WriteOptions{}); err != nil {
			t.Fatalf("put while an acquire waits: %v", err)
		}
	}
	select {
	case l := <-granted:
		t.Fatalf("acquire returned %+v while the lock was held", l)
	default:
	}
	if p := raw.call(5, "release", map[string]any{"lock": "L", "token": uint64(l2)}); p.err != nil {
		t.Fatalf("release = %+v", p)
	}
	if l := <-granted; l.Token <= l2 {
		t.Fatalf("client's grant %d; want above %d", l.Token, l2)
	}
}

// TestPipelineCloseDropsWaits checks that a connection that closes takes
// its queued acquires with it: nobody is granted a lock for a caller that
// is gone.
func TestPipelineCloseDropsWaits(t *testing.T) {
	ts, holder, l := lockHeld(t, nil)
	ctx := context.Background()

	raw := dialRaw(t, ts.Addr)
	raw.send(
		[]any{0, 1, "acquire", []any{map[string]any{"lock": "L", "ttl_ms": 5000, "wait_ms": 60_000}}},
		[]any{0, 2, "acquire", []any{map[string]any{"lock": "L", "ttl_ms": 5000, "wait_ms": 60_000}}},
	)
	c := dial(t, ts.Addr)
	queued := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: time.Minute})
		queued <- err
	}()
	eventually(t, 10*time.Second, "three queued acquires", func() bool { return waiters(t, ts.DB, "L") == 3 })
	in, err := holder.LockInfo(ctx, "L")
	ok(t, err)
	if in.Waiters != 3 {
		t.Fatalf("lock_info waiters = %d over the wire; want 3", in.Waiters)
	}

	raw.nc.Close()
	c.Close()
	eventually(t, 10*time.Second, "the closed connections' waits to go", func() bool { return waiters(t, ts.DB, "L") == 0 })
	if err := <-queued; err == nil {
		t.Fatalf("acquire on a closed client succeeded")
	}
	ok(t, holder.Release(ctx, "L", l.Token))
	in, err = holder.LockInfo(ctx, "L")
	ok(t, err)
	if in.Held || in.Waiters != 0 {
		t.Fatalf("after release: %+v; want free, with no grant to a closed connection", in)
	}
	st, err := holder.Status(ctx)
	ok(t, err)
	if st.LastToken != l.Token || st.Waiters != 0 {
		t.Fatalf("status %+v; want no token issued after %d", st, l.Token)
	}
}

// TestPipelineClientConcurrent shares one client between many goroutines.
func TestPipelineClientConcurrent(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.Addr)
	ctx := context.Background()
	const workers, each = 32, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			key := b(fmt.Sprintf("w/%d", w))
			for i := range each {
				if _, _, err := c.Incr(ctx, b("shared"), 1, fencekv.WriteOptions{}); err != nil {
					t.Errorf("incr: %v", err)
					return
				}
				if _, err := c.Put(ctx, key, b(fmt.Sprint(i)), fencekv.WriteOptions{}); err != nil {
					t.Errorf("put: %v", err)
					return
				}
				e, err := c.Get(ctx, key)
				if err != nil || string(e.Value) != fmt.Sprint(i) {
					t.Errorf("worker %d read %q, %v after writing %d", w, e.Value, err, i)
					return
				}
			}
		})
	}
	wg.Wait()
	e, err := c.Get(ctx, b("shared"))
	ok(t, err)
	if string(e.Value) != fmt.Sprint(workers*each) {
		t.Fatalf("shared counter %s; want %d", e.Value, workers*each)
	}
}

// TestPipelineInFlightLimitRaw pipelines past the in-flight limit: the
// requests over it are refused with limit_exceeded at once, the others
// answered, and the connection stays usable. Reads (ping, get, scan,
// lock_info, locks, status) are served by the reader itself and take no
// slot; so, on a goroutine connection, do writes that arrive with nothing
// behind them; on the event loop every write takes one; an acquire that
// may wait always takes one.
func TestPipelineInFlightLimitRaw(t *testing.T) {
	for _, loop := range []bool{true, false} {
		t.Run(fmt.Sprintf("event loop %v", loop), func(t *testing.T) { testPipelineInFlightLimitRaw(t, loop) })
	}
}

func testPipelineInFlightLimitRaw(t *testing.T, loop bool) {
	ts, holder, l := lockHeld(t, func(_ *fencekv.Options, cfg *wire.Config) { cfg.MaxInFlight = 2; cfg.EventLoop = loop })
	ctx := context.Background()
	raw := dialRaw(t, ts.Addr)
	acq := []any{map[string]any{"lock": "L", "ttl_ms": 1000, "wait_ms": 60_000}}
	raw.send([]any{0, 1, "acquire", acq}, []any{0, 2, "acquire", acq})
	eventually(t, 10*time.Second, "two queued acquires", func() bool { return waiters(t, ts.DB, "L") == 2 })
	raw.send([]any{0, 3, "acquire", acq}, []any{0, 4, "acquire", acq})
	for _, want := range []uint64{3, 4} {
		p := raw.reply()
		if p.id != want || p.code() != "limit_exceeded" {
			t.Fatalf("request %d over the limit: %+v; want limit_exceeded", want, p)
		}
	}
	// Reads are still served while the slots are full; on a goroutine
	// connection, so is a write with nothing behind it.
	if p := raw.call(8, "ping"); p.err != nil {
		t.Fatalf("ping with the slots full: %+v", p)
	}
	p := raw.call(9, "put", map[string]any{"key": "k", "value": "v"})
	switch {
	case loop && p.code() != "limit_exceeded":
		t.Fatalf("a put with the slots full on the event loop: %+v; want limit_exceeded", p)
	case !loop && p.err != nil:
		t.Fatalf("a lone put with the slots full: %+v", p)
	}
	// A notification over the limit is dropped without an answer. The
	// refused acquire after it shows it was read while the slots were full.
	raw.send([]any{2, "put", []any{map[string]any{"key": "dropped", "value": "v"}}}, []any{0, 7, "acquire", acq})
	if p := raw.reply(); p.id != 7 || p.code() != "limit_exceeded" {
		t.Fatalf("acquire after the notification: %+v; want limit_exceeded", p)
	}
	ok(t, holder.Release(ctx, "L", l.Token))
	// The two acquires queued in either order; the first in the queue is
	// granted now, the other when the first releases.
	first := raw.reply()
	if (first.id != 1 && first.id != 2) || first.err != nil {
		t.Fatalf("first queued acquire: %+v", first)
	}
	raw.send([]any{0, 5, "release", []any{map[string]any{"lock": "L", "token": num(t, first.res["token"])}}})
	got := map[uint64]reply{}
	for range 2 {
		p := raw.reply()
		got[p.id] = p
	}
	second := 3 - first.id
	if got[5].err != nil || got[second].err != nil || got[second].res == nil {
		t.Fatalf("release and second grant: %+v", got)
	}
	if p := raw.call(6, "ping"); p.err != nil {
		t.Fatalf("ping after the limit: %+v", p)
	}
	if e, _ := ts.DB.Get(ctx, b("dropped")); e.Found {
		t.Fatalf("a notification over the in-flight limit was applied")
	}
}

// TestAnswersLargerThanBudget: with a budget of unsent answers far below
// the size of one answer, every answer is still sent (one is admitted
// whenever nothing else is pending), pipelined or not.
func TestAnswersLargerThanBudget(t *testing.T) {
	ts := startServer(t, func(_ *fencekv.Options, cfg *wire.Config) { cfg.MaxPendingBytes = 1 << 10 })
	ctx := context.Background()
	big := bytes.Repeat([]byte("v"), 500<<10) // four make a scan page of about 2 MB
	for i := range 4 {
		_, err := ts.DB.Put(ctx, fmt.Appendf(nil, "big/%d", i), big, fencekv.WriteOptions{})
		ok(t, err)
	}
	c := dial(t, ts.Addr)
	e, err := c.Get(ctx, b("big/0"))
	ok(t, err)
	if !bytes.Equal(e.Value, big) {
		t.Fatalf("get of a value over the budget: %d bytes", len(e.Value))
	}
	raw := dialRaw(t, ts.Addr)
	const n = 20
	var msgs []any
	for i := range n {
		if i%2 == 0 {
			msgs = append(msgs, []any{0, i, "get", []any{map[string]any{"key": "big/1"}}})
		} else {
			msgs = append(msgs, []any{0, i, "scan", []any{map[string]any{"prefix": "big/"}}})
		}
	}
	raw.send(msgs...)
	for range n {
		p := raw.reply()
		if p.err != nil {
			t.Fatalf("request %d: %v", p.id, p.err)
		}
		if p.id%2 == 1 {
			if items, _ := p.res["items"].([]any); len(items) != 4 {
				t.Fatalf("scan %d: %d items", p.id, len(items))
			}
		}
	}
}

// TestPipelineSplitWrites sends puts and gets, pipelined and cut into
// writes of 1 to 40 bytes, so that the server reads messages in pieces and
// several in one read: on the event loop, a message that arrives whole is
// parsed in place with its byte arguments borrowed from the read buffer,
// and one that does not is framed as it comes. A put outlives the read
// that brought it (rounds with reads hand their writes to a committer,
// which applies them while the loop reads on), so it must own its bytes
// before the buffer is read into again: every put must store its own
// value, and every get must answer its key's value.
func TestPipelineSplitWrites(t *testing.T) {
	ts := startServer(t, nil)
	ctx := context.Background()
	const n = 300
	value := func(prefix string, i int) []byte {
		return []byte(fmt.Sprintf("%s %d %s", prefix, i, bytes.Repeat([]byte{byte('a' + i%26)}, i%300)))
	}
	for i := range n {
		_, err := ts.DB.Put(ctx, b(fmt.Sprintf("pre/%03d", i)), value("pre", i), fencekv.WriteOptions{})
		ok(t, err)
	}
	raw := dialRaw(t, ts.Addr)
	rng := rand.New(rand.NewPCG(7, 8))
	var buf []byte
	for i := range n {
		var v any = string(value("put", i))
		if i%2 == 0 {
			v = value("put", i) // bin
		}
		buf = append(buf, marshal(t, []any{0, 2 * i, "put", []any{map[string]any{"key": fmt.Sprintf("s/%03d", i), "value": v}}})...)
		buf = append(buf, marshal(t, []any{0, 2*i + 1, "get", []any{map[string]any{"key": fmt.Sprintf("pre/%03d", i)}}})...)
	}
	go func() {
		for len(buf) > 0 {
			k := min(len(buf), 1+rng.IntN(40))
			if _, err := raw.nc.Write(buf[:k]); err != nil {
				return // the test failed and closed it
			}
			buf = buf[k:]
		}
	}()
	seen := map[uint64]bool{}
	for range 2 * n {
		p := raw.reply()
		if p.err != nil || p.id >= 2*n || seen[p.id] {
			t.Fatalf("request %d: %v %v (answered before: %v)", p.id, p.err, p.res, seen[p.id])
		}
		seen[p.id] = true
		if p.id%2 == 1 {
			i := int(p.id / 2)
			if got, _ := p.res["value"].([]byte); !bytes.Equal(got, value("pre", i)) {
				t.Fatalf("get pre/%03d answered %q; want %q", i, got, value("pre", i))
			}
		}
	}
	for i := range n {
		e, err := ts.DB.Get(ctx, b(fmt.Sprintf("s/%03d", i)))
		ok(t, err)
		if !bytes.Equal(e.Value, value("put", i)) {
			t.Fatalf("s/%03d holds %q; want %q", i, e.Value, value("put", i))
		}
	}
}
