package fencekv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
)

// TestSemaphoreDB: a limit of 2 grants two permits; two waiters queue FIFO
// and each release hands its permit to the next in line; a held write is
// accepted with a live permit's token and refused after its release; limit
// mismatch and limit over MaxPermits are typed refusals.
func TestSemaphoreDB(t *testing.T) {
	db := openTest(t, nil)
	ctx := context.Background()
	o := &fencekv.AcquireOptions{Limit: 2}
	a, err := db.Acquire(ctx, "S", 10*time.Second, o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := db.Acquire(ctx, "S", 10*time.Second, o)
	if err != nil || b.Token <= a.Token {
		t.Fatalf("second permit %v, %v", b, err)
	}
	if _, err := db.Acquire(ctx, "S", 10*time.Second, o); !errors.Is(err, fencekv.ErrLockHeld) {
		t.Fatalf("third permit: %v; want lock_held", err)
	}
	if _, err := db.Acquire(ctx, "S", 10*time.Second, nil); !errors.Is(err, fencekv.ErrLimitMismatch) {
		t.Fatalf("plain acquire of a semaphore: %v; want limit_mismatch", err)
	}
	if _, err := db.Acquire(ctx, "S", 10*time.Second, &fencekv.AcquireOptions{Limit: fencekv.MaxPermits + 1}); !errors.Is(err, fencekv.ErrBadRequest) {
		t.Fatalf("limit over max: %v; want bad_request", err)
	}
	got := make(chan fencekv.Lease, 2)
	for i, h := range []string{"w1", "w2"} {
		go func() {
			l, err := db.Acquire(ctx, "S", 10*time.Second, &fencekv.AcquireOptions{Limit: 2, Wait: 10 * time.Second, Holder: h})
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		deadline := time.Now().Add(5 * time.Second)
		for {
			in, _ := db.LockInfo(ctx, "S")
			if in.Waiters == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("waiter not queued")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if _, err := db.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{Token: a.Token, Lock: "S"}); err != nil {
		t.Fatalf("held write with a permit: %v", err)
	}
	if err := db.Release(ctx, "S", a.Token); err != nil {
		t.Fatal(err)
	}
	first := <-got
	if err := db.Release(ctx, "S", b.Token); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if first.Token >= second.Token || first.Token <= b.Token {
		t.Fatalf("hand-off tokens %d, %d after %d", first.Token, second.Token, b.Token)
	}
	in, err := db.LockInfo(ctx, "S")
	if err != nil || in.Limit() != 2 || len(in.Holders()) != 2 || in.Holders()[0].Holder != "w1" {
		t.Fatalf("lock info %+v %+v, %v", in, in.Sem, err)
	}
	if _, err := db.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{Token: a.Token, Lock: "S"}); !errors.Is(err, fencekv.ErrNotHolder) {
		t.Fatalf("held write after release: %v; want not_holder", err)
	}
}

// BenchmarkSemaphoreAcquireRelease is BenchmarkAcquireRelease for a permit
// of a semaphore of limit 3 (each caller its own).
func BenchmarkSemaphoreAcquireRelease(b *testing.B) {
	for _, callers := range benchCallers {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			db := benchOpen(b)
			ctx := context.Background()
			o := &fencekv.AcquireOptions{Limit: 3}
			names := make([]string, callers)
			for c := range callers {
				names[c] = fmt.Sprintf("bench/sem%d", c)
			}
			benchRun(b, db, callers, func(c int) error {
				l, err := db.Acquire(ctx, names[c], time.Minute, o)
				if err != nil {
					return err
				}
				return db.Release(ctx, names[c], l.Token)
			})
		})
	}
}
