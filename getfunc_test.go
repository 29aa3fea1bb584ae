package fencekv_test

import (
	"bytes"
	"context"
	"reflect"
	"testing"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

// TestGetFuncAsGet: GetFunc lends the entry Get returns, for keys live,
// empty, deleted and never written, from the log's overlay and, after a
// restart, from the data file; and refuses a bad key as Get does.
func TestGetFuncAsGet(t *testing.T) {
	dir, clock := t.TempDir(), fencekvtest.NewClock()
	db := openDB(t, dir, clock, nil)
	ctx := context.Background()
	mustPut := func(key, value string, token fencekv.Token) {
		t.Helper()
		if _, err := db.Put(ctx, []byte(key), []byte(value), fencekv.WriteOptions{Token: token}); err != nil {
			t.Fatalf("Put %s: %v", key, err)
		}
	}
	mustPut("live", "value", 3)
	mustPut("empty", "", 0)
	mustPut("gone", "x", 7)
	if _, _, err := db.Delete(ctx, []byte("gone"), fencekv.WriteOptions{Token: 7}); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for _, k := range []string{"live", "empty", "gone", "never"} {
			want, err := db.Get(ctx, []byte(k))
			if err != nil {
				t.Fatal(err)
			}
			var got fencekv.Entry
			calls := 0
			if err := db.GetFunc(ctx, []byte(k), func(e fencekv.Entry) {
				calls++
				got = e
				got.Key, got.Value = bytes.Clone(e.Key), bytes.Clone(e.Value) // nil stays nil
			}); err != nil || calls != 1 {
				t.Fatalf("%s: GetFunc(%s): %v, %d calls", when, k, err, calls)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: GetFunc(%s) lent %+v; Get returns %+v", when, k, got, want)
			}
		}
		_, gerr := db.Get(ctx, nil)
		ferr := db.GetFunc(ctx, nil, func(fencekv.Entry) { t.Error("GetFunc called fn for an empty key") })
		if gerr == nil || !reflect.DeepEqual(gerr, ferr) {
			t.Errorf("%s: bad key: GetFunc %v; Get %v", when, ferr, gerr)
		}
	}
	check("from the overlay")
	db = reopen(t, db, dir, clock)
	check("from the data file")
}
