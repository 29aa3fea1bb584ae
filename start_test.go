package fencekv_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/lease"
	"github.com/fencekv/fencekv/state"
)

// start runs db.Start and waits for its result.
func start(db *fencekv.DB, ctx context.Context, c state.Command, w fencekv.WriteOptions) state.Result {
	ch := make(chan state.Result, 2)
	db.Start(ctx, c, w, func(r state.Result) { ch <- r })
	r := <-ch
	select {
	case r2 := <-ch:
		panic(fmt.Sprintf("then called twice: %+v, %+v", r, r2))
	case <-time.After(10 * time.Millisecond):
	}
	return r
}

// TestStart: a write started without waiting has the waiting method's
// effect and result, its refusals too (and in the refusal log), and is
// durable when its result comes.
func TestStart(t *testing.T) {
	dir := t.TempDir()
	clock := fencekvtest.NewClock()
	db := openDB(t, dir, clock, nil)
	ctx := fencekv.WithClient(context.Background(), "10.0.0.9:1")

	r := start(db, ctx, state.Command{Op: state.OpAcquire, Lease: lease.Request{Name: "L", TTL: time.Minute, Holder: "A"}}, fencekv.WriteOptions{})
	if r.Err != nil || r.Grant.Token == 0 {
		t.Fatalf("acquire: %+v", r)
	}
	tok := r.Grant.Token
	if r := start(db, ctx, state.Command{Op: state.OpAcquire, Lease: lease.Request{Name: "L", TTL: time.Minute}}, fencekv.WriteOptions{}); !errors.Is(r.Err, fencekv.ErrLockHeld) {
		t.Fatalf("second acquire: %+v; want lock_held", r)
	}
	r = start(db, ctx, state.Command{Op: fencekv.OpPut, Key: []byte("k"), Value: []byte("v1")}, fencekv.WriteOptions{Token: tok, Lock: "L"})
	if r.Err != nil || r.Entry.Fence != tok || r.Entry.Revision == 0 {
		t.Fatalf("held put: %+v", r)
	}
	if r := start(db, ctx, state.Command{Op: fencekv.OpPut, Key: []byte("k"), Value: []byte("stale")}, fencekv.WriteOptions{Token: tok - 1}); !errors.Is(r.Err, fencekv.ErrStaleToken) {
		t.Fatalf("stale put: %+v; want stale_token", r)
	}
	if rs, _, _ := db.Refusals(ctx, 0, 0); len(rs) != 1 || rs[0].Client != "10.0.0.9:1" {
		t.Fatalf("refusal log %+v; want the stale put, from the client", rs)
	}
	if r := start(db, ctx, state.Command{Op: fencekv.OpIncr, Key: []byte("n"), Delta: 5}, fencekv.WriteOptions{}); r.Err != nil || r.Int != 5 {
		t.Fatalf("incr: %+v", r)
	}
	e, _ := db.Get(ctx, []byte("k"))
	if r := start(db, ctx, state.Command{Op: state.OpCAS, Key: []byte("k"), Revision: e.Revision, Value: []byte("v2")}, fencekv.WriteOptions{Token: tok}); r.Err != nil {
		t.Fatalf("cas: %+v", r)
	}
	if r := start(db, ctx, state.Command{Op: state.OpRenew, Lease: lease.Request{Name: "L"}, Token: tok}, fencekv.WriteOptions{}); r.Err != nil || r.TTL != time.Minute {
		t.Fatalf("renew: %+v", r)
	}
	if r := start(db, ctx, state.Command{Op: fencekv.OpDelete, Key: []byte("n")}, fencekv.WriteOptions{}); r.Err != nil || !r.Deleted {
		t.Fatalf("delete: %+v", r)
	}
	if r := start(db, ctx, state.Command{Op: state.OpRelease, Lease: lease.Request{Name: "L"}, Token: tok}, fencekv.WriteOptions{}); r.Err != nil {
		t.Fatalf("release: %+v", r)
	}
	// Bad input is refused at once, on the caller's goroutine.
	called := false
	db.Start(ctx, state.Command{Op: fencekv.OpPut, Key: nil, Value: []byte("v")}, fencekv.WriteOptions{}, func(r state.Result) {
		called = true
		if !errors.Is(r.Err, fencekv.ErrBadRequest) {
			t.Errorf("empty key: %+v; want bad_request", r)
		}
	})
	if !called {
		t.Fatal("then not called at once for an empty key")
	}
	if r := start(db, ctx, state.Command{Op: state.OpExpire}, fencekv.WriteOptions{}); !errors.Is(r.Err, fencekv.ErrBadRequest) {
		t.Fatalf("expire: %+v; want bad_request", r)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if r := start(db, ctx, state.Command{Op: fencekv.OpPut, Key: []byte("k"), Value: []byte("v")}, fencekv.WriteOptions{}); !errors.Is(r.Err, fencekv.ErrUnavailable) {
		t.Fatalf("put after Close: %+v; want unavailable", r)
	}
	// Everything answered was durable.
	db = openDB(t, dir, clock, nil)
	defer db.Close()
	if e, _ := db.Get(ctx, []byte("k")); string(e.Value) != "v2" || e.Fence != tok {
		t.Fatalf("after reopen: %+v", e)
	}
	if e, _ := db.Get(ctx, []byte("n")); e.Found {
		t.Fatalf("deleted key after reopen: %+v", e)
	}
}

// TestStartMixedWithWaiting: started and waiting writes from many
// goroutines share batches; each is answered exactly once, with its own
// result, and Close answers what is queued.
func TestStartMixedWithWaiting(t *testing.T) {
	db, _ := newDB(t)
	ctx := context.Background()
	const workers, each = 8, 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]int{}
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("w%d/%d", w, i)
				if (w+i)%2 == 0 {
					if _, _, err := db.Incr(ctx, []byte("count"), 1, fencekv.WriteOptions{}); err != nil {
						t.Error(err)
					}
					mu.Lock()
					seen[key]++
					mu.Unlock()
					continue
				}
				done := make(chan struct{})
				db.Start(ctx, state.Command{Op: fencekv.OpIncr, Key: []byte("count"), Delta: 1}, fencekv.WriteOptions{}, func(r state.Result) {
					if r.Err != nil {
						t.Error(r.Err)
					}
					mu.Lock()
					seen[key]++
					mu.Unlock()
					close(done)
				})
				<-done
			}
		})
	}
	wg.Wait()
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("%s answered %d times", k, n)
		}
	}
	if len(seen) != workers*each {
		t.Fatalf("%d answered; want %d", len(seen), workers*each)
	}
	e, _ := db.Get(ctx, []byte("count"))
	if string(e.Value) != fmt.Sprint(workers*each) {
		t.Fatalf("count = %s; want %d", e.Value, workers*each)
	}
	// Started writes queued when Close comes are applied and answered.
	var answered sync.WaitGroup
	for range 100 {
		answered.Add(1)
		db.Start(ctx, state.Command{Op: fencekv.OpIncr, Key: []byte("late"), Delta: 1}, fencekv.WriteOptions{}, func(state.Result) { answered.Done() })
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	answered.Wait()
}

// TestCloseAwaitsCallbacks: Close returns only once every started
// write's callback has returned, the last batch's too (its leader answers
// them after it gave up the lead, which is what Close waited for). It
// used to return while the last leader still ran them.
func TestCloseAwaitsCallbacks(t *testing.T) {
	db := openTest(t, nil)
	ctx := context.Background()
	inside, release := make(chan struct{}), make(chan struct{})
	var returned atomic.Bool
	db.Start(ctx, state.Command{Op: fencekv.OpPut, Key: []byte("k"), Value: []byte("v")}, fencekv.WriteOptions{}, func(r state.Result) {
		if r.Err != nil {
			t.Errorf("put: %v", r.Err)
		}
		close(inside)
		<-release
		returned.Store(true)
	})
	<-inside
	closed := make(chan error, 1)
	go func() {
		err := db.Close()
		if !returned.Load() {
			err = errors.Join(err, errors.New("Close returned while a callback still ran"))
		}
		closed <- err
	}()
	// A window for Close to return too early: it must not.
	select {
	case err := <-closed:
		t.Fatalf("Close returned with the callback blocked: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
