package kv

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv/fence"
	bolt "go.etcd.io/bbolt"
)

// openStore opens a store in a fresh temp dir and closes it at cleanup.
func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "kv.db"), Options{NoSync: true})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// update runs fn in a read-write transaction and fails the test if the
// transaction itself (not a refusal inside fn) fails.
func update(t *testing.T, s *Store, fn func(tx *Tx)) {
	t.Helper()
	if err := s.Update(func(tx *Tx) error { fn(tx); return nil }); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

// get reads key in a read-only transaction.
func get(t *testing.T, s *Store, key string) Entry {
	t.Helper()
	var e Entry
	if err := s.View(func(tx *Tx) error { e = tx.Get([]byte(key)); return nil }); err != nil {
		t.Fatalf("View: %v", err)
	}
	return e
}

// wantCode fails unless err is an *fence.Error with code (or nil when code is "").
func wantCode(t *testing.T, err error, code fence.Code) *fence.Error {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Fatalf("err = %v; want nil", err)
		}
		return nil
	}
	var e *fence.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("err = %v; want code %s", err, code)
	}
	return e
}

func wantEntry(t *testing.T, got Entry, found bool, value string, fence Token, rev Revision) {
	t.Helper()
	if got.Found != found || string(got.Value) != value || got.Fence != fence || got.Revision != rev {
		t.Fatalf("entry = {found %v value %q fence %d rev %d}; want {found %v value %q fence %d rev %d}",
			got.Found, got.Value, got.Fence, got.Revision, found, value, fence, rev)
	}
}

func TestPutGet(t *testing.T) {
	s := openStore(t)
	k := []byte("k")
	update(t, s, func(tx *Tx) {
		e, err := tx.Put(k, []byte("v1"), Write{})
		wantCode(t, err, "")
		wantEntry(t, e, true, "v1", 0, 1)
		e, err = tx.Put(k, []byte("v2"), Write{})
		wantCode(t, err, "")
		wantEntry(t, e, true, "v2", 0, 2)
		e, err = tx.Put([]byte("empty"), nil, Write{})
		wantCode(t, err, "")
		wantEntry(t, e, true, "", 0, 3)
	})
	wantEntry(t, get(t, s, "k"), true, "v2", 0, 2)
	if e := get(t, s, "empty"); !e.Found || e.Value == nil || len(e.Value) != 0 {
		t.Fatalf("get empty value = %+v; want found with a non-nil empty value", e)
	}
	wantEntry(t, get(t, s, "missing"), false, "", 0, 0)
	_ = s.View(func(tx *Tx) error {
		if got, want := tx.Revision(), Revision(3); got != want {
			t.Errorf("Revision = %d; want %d", got, want)
		}
		if got, want := tx.Keys(), uint64(2); got != want {
			t.Errorf("Keys = %d; want %d", got, want)
		}
		return nil
	})
}

// TestGetCopiesValue checks that a value read by Get stays valid after the
// transaction that read it ends.
func TestGetCopiesValue(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) { tx.Put([]byte("k"), []byte("value"), Write{}) })
	e := get(t, s, "k")
	update(t, s, func(tx *Tx) { tx.Put([]byte("k"), []byte("other"), Write{}) })
	if string(e.Value) != "value" {
		t.Fatalf("value read earlier = %q; want %q", e.Value, "value")
	}
}

// op is one fenced write, run against a key, for tables that treat all
// four writes alike.
type op struct {
	name string
	run  func(tx *Tx, key []byte, w Write) (Entry, error)
}

var writeOps = []op{
	{"put", func(tx *Tx, key []byte, w Write) (Entry, error) { return tx.Put(key, []byte("1"), w) }},
	{"delete", func(tx *Tx, key []byte, w Write) (Entry, error) {
		_, e, err := tx.Delete(key, w)
		return e, err
	}},
	{"cas", func(tx *Tx, key []byte, w Write) (Entry, error) {
		cur := tx.Get(key)
		return tx.CAS(key, cur.Revision, []byte("1"), w)
	}},
	{"incr", func(tx *Tx, key []byte, w Write) (Entry, error) {
		_, e, err := tx.Incr(key, 1, w)
		return e, err
	}},
}

// TestFenceRule is G2/G3 at the storage layer: a write with token t is
// accepted iff t >= fence (t > fence when strict), and then fence := t.
func TestFenceRule(t *testing.T) {
	tests := []struct {
		fence  Token // the key's fence before the write
		token  Token
		strict bool
		ok     bool
		after  Token // the fence after an accepted write
	}{
		{fence: 0, token: 0, ok: true, after: 0},
		{fence: 0, token: 5, ok: true, after: 5},
		{fence: 5, token: 0, ok: false},
		{fence: 5, token: 4, ok: false},
		{fence: 5, token: 5, ok: true, after: 5},
		{fence: 5, token: 6, ok: true, after: 6},
		{fence: 0, token: 0, strict: true, ok: false}, // strict needs t > 0; the engine refuses it earlier as bad_request
		{fence: 0, token: 1, strict: true, ok: true, after: 1},
		{fence: 5, token: 4, strict: true, ok: false},
		{fence: 5, token: 5, strict: true, ok: false},
		{fence: 5, token: 6, strict: true, ok: true, after: 6},
		{fence: 5, token: math.MaxUint64, ok: true, after: math.MaxUint64},
	}
	for _, o := range writeOps {
		for _, tt := range tests {
			name := fmt.Sprintf("%s/fence=%d/token=%d/strict=%v", o.name, tt.fence, tt.token, tt.strict)
			t.Run(name, func(t *testing.T) {
				s := openStore(t)
				key := []byte("k")
				update(t, s, func(tx *Tx) {
					if _, err := tx.Put(key, []byte("0"), Write{Token: tt.fence}); err != nil {
						t.Fatalf("setup put: %v", err)
					}
				})
				before := get(t, s, "k")
				var revBefore Revision
				_ = s.View(func(tx *Tx) error { revBefore = tx.Revision(); return nil })
				var e Entry
				var err error
				update(t, s, func(tx *Tx) { e, err = o.run(tx, key, Write{Token: tt.token, Strict: tt.strict}) })
				after := get(t, s, "k")
				if !tt.ok {
					fe := wantCode(t, err, fence.CodeStaleToken)
					if fe.Fence != tt.fence {
						t.Errorf("stale_token fence = %d; want %d", fe.Fence, tt.fence)
					}
					if !errors.Is(err, fence.ErrStaleToken) {
						t.Errorf("errors.Is(err, fence.ErrStaleToken) = false for %v", err)
					}
					wantEntry(t, after, before.Found, string(before.Value), before.Fence, before.Revision)
					_ = s.View(func(tx *Tx) error {
						if tx.Revision() != revBefore {
							t.Errorf("store revision = %d after a refusal; want %d", tx.Revision(), revBefore)
						}
						return nil
					})
					return
				}
				wantCode(t, err, "")
				if e.Fence != tt.after || after.Fence != tt.after {
					t.Errorf("fence = %d (result), %d (stored); want %d", e.Fence, after.Fence, tt.after)
				}
				if want := revBefore + 1; e.Revision != want {
					t.Errorf("result revision = %d; want %d", e.Revision, want)
				}
			})
		}
	}
}

func TestDeleteKeepsFence(t *testing.T) {
	s := openStore(t)
	k := []byte("k")
	update(t, s, func(tx *Tx) {
		tx.Put(k, []byte("v"), Write{Token: 7})
		deleted, e, err := tx.Delete(k, Write{Token: 7})
		wantCode(t, err, "")
		if !deleted || e.Fence != 7 || e.Revision != 2 {
			t.Fatalf("delete = %v, %+v; want deleted, fence 7, revision 2", deleted, e)
		}
	})
	wantEntry(t, get(t, s, "k"), false, "", 7, 0)
	update(t, s, func(tx *Tx) {
		_, err := tx.Put(k, []byte("late"), Write{Token: 6})
		if fe := wantCode(t, err, fence.CodeStaleToken); fe.Fence != 7 {
			t.Fatalf("fence in refusal = %d; want 7", fe.Fence)
		}
		_, err = tx.Put(k, []byte("plain"), Write{})
		wantCode(t, err, fence.CodeStaleToken)
		_, _, err = tx.Delete(k, Write{Token: 6})
		wantCode(t, err, fence.CodeStaleToken)
	})
	_ = s.View(func(tx *Tx) error {
		if tx.Keys() != 0 {
			t.Errorf("Keys = %d; want 0", tx.Keys())
		}
		return nil
	})
	update(t, s, func(tx *Tx) {
		e, err := tx.Put(k, []byte("again"), Write{Token: 7})
		wantCode(t, err, "")
		wantEntry(t, e, true, "again", 7, 3)
	})
	_ = s.View(func(tx *Tx) error {
		if tx.Keys() != 1 {
			t.Errorf("Keys = %d after re-put; want 1", tx.Keys())
		}
		return nil
	})
}

func TestDeleteMissing(t *testing.T) {
	t.Run("tokenless advances only the revision", func(t *testing.T) {
		s := openStore(t)
		update(t, s, func(tx *Tx) {
			deleted, e, err := tx.Delete([]byte("nope"), Write{})
			wantCode(t, err, "")
			if deleted || e.Fence != 0 || e.Revision != 1 {
				t.Fatalf("delete = %v, %+v; want not deleted, fence 0, revision 1", deleted, e)
			}
		})
		_ = s.View(func(tx *Tx) error {
			if tx.Revision() != 1 {
				t.Errorf("store revision = %d; want 1", tx.Revision())
			}
			if tx.keysBucket().Get([]byte("nope")) != nil || tx.tombsBucket().Get([]byte("nope")) != nil {
				t.Errorf("a tokenless delete of a missing key left a record")
			}
			return nil
		})
	})
	t.Run("with token raises fence and revision", func(t *testing.T) {
		s := openStore(t)
		update(t, s, func(tx *Tx) {
			deleted, e, err := tx.Delete([]byte("nope"), Write{Token: 9})
			wantCode(t, err, "")
			if deleted || e.Fence != 9 || e.Revision != 1 {
				t.Fatalf("delete = %v, %+v; want not deleted, fence 9, revision 1", deleted, e)
			}
			// Again with the same token: accepted, and still a write.
			deleted, e, err = tx.Delete([]byte("nope"), Write{Token: 9})
			wantCode(t, err, "")
			if deleted || e.Fence != 9 || e.Revision != 2 {
				t.Fatalf("second delete = %v, %+v; want not deleted, fence 9, revision 2", deleted, e)
			}
		})
		wantEntry(t, get(t, s, "nope"), false, "", 9, 0)
		_ = s.View(func(tx *Tx) error {
			if tx.Revision() != 2 || tx.Keys() != 0 {
				t.Errorf("revision, keys = %d, %d; want 2, 0", tx.Revision(), tx.Keys())
			}
			return nil
		})
	})
}

func TestCAS(t *testing.T) {
	s := openStore(t)
	k := []byte("k")
	update(t, s, func(tx *Tx) {
		e, err := tx.CAS(k, 0, []byte("a"), Write{})
		wantCode(t, err, "")
		wantEntry(t, e, true, "a", 0, 1)

		_, err = tx.CAS(k, 0, []byte("b"), Write{})
		if fe := wantCode(t, err, fence.CodeCompareFailed); fe.Revision != 1 {
			t.Errorf("compare_failed revision = %d; want 1", fe.Revision)
		}
		_, err = tx.CAS(k, 5, []byte("b"), Write{})
		if fe := wantCode(t, err, fence.CodeCompareFailed); fe.Revision != 1 {
			t.Errorf("compare_failed revision = %d; want 1", fe.Revision)
		}
		_, err = tx.CAS([]byte("absent"), 1, []byte("b"), Write{})
		if fe := wantCode(t, err, fence.CodeCompareFailed); fe.Revision != 0 {
			t.Errorf("compare_failed revision on absent key = %d; want 0", fe.Revision)
		}

		e, err = tx.CAS(k, 1, []byte("b"), Write{Token: 3})
		wantCode(t, err, "")
		wantEntry(t, e, true, "b", 3, 2)

		// The fence is checked before the revision.
		_, err = tx.CAS(k, 99, []byte("c"), Write{Token: 2})
		wantCode(t, err, fence.CodeStaleToken)
		_, err = tx.CAS(k, 2, []byte("c"), Write{Token: 3, Strict: true})
		wantCode(t, err, fence.CodeStaleToken)

		// A deleted key is absent: only revision 0 matches it.
		if _, _, err := tx.Delete(k, Write{Token: 3}); err != nil {
			t.Fatal(err)
		}
		_, err = tx.CAS(k, 3, []byte("c"), Write{Token: 3})
		if fe := wantCode(t, err, fence.CodeCompareFailed); fe.Revision != 0 {
			t.Errorf("compare_failed revision on deleted key = %d; want 0", fe.Revision)
		}
		e, err = tx.CAS(k, 0, []byte("c"), Write{Token: 3})
		wantCode(t, err, "")
		wantEntry(t, e, true, "c", 3, 4)
	})
	wantEntry(t, get(t, s, "k"), true, "c", 3, 4)
}

func TestIncr(t *testing.T) {
	tests := []struct {
		name    string
		initial *string // nil: key missing
		delta   int64
		want    int64
		code    fence.Code
	}{
		{name: "missing counts as zero", delta: 5, want: 5},
		{name: "negative delta", initial: ptr("10"), delta: -15, want: -5},
		{name: "zero delta", initial: ptr("7"), delta: 0, want: 7},
		{name: "negative value", initial: ptr("-3"), delta: 1, want: -2},
		{name: "max", initial: ptr("9223372036854775806"), delta: 1, want: math.MaxInt64},
		{name: "min", initial: ptr("-9223372036854775807"), delta: -1, want: math.MinInt64},
		{name: "overflow up", initial: ptr("9223372036854775807"), delta: 1, code: fence.CodeNotInteger},
		{name: "overflow down", initial: ptr("-9223372036854775808"), delta: -1, code: fence.CodeNotInteger},
		{name: "overflow by big delta", initial: ptr("1"), delta: math.MaxInt64, code: fence.CodeNotInteger},
		{name: "not a number", initial: ptr("abc"), delta: 1, code: fence.CodeNotInteger},
		{name: "empty value", initial: ptr(""), delta: 1, code: fence.CodeNotInteger},
		{name: "float", initial: ptr("1.5"), delta: 1, code: fence.CodeNotInteger},
		{name: "too big for int64", initial: ptr("9223372036854775808"), delta: 0, code: fence.CodeNotInteger},
		{name: "space", initial: ptr(" 1"), delta: 1, code: fence.CodeNotInteger},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t)
			k := []byte("n")
			if tt.initial != nil {
				update(t, s, func(tx *Tx) { tx.Put(k, []byte(*tt.initial), Write{}) })
			}
			before := get(t, s, "n")
			var n int64
			var e Entry
			var err error
			update(t, s, func(tx *Tx) { n, e, err = tx.Incr(k, tt.delta, Write{}) })
			if tt.code != "" {
				wantCode(t, err, tt.code)
				after := get(t, s, "n")
				wantEntry(t, after, before.Found, string(before.Value), before.Fence, before.Revision)
				return
			}
			wantCode(t, err, "")
			if n != tt.want {
				t.Errorf("incr = %d; want %d", n, tt.want)
			}
			want := fmt.Sprint(tt.want)
			if string(e.Value) != want {
				t.Errorf("result value = %q; want %q", e.Value, want)
			}
			if got := get(t, s, "n"); string(got.Value) != want {
				t.Errorf("stored value = %q; want %q", got.Value, want)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// TestIncrOrder checks that stale_token wins over not_integer.
func TestIncrOrder(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) {
		tx.Put([]byte("n"), []byte("x"), Write{Token: 5})
		_, _, err := tx.Incr([]byte("n"), 1, Write{Token: 4})
		wantCode(t, err, fence.CodeStaleToken)
		_, _, err = tx.Incr([]byte("n"), 1, Write{Token: 5})
		wantCode(t, err, fence.CodeNotInteger)
	})
}

func TestScan(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) {
		for _, k := range []string{"a", "b/1", "b/2", "b/3", "b/4", "c"} {
			tx.Put([]byte(k), []byte("v"+k), Write{})
		}
		tx.Delete([]byte("b/2"), Write{})
		tx.Delete([]byte("b/9"), Write{Token: 1}) // a deleted record that never lived
	})
	keys := func(es []Entry) string {
		var ks []string
		for _, e := range es {
			ks = append(ks, string(e.Key))
		}
		return strings.Join(ks, ",")
	}
	tests := []struct {
		name          string
		prefix, start string
		limit, max    int
		want          string
		more          bool
	}{
		{name: "all", limit: 100, max: 1 << 20, want: "a,b/1,b/3,b/4,c"},
		{name: "prefix", prefix: "b/", limit: 100, max: 1 << 20, want: "b/1,b/3,b/4"},
		{name: "prefix limit", prefix: "b/", limit: 2, max: 1 << 20, want: "b/1,b/3", more: true},
		{name: "limit exactly all", prefix: "b/", limit: 3, max: 1 << 20, want: "b/1,b/3,b/4"},
		{name: "limit skips deleted for more", prefix: "b/", start: "b/1\x00", limit: 1, max: 1 << 20, want: "b/3", more: true},
		{name: "start inclusive", prefix: "b/", start: "b/3", limit: 100, max: 1 << 20, want: "b/3,b/4"},
		{name: "start is a deleted key", prefix: "b/", start: "b/2", limit: 100, max: 1 << 20, want: "b/3,b/4"},
		{name: "start before prefix", prefix: "b/", start: "a", limit: 100, max: 1 << 20, want: "b/1,b/3,b/4"},
		{name: "start after prefix", prefix: "b/", start: "c", limit: 100, max: 1 << 20, want: ""},
		{name: "page by last key plus zero", start: "b/4\x00", limit: 100, max: 1 << 20, want: "c"},
		{name: "no match", prefix: "zz", limit: 100, max: 1 << 20, want: ""},
		{name: "max bytes returns at least one", limit: 100, max: 1, want: "a", more: true},
		{name: "max bytes stops early", prefix: "b/", limit: 100, max: 2 * (3 + recHeader + 4), want: "b/1,b/3", more: true},
		{name: "max bytes on the last item", prefix: "b/", start: "b/4", limit: 100, max: 1, want: "b/4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_ = s.View(func(tx *Tx) error {
				items, more := tx.Scan([]byte(tt.prefix), []byte(tt.start), tt.limit, tt.max)
				if got := keys(items); got != tt.want || more != tt.more {
					t.Errorf("scan = %q, more %v; want %q, more %v", got, more, tt.want, tt.more)
				}
				for _, e := range items {
					if !e.Found || string(e.Value) != "v"+string(e.Key) || e.Revision == 0 {
						t.Errorf("item %q = %+v; want found, value %q, a revision", e.Key, e, "v"+string(e.Key))
					}
				}
				return nil
			})
		})
	}
}

func TestScanFenceAndRevision(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) {
		tx.Put([]byte("x"), []byte("1"), Write{Token: 4})
		tx.Put([]byte("y"), []byte("2"), Write{})
	})
	_ = s.View(func(tx *Tx) error {
		items, _ := tx.Scan(nil, nil, 10, 1<<20)
		if len(items) != 2 {
			t.Fatalf("scan returned %d items; want 2", len(items))
		}
		wantEntry(t, items[0], true, "1", 4, 1)
		wantEntry(t, items[1], true, "2", 0, 2)
		return nil
	})
}

func TestRollbackDiscards(t *testing.T) {
	s := openStore(t)
	tx, err := s.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	tx.Put([]byte("k"), []byte("v"), Write{Token: 3})
	tx.NextToken()
	tx.Rollback()
	wantEntry(t, get(t, s, "k"), false, "", 0, 0)
	_ = s.View(func(tx *Tx) error {
		if tx.Revision() != 0 || tx.LastToken() != 0 || tx.Keys() != 0 {
			t.Errorf("counters after rollback = rev %d, token %d, keys %d; want zeros", tx.Revision(), tx.LastToken(), tx.Keys())
		}
		return nil
	})
	// A failed Update rolls back too.
	boom := errors.New("boom")
	if err := s.Update(func(tx *Tx) error {
		tx.Put([]byte("k"), []byte("v"), Write{})
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("Update = %v; want boom", err)
	}
	wantEntry(t, get(t, s, "k"), false, "", 0, 0)
}

func TestCountersPersist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var tokens []Token
	update(t, s, func(tx *Tx) {
		tokens = append(tokens, tx.NextToken(), tx.NextToken())
		tx.Put([]byte("a"), []byte("1"), Write{Token: tokens[1]})
		tx.Put([]byte("b"), []byte("2"), Write{})
		tx.Delete([]byte("b"), Write{})
	})
	if tokens[0] != 1 || tokens[1] != 2 {
		t.Fatalf("first tokens = %v; want [1 2]", tokens)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v; want nil", err)
	}
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = s.View(func(tx *Tx) error {
		if tx.LastToken() != 2 || tx.Revision() != 3 || tx.Keys() != 1 {
			t.Errorf("after reopen: last token %d, revision %d, keys %d; want 2, 3, 1", tx.LastToken(), tx.Revision(), tx.Keys())
		}
		return nil
	})
	update(t, s, func(tx *Tx) {
		if got := tx.NextToken(); got != 3 {
			t.Errorf("NextToken after reopen = %d; want 3", got)
		}
	})
	wantEntry(t, get(t, s, "a"), true, "1", 2, 1)
	wantEntry(t, get(t, s, "b"), false, "", 0, 0)
}

func TestOpenSchemaMismatch(t *testing.T) {
	tests := []struct {
		name   string
		mangle func(tx *bolt.Tx) error
	}{
		{"newer version", func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaSchema, u64(SchemaVersion+1)) }},
		{"zero version", func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaSchema, u64(0)) }},
		{"short version", func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaSchema, []byte{1}) }},
		{"no version", func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(metaSchema) }},
		{"keys without meta", func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketMeta) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kv.db")
			s, err := Open(path, Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(tt.mangle); err != nil {
				t.Fatal(err)
			}
			db.Close()
			s, err = Open(path, Options{NoSync: true})
			if !errors.Is(err, ErrSchema) {
				if s != nil {
					s.Close()
				}
				t.Fatalf("Open = %v; want ErrSchema", err)
			}
			// The failed Open released the file.
			db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
			if err != nil {
				t.Fatalf("bolt.Open after a failed Open: %v", err)
			}
			db.Close()
		})
	}
}

func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := Open(path, Options{NoSync: true, LockTimeout: 20 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		if s2 != nil {
			s2.Close()
		}
		t.Fatalf("second Open = %v; want ErrLocked", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err = Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatalf("Open after Close = %v; want nil", err)
	}
	s2.Close()
}

func TestLocksBucket(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) {
		for _, n := range []string{"a", "l/1", "l/2", "l/3", "m"} {
			if err := tx.PutLock(n, []byte("rec-"+n)); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.DeleteLock("l/2"); err != nil {
			t.Fatal(err)
		}
	})
	_ = s.View(func(tx *Tx) error {
		if got := tx.Lock("l/1"); string(got) != "rec-l/1" {
			t.Errorf("Lock(l/1) = %q; want %q", got, "rec-l/1")
		}
		if got := tx.Lock("l/2"); got != nil {
			t.Errorf("Lock(l/2) = %q after delete; want nil", got)
		}
		tests := []struct {
			prefix, start string
			stopAfter     int
			want          string
		}{
			{"", "", 100, "a,l/1,l/3,m"},
			{"l/", "", 100, "l/1,l/3"},
			{"l/", "l/2", 100, "l/3"},
			{"l/", "a", 100, "l/1,l/3"},
			{"", "", 2, "a,l/1"},
		}
		for _, tt := range tests {
			var got []string
			tx.Locks([]byte(tt.prefix), []byte(tt.start), func(name, rec []byte) bool {
				if !bytes.Equal(rec, []byte("rec-"+string(name))) {
					t.Errorf("record of %q = %q", name, rec)
				}
				got = append(got, string(name))
				return len(got) < tt.stopAfter
			})
			if g := strings.Join(got, ","); g != tt.want {
				t.Errorf("Locks(%q, %q) = %q; want %q", tt.prefix, tt.start, g, tt.want)
			}
		}
		return nil
	})
}

func TestErrorIs(t *testing.T) {
	err := fmt.Errorf("context: %w", &fence.Error{Code: fence.CodeStaleToken, Fence: 3, Message: "x"})
	if !errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("errors.Is(wrapped stale_token, fence.ErrStaleToken) = false")
	}
	if errors.Is(err, fence.ErrNotHolder) {
		t.Errorf("errors.Is(stale_token, fence.ErrNotHolder) = true")
	}
	if errors.Is(err, errors.New("stale_token")) {
		t.Errorf("errors.Is matched a plain error")
	}
	var e *fence.Error
	if !errors.As(err, &e) || e.Fence != 3 {
		t.Errorf("errors.As lost the fence: %+v", e)
	}
	if got, want := (&fence.Error{Code: fence.CodeBadRequest}).Error(), "bad_request"; got != want {
		t.Errorf("Error() = %q; want %q", got, want)
	}
	if got, want := fence.Errorf(fence.CodeTooLarge, "key is %d bytes", 9).Error(), "too_large: key is 9 bytes"; got != want {
		t.Errorf("Error() = %q; want %q", got, want)
	}
}

func TestNumberStrings(t *testing.T) {
	if got := Token(42).String(); got != "42" {
		t.Errorf("Token(42).String() = %q", got)
	}
	if got := Revision(math.MaxUint64).String(); got != "18446744073709551615" {
		t.Errorf("Revision(max).String() = %q", got)
	}
}
