package fencekv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

// collect reads events from w until it has n or the deadline passes.
func collect(t *testing.T, w *fencekv.Watcher, n int) []fencekv.Event {
	t.Helper()
	out, err := collectErr(w, n)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func collectErr(w *fencekv.Watcher, n int) ([]fencekv.Event, error) {
	var out []fencekv.Event
	deadline := time.After(10 * time.Second)
	for len(out) < n {
		select {
		case b, ok := <-w.Events():
			if !ok {
				return out, fmt.Errorf("watcher ended after %d of %d events: %v", len(out), n, w.Err())
			}
			out = append(out, b...)
		case <-deadline:
			return out, fmt.Errorf("%d of %d events within 10s", len(out), n)
		}
	}
	return out, nil
}

// TestWatchOrderNoGap: with writers on many keys at once, a watcher sees
// every write to its prefix once, in revision order, with the values
// written; one that resumes from a revision sees exactly the rest.
func TestWatchOrderNoGap(t *testing.T) {
	db := openDB(t, "", fencekvtest.NewClock(), nil)
	ctx := context.Background()
	const writers, each = 8, 50
	// Room for a batch per write: the consumer, on a busy machine, may
	// fall behind the 8 writers for a while, and cancelling a slow
	// watcher is not what this test is about (TestWatchSlowCancelled).
	w, err := db.Watch(ctx, fencekv.WatchOptions{Prefix: []byte("w/"), Buffer: writers * each})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	type result struct {
		es  []fencekv.Event
		err error
	}
	got := make(chan result, 1)
	go func() { // reads as the writes come
		es, err := collectErr(w, writers*each)
		got <- result{es, err}
	}()
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			for j := range each {
				db.Put(ctx, []byte(fmt.Sprintf("w/%d", i)), []byte(fmt.Sprint(j)), fencekv.WriteOptions{})
				db.Put(ctx, []byte(fmt.Sprintf("other/%d", i)), []byte("x"), fencekv.WriteOptions{})
			}
		})
	}
	wg.Wait()
	res := <-got
	if res.err != nil {
		t.Fatal(res.err)
	}
	es := res.es
	last := map[string]int{}
	for i, e := range es {
		if e.Type != "put" || string(e.Key[:2]) != "w/" {
			t.Fatalf("event %d = %+v; want puts under w/ only", i, e)
		}
		if i > 0 && e.Revision <= es[i-1].Revision {
			t.Fatalf("event %d at revision %d after %d: not in order", i, e.Revision, es[i-1].Revision)
		}
		var v int
		fmt.Sscan(string(e.Value), &v)
		if prev, ok := last[string(e.Key)]; ok && v != prev+1 || !ok && v != 0 {
			t.Fatalf("%s: value %d after %d: a gap or a repeat", e.Key, v, prev)
		}
		last[string(e.Key)] = v
	}
	// Resume from the middle: exactly the events from there.
	mid := es[len(es)/2]
	r, err := db.Watch(ctx, fencekv.WatchOptions{Prefix: []byte("w/"), StartRevision: mid.Revision})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rest := collect(t, r, len(es)-len(es)/2)
	for i, e := range rest {
		if want := es[len(es)/2+i]; e.Revision != want.Revision || string(e.Key) != string(want.Key) || string(e.Value) != string(want.Value) {
			t.Fatalf("resumed event %d = %+v; want %+v", i, e, want)
		}
	}
}

// TestWatchCompactedAndLocks: a start older than the window is compacted,
// with the oldest revision kept; lock events come with Locks, after the
// key events of their revision.
func TestWatchCompactedAndLocks(t *testing.T) {
	clock := fencekvtest.NewClock()
	db := openDB(t, "", clock, func(o *fencekv.Options) { o.WatchHistory = 10 })
	ctx := context.Background()
	for i := range 30 {
		db.Put(ctx, []byte("k"), []byte(fmt.Sprint(i)), fencekv.WriteOptions{})
	}
	_, err := db.Watch(ctx, fencekv.WatchOptions{StartRevision: 5})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeCompacted || fe.Revision != 21 {
		t.Fatalf("watch from revision 5 with a window of 10 events: %v; want compacted, oldest 21", err)
	}
	w, err := db.Watch(ctx, fencekv.WatchOptions{Locks: true, StartRevision: 21})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if es := collect(t, w, 10); es[0].Revision != 21 || es[9].Revision != 30 {
		t.Fatalf("replay = %d..%d; want 21..30", es[0].Revision, es[9].Revision)
	}
	l, err := db.Acquire(ctx, "L", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Put(ctx, []byte("k"), []byte("held"), fencekv.WriteOptions{Token: l.Token, Lock: "L"})
	if err := db.Release(ctx, "L", l.Token); err != nil {
		t.Fatal(err)
	}
	l2, _ := db.Acquire(ctx, "L", time.Second, nil)
	clock.Advance(2 * time.Second) // the expiry loop expires l2
	es := collect(t, w, 5)
	want := []string{"acquired 30", "put 31", "released 31", "acquired 31", "expired 31"}
	for i, e := range es {
		if got := fmt.Sprintf("%s %d", e.Type, e.Revision); got != want[i] {
			t.Fatalf("event %d = %s (%+v); want %s", i, got, e, want[i])
		}
	}
	if es[0].Token != l.Token || es[2].Token != l.Token || es[3].Token != l2.Token || es[4].Token != l2.Token {
		t.Fatalf("lock events' tokens: %+v", es)
	}
}

// TestWatchSlowCancelled: a watcher that never reads is cancelled when its
// buffer fills, and the writers never wait for it.
func TestWatchSlowCancelled(t *testing.T) {
	db := openDB(t, "", fencekvtest.NewClock(), nil)
	ctx := context.Background()
	w, err := db.Watch(ctx, fencekv.WatchOptions{Buffer: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := db.Put(ctx, []byte("k"), []byte(fmt.Sprint(i)), fencekv.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for range w.Events() {
		n++
	}
	if !errors.Is(w.Err(), fencekv.ErrWatchCancelled) || n < 4 || n >= 100 {
		t.Fatalf("slow watcher: %d batches, then %v; want its buffer's 4 (or a few more read while it was cancelled) and ErrWatchCancelled", n, w.Err())
	}
}

// TestWatchLimits: the history window is bounded by bytes as well as
// events (it kept up to 10,000 values of up to 1 MiB: 10 GiB), a replay
// goes out in batches of about 1 MiB (it was one batch, one notification,
// of the whole window), and the store serves at most MaxWatchers watchers
// at once (found in review).
func TestWatchLimits(t *testing.T) {
	db := openDB(t, "", fencekvtest.NewClock(), func(o *fencekv.Options) {
		o.WatchHistoryBytes = 3 << 20
		o.MaxWatchers = 3
	})
	ctx := context.Background()
	value := make([]byte, 400<<10)
	for range 20 {
		if _, err := db.Put(ctx, []byte("k"), value, fencekv.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := db.Watch(ctx, fencekv.WatchOptions{StartRevision: 1})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeCompacted {
		t.Fatalf("watch from revision 1 of 20 puts of 400 KiB in a window of 3 MiB: %v; want compacted", err)
	}
	kept := 20 - int(fe.Revision) + 1
	if kept < 6 || kept > 7 {
		t.Fatalf("the window keeps revisions %d-20 (%d puts of 400 KiB); want about 3 MiB of them", fe.Revision, kept)
	}
	w, err := db.Watch(ctx, fencekv.WatchOptions{StartRevision: fe.Revision})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	batches, events := 0, 0
	for events < kept {
		es := <-w.Events()
		batches++
		for _, e := range es {
			if e.Revision != fe.Revision+fencekv.Revision(events) || len(e.Value) != len(value) {
				t.Fatalf("replayed event %d: revision %d, %d bytes", events, e.Revision, len(e.Value))
			}
			events++
		}
	}
	if batches < 2 {
		t.Fatalf("a replay of %d events of 400 KiB came in %d batch; want batches of about 1 MiB", kept, batches)
	}
	w2, err := db.Watch(ctx, fencekv.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w3, err := db.Watch(ctx, fencekv.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w3.Close()
	if _, err := db.Watch(ctx, fencekv.WatchOptions{}); !errors.As(err, &fe) || fe.Code != fencekv.CodeLimitExceeded {
		t.Fatalf("a fourth watcher with MaxWatchers 3: %v; want limit_exceeded", err)
	}
	w2.Close()
	w4, err := db.Watch(ctx, fencekv.WatchOptions{})
	if err != nil {
		t.Fatalf("a watcher after one of the three closed: %v", err)
	}
	w4.Close()
	// A window whose replay would not fit a watcher's default buffer (256
	// batches of about 1 MiB) is refused at Open.
	o := fencekv.DefaultOptions()
	o.WatchHistoryBytes = 256<<20 + 1
	if db, err := fencekv.Open(t.TempDir(), &o); err == nil || !strings.Contains(err.Error(), "WatchHistoryBytes") {
		if db != nil {
			db.Close()
		}
		t.Fatalf("Open with WatchHistoryBytes over 256 MiB: %v; want refused", err)
	}
	o.WatchHistoryBytes = 256 << 20
	db2, err := fencekv.Open(t.TempDir(), &o)
	if err != nil {
		t.Fatalf("Open with WatchHistoryBytes of 256 MiB: %v", err)
	}
	db2.Close()
}
