package fencekv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

func openTest(t *testing.T, clock fencekv.Clock) *fencekv.DB {
	t.Helper()
	o := fencekv.DefaultOptions()
	o.Clock = clock
	db, err := fencekv.Open(t.TempDir(), &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestSeedScenario is the story the guarantees start from: A gets 33 and
// pauses past its lease; B gets 34 and writes; A's write with 33 is
// refused.
func TestSeedScenario(t *testing.T) {
	ctx := context.Background()
	clock := fencekvtest.NewClock()
	db := openTest(t, clock)
	for i := 0; i < 32; i++ {
		l, err := db.Acquire(ctx, "warmup", time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Release(ctx, "warmup", l.Token); err != nil {
			t.Fatal(err)
		}
	}
	a, err := db.Acquire(ctx, "inventory", time.Second, nil)
	if err != nil || a.Token != 33 {
		t.Fatalf("A acquire = %v, %v; want token 33", a.Token, err)
	}
	clock.Advance(2 * time.Second) // A is paused past its TTL
	b, err := db.Acquire(ctx, "inventory", time.Second, nil)
	if err != nil || b.Token != 34 {
		t.Fatalf("B acquire = %v, %v; want token 34", b.Token, err)
	}
	key := []byte("inventory/sku-1")
	if _, err := db.Put(ctx, key, []byte("B"), fencekv.WriteOptions{Token: b.Token}); err != nil {
		t.Fatalf("B put: %v", err)
	}
	_, err = db.Put(ctx, key, []byte("A"), fencekv.WriteOptions{Token: a.Token})
	var fe *fencekv.Error
	if !errors.Is(err, fencekv.ErrStaleToken) || !errors.As(err, &fe) || fe.Fence != 34 {
		t.Fatalf("A put = %v; want stale_token with fence 34", err)
	}
	e, err := db.Get(ctx, key)
	if err != nil || string(e.Value) != "B" || e.Fence != 34 {
		t.Fatalf("get = %+v, %v; want B's value with fence 34", e, err)
	}
}
