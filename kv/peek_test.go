package kv

import (
	"fmt"
	"reflect"
	"testing"
)

// TestFileLookupsAsGet: a read-only transaction's lookups in the file go
// through its reader's cursors; they find what Bucket.Get finds (a
// writable transaction's lookups) for keys live, deleted, and absent
// before, between and after them, and allocate nothing once the reader's
// cursors exist.
func TestFileLookupsAsGet(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) {
		for i := 10; i < 90; i += 2 {
			if _, err := tx.Put([]byte(fmt.Sprintf("k%03d", i)), []byte(fmt.Sprint("v", i)), Write{Token: Token(i)}); err != nil {
				t.Fatal(err)
			}
		}
		for i := 30; i < 40; i += 2 {
			if _, _, err := tx.Delete([]byte(fmt.Sprintf("k%03d", i)), Write{Token: Token(i)}); err != nil {
				t.Fatal(err)
			}
		}
	})
	var keys [][]byte
	for i := range 100 {
		keys = append(keys, []byte(fmt.Sprintf("k%03d", i)))
	}
	keys = append(keys, []byte("a"), []byte("z"), []byte("k0"), []byte("k0100"))
	want := map[string]Entry{}
	update(t, s, func(tx *Tx) { // a writable Tx: Bucket.Get
		for _, k := range keys {
			want[string(k)] = tx.Get(k)
		}
	})
	for round := range 2 { // the second with the reader's cursors
		if err := s.View(func(tx *Tx) error {
			for i := len(keys) - 1; i >= 0; i-- { // backwards, and repeated: the cursor moves back
				for range 2 {
					if got := tx.Get(keys[i]); !reflect.DeepEqual(got, want[string(keys[i])]) {
						t.Errorf("round %d: Get(%s) = %+v; want %+v", round, keys[i], got, want[string(keys[i])])
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if e := want["k032"]; e.Found || e.Fence != 32 {
		t.Fatalf("a deleted key: %+v; want its fence 32, not found", e)
	}
	k := []byte("k050")
	allocs := testing.AllocsPerRun(100, func() {
		s.View(func(tx *Tx) error {
			if e := tx.Peek(k); !e.Found {
				t.Error("k050 not found")
			}
			return nil
		})
	})
	if allocs != 0 {
		t.Errorf("a read-only lookup in the file allocates %.1f times; want 0", allocs)
	}
}
