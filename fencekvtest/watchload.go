package fencekvtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// WatchLog collects what a wire watcher delivers, as it comes.
type WatchLog struct {
	w    *wire.Watcher
	mu   sync.Mutex
	es   []fencekv.Event
	more chan struct{} // closed (and replaced) when es grows
	done chan struct{}
}

// CollectEvents reads w's events until it ends.
func CollectEvents(w *wire.Watcher) *WatchLog {
	l := &WatchLog{w: w, more: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for b := range w.Events() {
			l.mu.Lock()
			l.es = append(l.es, b...)
			close(l.more)
			l.more = make(chan struct{})
			l.mu.Unlock()
		}
	}()
	return l
}

// Events returns a copy of the events so far.
func (l *WatchLog) Events() []fencekv.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]fencekv.Event(nil), l.es...)
}

// UntilKey waits until a put of key has come and returns the events up to
// and including it; the test fails if it does not come within d or the
// watcher ends first.
func (l *WatchLog) UntilKey(tb testing.TB, key string, d time.Duration) []fencekv.Event {
	tb.Helper()
	deadline := time.After(d)
	for {
		l.mu.Lock()
		for i, e := range l.es {
			if e.Type == "put" && string(e.Key) == key {
				out := append([]fencekv.Event(nil), l.es[:i+1]...)
				l.mu.Unlock()
				return out
			}
		}
		n, more := len(l.es), l.more
		l.mu.Unlock()
		select {
		case <-more:
		case <-l.done:
			tb.Fatalf("the watcher ended after %d events, before a put of %s: %v", n, key, l.w.Err())
		case <-deadline:
			tb.Fatalf("no put of %s within %v (%d events)", key, d, n)
		}
	}
}

// HistoryWriter puts values under a prefix, one key of 5 after another,
// and takes and releases locks now and then, through one client, until
// Stop; it records what was acknowledged (a failed call is passed over:
// its outcome is unknown).
type HistoryWriter struct {
	mu    sync.Mutex
	acked []Acked
	stop  chan struct{}
	done  chan struct{}
}

// StartHistoryWriter starts writing through cl.
func StartHistoryWriter(cl *wire.Client, prefix string) *HistoryWriter {
	h := &HistoryWriter{stop: make(chan struct{}), done: make(chan struct{})}
	go h.run(cl, prefix)
	return h
}

func (h *HistoryWriter) run(cl *wire.Client, prefix string) {
	defer close(h.done)
	call := func(fn func(ctx context.Context) error) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := fn(ctx); err != nil {
			select { // the server is down or failing over: not a busy loop
			case <-h.stop:
			case <-time.After(20 * time.Millisecond):
			}
			return false
		}
		return true
	}
	for i := 0; ; i++ {
		select {
		case <-h.stop:
			return
		default:
		}
		k, v := fmt.Sprintf("%s%d", prefix, i%5), fmt.Sprint(i)
		call(func(ctx context.Context) error {
			r, err := cl.Put(ctx, []byte(k), []byte(v), fencekv.WriteOptions{})
			if err == nil {
				h.add(Acked{Type: "put", Key: k, Value: v, Revision: r.Revision})
			}
			return err
		})
		if i%10 != 7 {
			continue
		}
		name := fmt.Sprintf("%slock/%d", prefix, i)
		var l fencekv.Lease
		if !call(func(ctx context.Context) (err error) {
			l, err = cl.Acquire(ctx, name, time.Second, nil)
			return err
		}) {
			continue
		}
		h.add(Acked{Type: "acquired", Lock: name, Token: l.Token})
		call(func(ctx context.Context) error {
			err := cl.Release(ctx, name, l.Token)
			if err == nil {
				h.add(Acked{Type: "released", Lock: name, Token: l.Token})
			}
			return err
		})
	}
}

func (h *HistoryWriter) add(a Acked) {
	h.mu.Lock()
	h.acked = append(h.acked, a)
	h.mu.Unlock()
}

// Puts is the number of puts acknowledged so far.
func (h *HistoryWriter) Puts() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, a := range h.acked {
		if a.Type == "put" {
			n++
		}
	}
	return n
}

// WaitPuts waits until n puts are acknowledged.
func (h *HistoryWriter) WaitPuts(tb testing.TB, n int, d time.Duration) {
	tb.Helper()
	Eventually(tb, d, fmt.Sprintf("%d puts acknowledged", n), func() bool { return h.Puts() >= n })
}

// Stop stops the writer and returns what was acknowledged.
func (h *HistoryWriter) Stop() []Acked {
	close(h.stop)
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.acked
}
