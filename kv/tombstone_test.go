package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencekv/fencekv/fence"
	bolt "go.etcd.io/bbolt"
)

// fileRecords lists what the file holds for keys under prefix: the keys
// bucket's keys and the tombstones bucket's, each as key=fence/revision.
func fileRecords(t *testing.T, s *Store, prefix string) (live, dead string) {
	t.Helper()
	_ = s.View(func(tx *Tx) error {
		list := func(b *bolt.Bucket, at int) string {
			var out []string
			c := b.Cursor()
			for k, v := c.Seek([]byte(prefix)); k != nil && bytes.HasPrefix(k, []byte(prefix)); k, v = c.Next() {
				out = append(out, fmt.Sprintf("%s=%d/%d", k, binary.BigEndian.Uint64(v[at:]), binary.BigEndian.Uint64(v[at+8:])))
			}
			return strings.Join(out, " ")
		}
		live, dead = list(tx.keysBucket(), 1), list(tx.tombsBucket(), 0)
		return nil
	})
	return live, dead
}

// TestScanSkipsTombstones: a scan over a range of 100k deleted keys and a
// few live ones reads only the live ones from the file. With deleted keys
// kept in the keys bucket (schema 1) it stepped over all 100k.
func TestScanSkipsTombstones(t *testing.T) {
	s := openStore(t)
	w, err := s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	const n = 100_000
	live := map[int]bool{0: true, 31_337: true, 77_777: true, n - 1: true}
	for i := range n {
		key := fmt.Appendf(nil, "d/%06d", i)
		if _, err := w.Put(key, []byte("v"), Write{Token: w.NextToken()}); err != nil {
			t.Fatal(err)
		}
		if !live[i] {
			if _, _, err := w.Delete(key, Write{Token: w.LastToken()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.Publish()
	if err := s.Checkpoint(Marks{}); err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		items, more := tx.Scan([]byte("d/"), nil, 100, 1<<20)
		var got []string
		for _, e := range items {
			got = append(got, string(e.Key))
		}
		if want := "d/000000 d/031337 d/077777 d/099999"; strings.Join(got, " ") != want || more {
			t.Errorf("scan = %q, more %v; want %q", got, more, want)
		}
		// One seek and one step past each live key: the live keys and
		// the end of the bucket.
		if tx.steps > len(live)+1 {
			t.Errorf("the scan read %d records from the file for %d live keys among %d deleted", tx.steps, len(live), n-len(live))
		}
		if e := tx.Get([]byte("d/050000")); e.Found || e.Fence != 50_001 {
			t.Errorf("get of a deleted key = %+v; want not found, fence 50001", e)
		}
		if tx.Keys() != uint64(len(live)) {
			t.Errorf("Keys = %d; want %d", tx.Keys(), len(live))
		}
		return nil
	})
	// A page from the middle of the deleted range finds the next live key
	// in one step, and says there is more.
	_ = s.View(func(tx *Tx) error {
		items, more := tx.Scan([]byte("d/"), []byte("d/000001"), 1, 1<<20)
		if len(items) != 1 || string(items[0].Key) != "d/031337" || !more || tx.steps > 2 {
			t.Errorf("scan from d/000001 = %d items, more %v, %d steps; want d/031337, more, 2 steps", len(items), more, tx.steps)
		}
		return nil
	})
}

// TestTombstoneFence is G2 through the writer, a checkpoint and a reopen:
// a deleted key's fence lives in the tombstones bucket and refuses stale
// tokens; a put with an accepted token brings the key back into keys.
func TestTombstoneFence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	k := []byte("k")
	refused := func(when string) {
		t.Helper()
		w, err := s.Writer()
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range writeOps {
			_, err := o.run(w, k, Write{Token: 7})
			if fe := wantCode(t, err, fence.CodeStaleToken); fe.Fence != 8 {
				t.Fatalf("%s: %s with token 7: fence in refusal = %d; want 8", when, o.name, fe.Fence)
			}
		}
		_, err = w.Put(k, []byte("x"), Write{Token: 8, Strict: true})
		wantCode(t, err, fence.CodeStaleToken)
		wantEntry(t, get(t, s, "k"), false, "", 8, 0)
	}

	w, err := s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	w.Put(k, []byte("v"), Write{Token: 7})
	if _, _, err := w.Delete(k, Write{Token: 8}); err != nil {
		t.Fatal(err)
	}
	s.Publish()
	refused("published")
	if err := s.Checkpoint(Marks{Applied: 1}); err != nil {
		t.Fatal(err)
	}
	if live, dead := fileRecords(t, s, ""); live != "" || dead != "k=8/2" {
		t.Fatalf("after a checkpoint the file holds live %q, tombstones %q; want none, k=8/2", live, dead)
	}
	refused("checkpointed")
	s.Abort()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path, Options{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	refused("reopened")
	s.Abort()

	w, err = s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	e, err := w.Put(k, []byte("back"), Write{Token: 8})
	wantCode(t, err, "")
	wantEntry(t, e, true, "back", 8, 3)
	s.Publish()
	if err := s.Checkpoint(Marks{Applied: 2}); err != nil {
		t.Fatal(err)
	}
	if live, dead := fileRecords(t, s, ""); live != "k=8/3" || dead != "" {
		t.Fatalf("after a put the file holds live %q, tombstones %q; want k=8/3, none", live, dead)
	}
	_ = s.View(func(tx *Tx) error {
		if tx.Keys() != 1 || tx.Revision() != 3 {
			t.Errorf("keys, revision = %d, %d; want 1, 3", tx.Keys(), tx.Revision())
		}
		return nil
	})
	if rep, err := func() (Report, error) { s.Close(); return Check(path, nil) }(); err != nil || rep.Keys != 1 || rep.Tombstones != 0 || rep.LiveKeys != 1 {
		t.Fatalf("Check = %+v, %v; want one live key, no tombstones", rep, err)
	}
}

// TestOverlayOverFile: a reader merges the overlay's records (live or
// deleted) with the file's two buckets, before and after the checkpoint
// that moves them into the file.
func TestOverlayOverFile(t *testing.T) {
	s := openStore(t)
	w, err := s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c", "e"} {
		w.Put([]byte(k), []byte("file-"+k), Write{Token: 2})
	}
	w.Delete([]byte("b"), Write{Token: 3})
	w.Delete([]byte("d"), Write{Token: 4}) // never lived
	s.Publish()
	if err := s.Checkpoint(Marks{}); err != nil {
		t.Fatal(err)
	}
	if live, dead := fileRecords(t, s, ""); live != "a=2/1 c=2/3 e=2/4" || dead != "b=3/5 d=4/6" {
		t.Fatalf("file: live %q, tombstones %q", live, dead)
	}
	const before = "a=file-a c=file-c e=file-e "
	if got := scanKeys(t, s, ""); got != before {
		t.Fatalf("scan = %q; want %q", got, before)
	}

	w, err = s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	w.Delete([]byte("a"), Write{Token: 5})               // live in the file, deleted in the overlay
	w.Put([]byte("b"), []byte("new-b"), Write{Token: 3}) // deleted in the file, live in the overlay
	w.Put([]byte("bb"), []byte("new-bb"), Write{})       // in neither
	w.Delete([]byte("e"), Write{Token: 2})               // live in the file, deleted ...
	w.Put([]byte("e"), []byte("new-e"), Write{Token: 2}) // ... and back in the same batch
	w.Delete([]byte("f"), Write{Token: 6})               // a new tombstone past the file's keys
	if got := scanKeys(t, s, ""); got != before {
		t.Fatalf("before Publish, scan = %q; want %q", got, before)
	}
	s.Publish()

	check := func(when string) {
		t.Helper()
		const after = "b=new-b bb=new-bb c=file-c e=new-e "
		if got := scanKeys(t, s, ""); got != after {
			t.Fatalf("%s: scan = %q; want %q", when, got, after)
		}
		for _, tt := range []struct {
			prefix, start string
			limit         int
			want          string
			more          bool
		}{
			{"", "", 1, "b", true},
			{"", "a", 2, "b,bb", true},
			{"b", "", 100, "b,bb", false},
			{"", "bb\x00", 1, "c", true},
			{"", "c\x00", 100, "e", false},
			{"a", "", 100, "", false},
			{"", "e\x00", 100, "", false},
		} {
			_ = s.View(func(tx *Tx) error {
				items, more := tx.Scan([]byte(tt.prefix), []byte(tt.start), tt.limit, 1<<20)
				var ks []string
				for _, e := range items {
					ks = append(ks, string(e.Key))
				}
				if got := strings.Join(ks, ","); got != tt.want || more != tt.more {
					t.Errorf("%s: Scan(%q, %q, %d) = %q, more %v; want %q, more %v", when, tt.prefix, tt.start, tt.limit, got, more, tt.want, tt.more)
				}
				return nil
			})
		}
		wantEntry(t, get(t, s, "a"), false, "", 5, 0)
		wantEntry(t, get(t, s, "b"), true, "new-b", 3, 8)
		wantEntry(t, get(t, s, "bb"), true, "new-bb", 0, 9)
		wantEntry(t, get(t, s, "d"), false, "", 4, 0)
		wantEntry(t, get(t, s, "e"), true, "new-e", 2, 11)
		wantEntry(t, get(t, s, "f"), false, "", 6, 0)
		_ = s.View(func(tx *Tx) error {
			if tx.Keys() != 4 || tx.Revision() != 12 {
				t.Errorf("%s: keys, revision = %d, %d; want 4, 12", when, tx.Keys(), tx.Revision())
			}
			return nil
		})
	}
	check("published")
	if err := s.Checkpoint(Marks{}); err != nil {
		t.Fatal(err)
	}
	check("checkpointed")
	if live, dead := fileRecords(t, s, ""); live != "b=3/8 bb=0/9 c=2/3 e=2/11" || dead != "a=5/7 d=4/6 f=6/12" {
		t.Fatalf("file: live %q, tombstones %q", live, dead)
	}
}

// writeSchema1 writes a data file in schema 1's layout, as that version
// of this package wrote it: deleted keys in keys with the live flag
// cleared, no tombstones bucket.
func writeSchema1(t *testing.T, path string, fn func(keys *bolt.Bucket)) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		for k, v := range map[string]uint64{"schema": 1, "revision": 10_010, "last_token": 10_009, "live_keys": 2, "wal_applied": 77, "term": 3} {
			if err := meta.Put([]byte(k), u64(v)); err != nil {
				return err
			}
		}
		keys, err := tx.CreateBucket(bucketKeys)
		if err != nil {
			return err
		}
		locks, err := tx.CreateBucket(bucketLocks)
		if err != nil {
			return err
		}
		if err := locks.Put([]byte("L"), []byte("lease")); err != nil {
			return err
		}
		fn(keys)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// v1rec is a schema 1 key record.
func v1rec(live bool, fnc Token, rev Revision, value string) []byte {
	rec := make([]byte, recHeader, recHeader+len(value))
	if live {
		rec[0] = flagLive
	}
	binary.BigEndian.PutUint64(rec[1:], uint64(fnc))
	binary.BigEndian.PutUint64(rec[9:], uint64(rev))
	return append(rec, value...)
}

// TestUpgradeSchema1: Open moves a schema 1 file's deleted keys into
// tombstones in one transaction, keeps the counters and marks, and says
// how many it moved; the fences still hold; Check reads both layouts.
func TestUpgradeSchema1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	const deleted = 10_000 // more than one of the upgrade's chunks
	writeSchema1(t, path, func(keys *bolt.Bucket) {
		put := func(k string, rec []byte) {
			if err := keys.Put([]byte(k), rec); err != nil {
				t.Fatal(err)
			}
		}
		put("a", v1rec(true, 5, 4, "va"))
		put("b", v1rec(false, 9, 10, ""))
		put("c", v1rec(true, 0, 2, "vc"))
		put("d", v1rec(false, 0, 6, ""))
		for i := range deleted {
			put(fmt.Sprintf("z/%05d", i), v1rec(false, Token(i+10), Revision(i+11), ""))
		}
	})
	rep, err := Check(path, nil)
	if err != nil {
		t.Fatalf("Check of a schema 1 file: %v", err)
	}
	if rep.Schema != 1 || rep.Keys != deleted+4 || rep.Tombstones != deleted+2 || rep.LiveKeys != 2 || rep.Revision != 10_010 {
		t.Fatalf("Check of a schema 1 file = %+v", rep)
	}

	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Upgrade(), (Upgrade{From: 1, To: SchemaVersion, Tombstones: deleted + 2}); got != want {
		t.Errorf("Upgrade = %+v; want %+v", got, want)
	}
	verify := func(when string) {
		t.Helper()
		if live, dead := fileRecords(t, s, ""); live != "a=5/4 c=0/2" || !strings.HasPrefix(dead, "b=9/10 d=0/6 z/00000=10/11 z/00001=11/12 ") || strings.Count(dead, "=") != deleted+2 {
			t.Fatalf("%s: file holds live %q, tombstones %.80q...", when, live, dead)
		}
		wantEntry(t, get(t, s, "a"), true, "va", 5, 4)
		wantEntry(t, get(t, s, "b"), false, "", 9, 0)
		wantEntry(t, get(t, s, "z/09999"), false, "", 10_009, 0)
		if got := scanKeys(t, s, ""); got != "a=va c=vc " {
			t.Fatalf("%s: scan = %q", when, got)
		}
		_ = s.View(func(tx *Tx) error {
			if tx.Keys() != 2 || tx.Revision() != 10_010 || tx.LastToken() != 10_009 {
				t.Errorf("%s: keys, revision, last token = %d, %d, %d", when, tx.Keys(), tx.Revision(), tx.LastToken())
			}
			if got := tx.Lock("L"); string(got) != "lease" {
				t.Errorf("%s: lock L = %q", when, got)
			}
			return nil
		})
		if m, err := s.Marks(); err != nil || m != (Marks{Applied: 77, Term: 3}) {
			t.Errorf("%s: marks = %+v, %v", when, m, err)
		}
	}
	verify("upgraded")
	w, err := s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Put([]byte("b"), []byte("late"), Write{Token: 8})
	wantCode(t, err, fence.CodeStaleToken)
	s.Abort()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	if s, err = Open(path, Options{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	if got := s.Upgrade(); got != (Upgrade{}) {
		t.Errorf("Upgrade on the second Open = %+v; want none", got)
	}
	verify("reopened")
	s.Close()
	rep, err = Check(path, nil)
	if err != nil || rep.Schema != SchemaVersion || rep.Keys != deleted+4 || rep.Tombstones != deleted+2 || rep.LiveKeys != 2 {
		t.Fatalf("Check after the upgrade = %+v, %v", rep, err)
	}
}

// TestUpgradeRefused: a schema 1 file that already has a tombstones
// bucket is not upgraded, and Open leaves it as it was.
func TestUpgradeRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	writeSchema1(t, path, func(keys *bolt.Bucket) {
		keys.Put([]byte("b"), v1rec(false, 9, 10, ""))
		keys.Tx().CreateBucket(bucketTombs)
	})
	if s, err := Open(path, Options{NoSync: true}); err == nil || !strings.Contains(err.Error(), "tombstones") {
		if err == nil {
			s.Close()
		}
		t.Fatalf("Open = %v; want an error about the tombstones bucket", err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(metaSchema); getU64(v) != 1 || tx.Bucket(bucketKeys).Get([]byte("b")) == nil {
			t.Errorf("the refused file changed: schema %x", v)
		}
		return nil
	})
}
