package wire_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// TestWatchNotifications: a watch over the raw protocol answers its id,
// then sends every durable change under its prefix as notifications, in
// order; unwatch stops them; a watch from a revision replays the history.
func TestWatchNotifications(t *testing.T) {
	ts := startServer(t, nil)
	raw := dialRaw(t, ts.Addr)
	r := raw.call(1, "watch", map[string]any{"prefix": "w/", "locks": true})
	if r.err != nil {
		t.Fatalf("watch: %+v", r.err)
	}
	id := r.res["watch_id"]
	ctx := context.Background()
	c, err := wire.Dial(ctx, ts.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 3 {
		if _, err := c.Put(ctx, []byte(fmt.Sprint("w/", i)), []byte("v"), fencekv.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		c.Put(ctx, []byte("other"), []byte("v"), fencekv.WriteOptions{})
	}
	l, err := c.Acquire(ctx, "w/lock", 10e9, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 4 {
		m := raw.next()
		if len(m) != 3 || fmt.Sprint(m[0]) != "2" || m[1] != "watch" {
			t.Fatalf("message %v; want a watch notification", m)
		}
		p := m[2].([]any)[0].(map[string]any)
		if fmt.Sprint(p["watch_id"]) != fmt.Sprint(id) {
			t.Fatalf("notification for watch %v; want %v", p["watch_id"], id)
		}
		for _, ev := range p["events"].([]any) {
			e := ev.(map[string]any)
			switch e["type"] {
			case "put":
				got = append(got, fmt.Sprintf("put %s @%v", e["key"], e["revision"]))
			default:
				got = append(got, fmt.Sprintf("%s %s %v @%v", e["type"], e["lock"], e["token"], e["revision"]))
			}
		}
	}
	want := []string{"put w/0 @1", "put w/1 @3", "put w/2 @5", fmt.Sprintf("acquired w/lock %d @6", l.Token)}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %v; want %v", got, want)
	}
	if r := raw.call(2, "unwatch", map[string]any{"watch_id": id}); r.err != nil {
		t.Fatalf("unwatch: %+v", r.err)
	}
	// Resume from revision 3: w/1, w/2 and the lock, from the history.
	r = raw.call(3, "watch", map[string]any{"prefix": "w/", "locks": true, "start_revision": 3})
	if r.err != nil {
		t.Fatalf("watch from 3: %+v", r.err)
	}
	m := raw.next()
	p := m[2].([]any)[0].(map[string]any)
	if evs := p["events"].([]any); len(evs) != 3 {
		t.Fatalf("replay from revision 3: %v; want 3 events", evs)
	}
}

// TestWatchesPerConnection: a connection may hold at most MaxWatches
// watches (each costs a goroutine and a buffer; there was no bound):
// another is refused limit_exceeded, one freed by unwatch can be taken
// again, and another connection has its own.
func TestWatchesPerConnection(t *testing.T) {
	ts := startServer(t, func(_ *fencekv.Options, c *wire.Config) { c.MaxWatches = 2 })
	raw := dialRaw(t, ts.Addr)
	var ids []any
	for i := range 2 {
		r := raw.call(uint64(i+1), "watch", map[string]any{"prefix": "w/"})
		if r.err != nil {
			t.Fatalf("watch %d: %+v", i+1, r.err)
		}
		ids = append(ids, r.res["watch_id"])
	}
	if r := raw.call(3, "watch", map[string]any{"prefix": "w/"}); r.code() != "limit_exceeded" {
		t.Fatalf("a third watch with --max-watches 2: %+v; want limit_exceeded", r)
	}
	other := dialRaw(t, ts.Addr)
	if r := other.call(1, "watch", map[string]any{"prefix": "w/"}); r.err != nil {
		t.Fatalf("a watch on another connection: %+v", r.err)
	}
	if r := raw.call(4, "unwatch", map[string]any{"watch_id": ids[0]}); r.err != nil {
		t.Fatalf("unwatch: %+v", r.err)
	}
	if r := raw.call(5, "watch", map[string]any{"prefix": "w/"}); r.err != nil {
		t.Fatalf("a watch after an unwatch: %+v", r.err)
	}

	// Many watch requests at once (pipelined, served concurrently): still
	// at most MaxWatches of them are taken.
	burst := dialRaw(t, ts.Addr)
	const n = 64
	var buf []byte
	for i := range n {
		buf = append(buf, marshal(t, []any{0, i, "watch", []any{map[string]any{"prefix": "w/"}}})...)
	}
	burst.write(buf)
	taken := 0
	for range n {
		switch r := burst.reply(); {
		case r.err == nil:
			taken++
		case r.code() != "limit_exceeded":
			t.Fatalf("watch %d: %+v", r.id, r.err)
		}
	}
	if taken != 2 {
		t.Fatalf("%d of %d pipelined watches taken with --max-watches 2", taken, n)
	}
}

// TestWatchSurvivesLargeReads: a client that reads everything promptly
// keeps its watch while it pipelines reads whose answers, together, pass
// the pending budget. The event loop holds a round's answers until the
// round's end, so the budget is passed for a moment; a watch batch in
// that moment was once cancelled as "does not read its notifications".
func TestWatchSurvivesLargeReads(t *testing.T) {
	ts := startServer(t, nil) // the default budget, 4 MiB
	ctx := context.Background()
	big := make([]byte, 100<<10)
	_, err := ts.DB.Put(ctx, b("big"), big, fencekv.WriteOptions{})
	ok(t, err)
	raw := dialRaw(t, ts.Addr)
	raw.send([]any{0, 1, "watch", []any{map[string]any{"prefix": "w/"}}})
	if r := raw.reply(); r.err != nil {
		t.Fatalf("watch: %+v", r.err)
	}
	// Writes to the watched prefix, all along, paced (a notification per
	// write: an unpaced writer would outrun any watcher).
	stop := make(chan struct{})
	writer := make(chan error, 1)
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				writer <- nil
				return
			case <-tick.C:
			}
			if _, err := ts.DB.Put(ctx, b("w/x"), []byte(strconv.Itoa(i)), fencekv.WriteOptions{}); err != nil {
				writer <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		ok(t, <-writer)
	}()
	const rounds, gets = 20, 60 // 6 MB of answers a round
	id := 1
	for range rounds {
		var buf []byte
		for range gets {
			id++
			buf = append(buf, marshal(t, []any{0, id, "get", []any{map[string]any{"key": "big"}}})...)
		}
		raw.write(buf)
		for answered := 0; answered < gets; {
			m := raw.next()
			if num(t, m[0]) == 2 { // a notification
				if m[1] == "watch_cancelled" {
					t.Fatalf("the watch was cancelled: %v", m[2])
				}
				continue
			}
			if r := asReply(t, m); r.err != nil {
				t.Fatalf("get: %+v", r.err)
			}
			answered++
		}
	}
}

// TestWatchCancelledForClientNotReading: a watch whose client reads
// nothing is still cancelled once its notifications wait on it (over the
// budget, with the socket full for a while), rather than held in memory
// without bound.
func TestWatchCancelledForClientNotReading(t *testing.T) {
	ts := startServer(t, func(_ *fencekv.Options, c *wire.Config) { c.MaxPendingBytes = 64 << 10 })
	ctx := context.Background()
	raw := dialRaw(t, ts.Addr)
	raw.send([]any{0, 1, "watch", []any{map[string]any{"prefix": "w/"}}})
	if r := raw.reply(); r.err != nil {
		t.Fatalf("watch: %+v", r.err)
	}
	// The client reads nothing for 3 s while 32 KiB values are written
	// under the prefix (paced: a load, not a wait).
	value := make([]byte, 32<<10)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); <-tick.C {
		_, err := ts.DB.Put(ctx, b("w/x"), value, fencekv.WriteOptions{})
		ok(t, err)
	}
	for {
		m := raw.next()
		if num(t, m[0]) == 2 && m[1] == "watch_cancelled" {
			t.Logf("cancelled: %v", m[2])
			return
		}
	}
}
