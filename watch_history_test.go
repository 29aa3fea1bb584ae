package fencekv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

// The watch history survives a restart (state/history.go): a watch
// resumed from a revision still kept gets every event after it, with no
// gap and no repeat, after a clean restart and after a crash (the data
// file as a kill -9 leaves it, with the log's tail to replay). The
// process-level tests (kill -9 of a real server, a cluster node's
// restart and a leader failover) are in history_process_test.go and
// cluster/history_process_test.go.

// historyLoad makes puts under h/ and lock changes, and returns what was
// acknowledged.
func historyLoad(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock, round, n int) []fencekvtest.Acked {
	t.Helper()
	ctx := context.Background()
	var acked []fencekvtest.Acked
	for i := range n {
		k, v := fmt.Sprintf("h/%d", i%7), fmt.Sprintf("%d.%d", round, i)
		e, err := db.Put(ctx, []byte(k), []byte(v), fencekv.WriteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		acked = append(acked, fencekvtest.Acked{Type: "put", Key: k, Value: v, Revision: e.Revision})
		if i%10 == 3 {
			l, err := db.Acquire(ctx, "L", time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			acked = append(acked, fencekvtest.Acked{Type: "acquired", Lock: "L", Token: l.Token})
			if err := db.Release(ctx, "L", l.Token); err != nil {
				t.Fatal(err)
			}
			acked = append(acked, fencekvtest.Acked{Type: "released", Lock: "L", Token: l.Token})
		}
	}
	return acked
}

// untilKey collects w's events up to and including a put of key.
func untilKey(t *testing.T, w *fencekv.Watcher, key string) []fencekv.Event {
	t.Helper()
	return until(t, w, key, func(e *fencekv.Event) bool { return e.Type == "put" && string(e.Key) == key })
}

// until collects w's events up to and including one for which stop holds.
func until(t *testing.T, w *fencekv.Watcher, what string, stop func(*fencekv.Event) bool) []fencekv.Event {
	t.Helper()
	var out []fencekv.Event
	deadline := time.After(10 * time.Second)
	for {
		select {
		case b, ok := <-w.Events():
			if !ok {
				t.Fatalf("watcher ended after %d events: %v", len(out), w.Err())
			}
			for _, e := range b {
				out = append(out, e)
				if stop(&e) {
					return out
				}
			}
		case <-deadline:
			t.Fatalf("no %s within 10s (%d events)", what, len(out))
		}
	}
}

// watchAll watches everything, with locks, from revision from, and
// collects up to a put of mark (written after it starts).
func watchAll(t *testing.T, db *fencekv.DB, from fencekv.Revision, mark string) []fencekv.Event {
	t.Helper()
	w, err := db.Watch(context.Background(), fencekv.WatchOptions{Locks: true, StartRevision: from})
	if err != nil {
		t.Fatalf("watch from revision %d: %v", from, err)
	}
	defer w.Close()
	if _, err := db.Put(context.Background(), []byte(mark), nil, fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	es := untilKey(t, w, mark)
	return es[:len(es)-1]
}

// TestWatchHistoryRestart: the events a watcher got live are the history
// a watch from revision 1 replays after a clean restart, and after a
// crash (as far as the crash left them: every acknowledged change).
func TestWatchHistoryRestart(t *testing.T) {
	dir, crashed := t.TempDir(), t.TempDir()
	clock := fencekvtest.NewClock()
	db := openDB(t, dir, clock, nil)
	live, err := db.Watch(context.Background(), fencekv.WatchOptions{Locks: true, Buffer: 4096})
	if err != nil {
		t.Fatal(err)
	}
	acked := historyLoad(t, db, clock, 0, 40)
	// A lease that runs out: an expired event, from the expiry loop.
	l, err := db.Acquire(context.Background(), "X", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	acked = append(acked, fencekvtest.Acked{Type: "acquired", Lock: "X", Token: l.Token})
	clock.Advance(2 * time.Second)
	before := until(t, live, "X's expiry", func(e *fencekv.Event) bool { return e.Type == "expired" })
	if _, err := db.Put(context.Background(), []byte("mark/0"), nil, fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	before = append(before, untilKey(t, live, "mark/0")...)
	fencekvtest.CopyFiles(t, dir, crashed) // what a kill -9 now would leave
	acked = append(acked, historyLoad(t, db, clock, 1, 25)...)
	if _, err := db.Put(context.Background(), []byte("mark/1"), nil, fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	all := append(append([]fencekv.Event(nil), before...), untilKey(t, live, "mark/1")...)
	if err := fencekvtest.CheckHistory(all, acked, 1); err != nil {
		t.Fatalf("live: %v", err)
	}
	live.Close()

	db = reopen(t, db, dir, clock)
	got := watchAll(t, db, 1, "mark/2")
	if err := fencekvtest.SameEvents(got, all); err != nil {
		t.Fatalf("after a clean restart, a watch from revision 1: %v", err)
	}
	// Resumed from the middle: exactly the rest.
	mid := all[len(all)/2].Revision
	got = watchAll(t, db, mid, "mark/3")
	var want []fencekv.Event
	for _, e := range all {
		if e.Revision >= mid {
			want = append(want, e)
		}
	}
	want = append(want, fencekv.Event{Type: "put", Key: []byte("mark/2"), Value: []byte{}, Revision: all[len(all)-1].Revision + 1})
	if err := fencekvtest.SameEvents(got, want); err != nil {
		t.Fatalf("after a clean restart, a watch from revision %d: %v", mid, err)
	}

	// The crash image: the log replays what the data file lacks; its
	// events are kept once.
	cdb := openDB(t, crashed, clock, nil)
	got = watchAll(t, cdb, 1, "mark/c")
	if err := fencekvtest.SameEvents(got, before); err != nil {
		t.Fatalf("after a crash, a watch from revision 1: %v", err)
	}
	// And again, now that the replay was checkpointed.
	cdb = reopen(t, cdb, crashed, clock)
	got = watchAll(t, cdb, 1, "mark/d")
	if err := fencekvtest.CheckHistory(got, nil, 1); err != nil || len(got) != len(before)+1 {
		t.Fatalf("after a crash and a restart: %d events (want %d): %v", len(got), len(before)+1, err)
	}
}

// TestWatchHistoryCompactedOnlyWhenDropped: after a restart, a watch from
// the oldest revision kept replays from there; one from the revision
// before is compacted, with the oldest kept; and a restart with a larger
// window serves what the file kept.
func TestWatchHistoryCompactedOnlyWhenDropped(t *testing.T) {
	dir := t.TempDir()
	clock := fencekvtest.NewClock()
	small := func(o *fencekv.Options) { o.WatchHistory = 10 }
	db := openDB(t, dir, clock, small)
	for i := range 35 {
		db.Put(context.Background(), []byte("k"), []byte(fmt.Sprint(i)), fencekv.WriteOptions{})
	}
	db.Close()
	db = openDB(t, dir, clock, small)
	_, err := db.Watch(context.Background(), fencekv.WatchOptions{StartRevision: 25})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeCompacted || fe.Revision != 26 {
		t.Fatalf("after a restart, watch from revision 25 with a window of 10 events: %v; want compacted, oldest 26", err)
	}
	got := watchAll(t, db, 26, "mark")
	if err := fencekvtest.CheckHistory(got, nil, 26); err != nil || len(got) != 10 || string(got[9].Value) != "34" {
		t.Fatalf("after a restart, watch from revision 26: %d events, %v", len(got), err)
	}
	db.Close()

	// A larger window: what the file kept (at least the 10, at most a
	// tenth more), with the floor where the file's trimming left it.
	db = openDB(t, dir, clock, nil)
	_, err = db.Watch(context.Background(), fencekv.WatchOptions{StartRevision: 1})
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeCompacted || fe.Revision < 16 || fe.Revision > 27 {
		t.Fatalf("watch from revision 1: %v; want compacted, oldest 16..27", err)
	}
	floor := fe.Revision
	got = watchAll(t, db, floor, "mark2")
	if err := fencekvtest.CheckHistory(got, nil, floor); err != nil || got[len(got)-1].Revision != 36 {
		t.Fatalf("watch from the oldest kept, %d: %v (%d events)", floor, err, len(got))
	}
	if _, err := db.Watch(context.Background(), fencekv.WatchOptions{StartRevision: floor - 1}); !errors.As(err, &fe) || fe.Code != fencekv.CodeCompacted || fe.Revision != floor {
		t.Fatalf("watch from %d: %v; want compacted, oldest %d", floor-1, err, floor)
	}
}
