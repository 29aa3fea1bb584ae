package fencekv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv/state"
)

// G6 from the inside: a batch is visible to readers, and answered, only
// once its log record is synced. The hook holds the leader between the
// append and the sync; readers meanwhile must see the state before the
// batch, and must not wait for it.

func TestG6InvisibleUntilSynced(t *testing.T) {
	// A write whose caller waits (Put), and one started without waiting
	// (Start, StartLed: the wire event loop's): none is answered before
	// the sync.
	t.Run("Put", func(t *testing.T) {
		testG6InvisibleUntilSynced(t, func(db *DB, ctx context.Context, key, value []byte, w WriteOptions) (WriteResult, error) {
			return db.Put(ctx, key, value, w)
		})
	})
	t.Run("Start", func(t *testing.T) {
		testG6InvisibleUntilSynced(t, func(db *DB, ctx context.Context, key, value []byte, w WriteOptions) (WriteResult, error) {
			res := make(chan state.Result, 1)
			db.Start(ctx, state.Command{Op: state.OpPut, Key: key, Value: value}, w, func(r state.Result) { res <- r })
			return written(<-res)
		})
	})
	t.Run("StartLed", func(t *testing.T) {
		// The event loop's way when a round served only writes: the
		// caller leads the batch itself.
		testG6InvisibleUntilSynced(t, func(db *DB, ctx context.Context, key, value []byte, w WriteOptions) (WriteResult, error) {
			res := make(chan state.Result, 1)
			if db.StartLed(ctx, state.Command{Op: state.OpPut, Key: key, Value: value}, w, func(r state.Result) { res <- r }) {
				db.Lead()
			}
			return written(<-res)
		})
	})
}

func testG6InvisibleUntilSynced(t *testing.T, put func(db *DB, ctx context.Context, key, value []byte, w WriteOptions) (WriteResult, error)) {
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	key := []byte("k")
	if _, err := db.Put(ctx, key, []byte("v1"), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	before, err := db.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}

	entered := make(chan struct{})
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	defer unblock() // before Close, which waits for the leader
	db.beforeSync = func() error {
		db.beforeSync = nil // only this batch (the leader owns the field)
		close(entered)
		<-release
		return nil
	}
	type outcome struct {
		put   WriteResult
		grant Lease
		err   error
	}
	done := make(chan outcome, 1)
	go func() {
		// One batch: a put and a grant, submitted together.
		var o outcome
		o.put, o.err = put(db, ctx, key, []byte("v2"), WriteOptions{Token: 7})
		done <- o
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the batch never reached the log")
	}

	// The batch is applied and appended, not synced: readers see the
	// state before it, without waiting for the writer.
	reads := make(chan error, 1)
	go func() { reads <- readsBefore(db, key, before.Revision) }()
	select {
	case err := <-reads:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reads waited for an unsynced batch")
	}
	select {
	case o := <-done:
		t.Fatalf("put answered before its log record was synced: %+v", o)
	default:
	}

	unblock()
	o := <-done
	if o.err != nil || o.put.Fence != 7 {
		t.Fatalf("put = %+v; want accepted with fence 7", o)
	}
	if e, err := db.Get(ctx, key); err != nil || string(e.Value) != "v2" || e.Fence != 7 {
		t.Fatalf("get after the sync = %q fence %d, %v; want v2, fence 7", e.Value, e.Fence, err)
	}
}

// readsBefore checks that reads show key at v1 and the store at revision.
func readsBefore(db *DB, key []byte, revision Revision) error {
	ctx := context.Background()
	e, err := db.Get(ctx, key)
	if err != nil || string(e.Value) != "v1" || e.Fence != 0 {
		return fmt.Errorf("get while the batch is unsynced = %q fence %d, %v; want v1, fence 0", e.Value, e.Fence, err)
	}
	items, _, err := db.Scan(ctx, ScanOptions{Prefix: key})
	if err != nil || len(items) != 1 || !bytes.Equal(items[0].Value, []byte("v1")) {
		return fmt.Errorf("scan while the batch is unsynced = %+v, %v", items, err)
	}
	st, err := db.Status(ctx)
	if err != nil || st.Revision != revision {
		return fmt.Errorf("revision %d while the batch is unsynced; want %d", st.Revision, revision)
	}
	return nil
}

// A failed sync answers the batch unavailable, shows readers nothing of
// it, refuses later writes, and loses nothing acknowledged before it. The
// failed batch itself has an unknown outcome, like a request that timed
// out: its record may have reached the disk, so after a restart it is
// either wholly there or wholly absent.
func TestG6FailedSync(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := db.Acquire(ctx, "L", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Put(ctx, []byte("k"), []byte("v1"), WriteOptions{Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	db.beforeSync = func() error { return errors.New("injected: disk gone") }
	_, err = db.Put(ctx, []byte("k"), []byte("v2"), WriteOptions{Token: l.Token})
	var fe *Error
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &fe) || fe.Outcome != OutcomeUnknown {
		t.Fatalf("put whose sync failed = %v; want unavailable with an unknown outcome (its record was written: a restart may replay it)", err)
	}
	if e, err := db.Get(ctx, []byte("k")); err != nil || string(e.Value) != "v1" {
		t.Fatalf("get after the failed sync = %q, %v; want v1", e.Value, err)
	}
	if _, err := db.Acquire(ctx, "M", time.Minute, nil); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire after a failed sync = %v; want unavailable", err)
	}
	db.Close()

	db, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	e, err := db.Get(ctx, []byte("k"))
	if err != nil || (string(e.Value) != "v1" && string(e.Value) != "v2") || e.Fence != l.Token {
		t.Fatalf("after restart: %q fence %d, %v; want v1 or v2, fenced at %d", e.Value, e.Fence, err, l.Token)
	}
	st, err := db.Status(ctx)
	if want := map[string]Revision{"v1": 1, "v2": 2}[string(e.Value)]; err != nil || st.Revision != want {
		t.Fatalf("after restart: revision %d with value %q; want %d (all of the batch or none)", st.Revision, e.Value, want)
	}
	in, err := db.LockInfo(ctx, "L")
	if err != nil || !in.Held || in.Token != l.Token {
		t.Fatalf("after restart the lock is %+v, %v; want held by %d", in, err, l.Token)
	}
}

// A contended lock's chain of grants is the store's slowest path: each
// grant waits for the holder's put and its release to be synced. An
// acquire that only queues behind a held lock changes nothing, and must
// not cost a log sync of its own in that chain (it used to: the expiry
// checked before it was logged even when nothing was due).
func TestQueuedAcquireLogsNothing(t *testing.T) {
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	l, err := db.Acquire(ctx, "L", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 2)
	queue := func() {
		go func() {
			_, err := db.Acquire(ctx, "L", time.Minute, &AcquireOptions{Wait: time.Minute})
			granted <- err
		}()
	}
	waitFor := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for db.queues.Waiting("L") != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d waiters; want %d", db.queues.Waiting("L"), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	queue()
	waitFor(1)
	before, err := db.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	queue() // finds a waiter ahead of it: the expiry is checked first
	waitFor(2)
	after, err := db.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Commits != before.Commits {
		t.Fatalf("queueing an acquire cost %d log syncs; want none", after.Commits-before.Commits)
	}
	if err := db.Release(ctx, "L", l.Token); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("the first waiter: %v", err)
	}
}

// TestG6SyncsEachBatch: every acknowledged write's log record was synced
// before the answer: after each put (one at a time, a batch each), the log
// is synced to its end (wal.Log.Synced, set by the fdatasync that
// returned). With NoSync nothing is. A kill -9 keeps the page cache, so
// the crash tests cannot tell a synced log from one never synced; this
// test fails with the sync left out.
func TestG6SyncsEachBatch(t *testing.T) {
	for _, noSync := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoSync=%v", noSync), func(t *testing.T) {
			o := DefaultOptions()
			o.NoSync = noSync
			o.CheckpointEvery = time.Hour // no checkpoint empties the log meanwhile
			db, err := Open(t.TempDir(), &o)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			ctx := context.Background()
			for i := range 20 {
				if _, err := db.Put(ctx, []byte(fmt.Sprint("k", i)), []byte("v"), WriteOptions{}); err != nil {
					t.Fatal(err)
				}
				// The log is the leader's: look in its turn.
				if err := db.inTurn(ctx, func() error {
					size, synced := db.wal.Size(), db.wal.Synced()
					switch {
					case !noSync && synced < size:
						return fmt.Errorf("put %d answered with its log synced to %d of %d bytes", i, synced, size)
					case noSync && synced != 0:
						return fmt.Errorf("log synced to %d bytes with NoSync", synced)
					case size == 0:
						return fmt.Errorf("put %d left the log empty", i)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
