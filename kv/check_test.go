package kv

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// fullStore writes a data file with n keys (every tenth deleted), a few
// locks, and a checkpoint recording applied 42, and returns its path.
func fullStore(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kv.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	val := bytes.Repeat([]byte("v"), 100)
	for i := range n {
		key := fmt.Appendf(nil, "key/%06d", i)
		if _, err := tx.Put(key, val, Write{Token: tx.NextToken()}); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			if _, _, err := tx.Delete(key, Write{Token: tx.LastToken()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 3 {
		if err := tx.PutLock(fmt.Sprintf("lock/%d", i), []byte("lease record")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Checkpoint(Marks{Applied: 42}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// copyFile copies the file at src into a new temp dir, applies damage to
// its bytes, and returns the copy's path.
func copyFile(t *testing.T, src string, damage func([]byte)) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	damage(data)
	path := filepath.Join(t.TempDir(), "kv.db")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func wantDamaged(t *testing.T, what string, err error) {
	t.Helper()
	var de *DamagedError
	if !errors.As(err, &de) || !errors.Is(err, ErrDamaged) || len(de.Problems) == 0 {
		t.Fatalf("%s: err = %v; want a *DamagedError", what, err)
	}
	if msg := err.Error(); !strings.Contains(msg, de.Path) || !strings.Contains(msg, "restore it from a backup") {
		t.Fatalf("%s: message %q does not name the file and what to do", what, msg)
	}
}

func TestCheckSound(t *testing.T) {
	path := fullStore(t, 3000)
	rep, err := Check(path, nil)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	want := Report{Schema: SchemaVersion, Applied: 42, Revision: 3300, LastToken: 3000, LiveKeys: 2700, Keys: 3000, Tombstones: 300, Locks: 3, Pages: rep.Pages, PageSize: rep.PageSize}
	if rep != want || rep.Pages < 10 || rep.PageSize <= 0 {
		t.Fatalf("Check = %+v; want %+v", rep, want)
	}
	// then runs while Check holds the file: no writer can open it.
	stop := errors.New("stop")
	_, err = Check(path, func(r Report) error {
		if r != rep {
			t.Errorf("then got %+v; want %+v", r, rep)
		}
		if s, err := Open(path, Options{NoSync: true, LockTimeout: 10 * time.Millisecond}); !errors.Is(err, ErrLocked) {
			if err == nil {
				s.Close()
			}
			t.Errorf("Open during then = %v; want ErrLocked", err)
		}
		return stop
	})
	if err != stop {
		t.Fatalf("Check = %v; want then's error", err)
	}
	// It changed nothing: the file opens and reads as before.
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := get(t, s, "key/000001"); !got.Found || got.Fence != 2 {
		t.Fatalf("key/000001 = %+v after Check", got)
	}

	// A fresh file is sound too.
	fresh := filepath.Join(t.TempDir(), "kv.db")
	s2, err := Open(fresh, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if rep, err := Check(fresh, nil); err != nil || rep.Applied != 0 || rep.Keys != 0 {
		t.Fatalf("Check of a fresh file = %+v, %v", rep, err)
	}
}

func TestCheckInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := Check(path, nil); !errors.Is(err, ErrLocked) {
		t.Fatalf("Check of a file in use = %v; want ErrLocked", err)
	}
}

func TestCheckMissing(t *testing.T) {
	if _, err := Check(filepath.Join(t.TempDir(), "none.db"), nil); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Check of a missing file = %v; want ErrNotExist", err)
	}
}

// usedLeaf returns a leaf page in use in the second half of the file.
func usedLeaf(t *testing.T, path string) int {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin(false)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	n := int(tx.Size()) / db.Info().PageSize
	for id := n / 2; id < n; id++ {
		if info, err := tx.Page(id); err == nil && info != nil && info.Type == "leaf" {
			return id
		}
	}
	t.Fatal("no leaf page in use in the second half of the file")
	return 0
}

// TestDamagedPage writes garbage over a leaf page in the middle of a file
// with many keys: Open and Check return an error, and nothing panics.
func TestDamagedPage(t *testing.T) {
	src := fullStore(t, 3000)
	id := usedLeaf(t, src)
	path := copyFile(t, src, func(b []byte) {
		rnd := rand.New(rand.NewPCG(4, 4))
		for i := id * 4096; i < (id+1)*4096; i++ {
			b[i] = byte(rnd.IntN(256))
		}
	})
	s, err := Open(path, Options{NoSync: true})
	if err == nil {
		s.Close()
	}
	wantDamaged(t, "Open", err)
	_, err = Check(path, nil)
	wantDamaged(t, "Check", err)
	t.Logf("page %d: %v", id, err)
}

// TestDamageEveryPage damages each page of a file in several ways. Open
// and Check never panic (a panic in one of bbolt's goroutines would end
// the test binary); whatever Open refuses, Check refuses too; what Open
// accepts reads to the end; and garbage over the pages that hold the keys
// is always found.
func TestDamageEveryPage(t *testing.T) {
	src := fullStore(t, 500)
	rep, err := Check(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := rep.PageSize
	damages := map[string]func(b []byte, off int){
		"garbage": func(b []byte, off int) {
			rnd := rand.New(rand.NewPCG(uint64(off), 1))
			for i := off; i < off+ps; i++ {
				b[i] = byte(rnd.IntN(256))
			}
		},
		"zeros":          func(b []byte, off int) { clear(b[off : off+ps]) },
		"flags":          func(b []byte, off int) { b[off+8] ^= 0x03 },
		"count":          func(b []byte, off int) { b[off+10] ^= 0x40 },
		"overflow":       func(b []byte, off int) { b[off+12] ^= 0x08 },
		"first element":  func(b []byte, off int) { b[off+16+5] ^= 0x10 },
		"middle of page": func(b []byte, off int) { b[off+ps/2] ^= 0xff },
	}
	refused := map[string]int{}
	for page := 2; page < rep.Pages; page++ {
		for name, damage := range damages {
			what := fmt.Sprintf("page %d, %s", page, name)
			path := copyFile(t, src, func(b []byte) { damage(b, page*ps) })
			s, err := Open(path, Options{NoSync: true})
			_, cerr := Check(path, nil)
			if err != nil {
				wantDamaged(t, what+": Open", err)
				wantDamaged(t, what+": Check", cerr)
				refused[name]++
				continue
			}
			// Accepted: the page is free, or the damage is in data bbolt
			// cannot tell from good data. Everything still reads.
			if err := s.View(func(tx *Tx) error {
				tx.Scan(nil, nil, 1<<20, 1<<30)
				tx.Locks(nil, nil, func(_, _ []byte) bool { return true })
				return nil
			}); err != nil {
				t.Fatalf("%s: View: %v", what, err)
			}
			s.Close()
		}
	}
	t.Logf("refused of %d pages: %v", rep.Pages-2, refused)
	// Most pages hold keys: garbage over them cannot pass.
	if refused["garbage"] < (rep.Pages-2)/2 {
		t.Fatalf("garbage over %d of %d pages refused; want most", refused["garbage"], rep.Pages-2)
	}
}

// TestDamagedMetaPages: with both meta pages damaged, there is nothing to
// read; with one, bbolt falls back to the other.
func TestDamagedMetaPages(t *testing.T) {
	src := fullStore(t, 100)
	rep, err := Check(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := rep.PageSize
	// The root bucket's page number (checksum), then the version field.
	both := copyFile(t, src, func(b []byte) { b[32] ^= 1; b[ps+32] ^= 1 })
	_, err = Check(both, nil)
	wantDamaged(t, "Check, both metas", err)
	s, err := Open(both, Options{NoSync: true})
	if err == nil {
		s.Close()
	}
	wantDamaged(t, "Open, both metas", err)
	version := copyFile(t, src, func(b []byte) { b[20] ^= 1; b[ps+20] ^= 1 })
	_, err = Check(version, nil)
	wantDamaged(t, "Check, both versions", err)

	one := copyFile(t, src, func(b []byte) { b[32] ^= 1 })
	if _, err := Check(one, nil); err != nil {
		t.Fatalf("Check with one meta page damaged: %v", err)
	}
}

// TestCheckRecords: a sound bbolt file whose records or counters do not
// make sense is damaged too.
func TestCheckRecords(t *testing.T) {
	tests := []struct {
		name   string
		mangle func(tx *bolt.Tx) error
		want   string
	}{
		{"short record", func(tx *bolt.Tx) error { return tx.Bucket(bucketKeys).Put([]byte("key/000001"), []byte{1, 2}) }, "a record of 2 bytes"},
		{"live count", func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaLiveKeys, u64(5)) }, "the counter says 5"},
		{"counter size", func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaApplied, []byte{1}) }, "wal_applied: 1 bytes"},
		{"revision", func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaRevision, u64(3)) }, "above the store's 3"},
		{"no locks bucket", func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketLocks) }, `no "locks" bucket`},
		{"nested bucket", func(tx *bolt.Tx) error {
			_, err := tx.Bucket(bucketKeys).CreateBucket([]byte("sub"))
			return err
		}, `holds a bucket "sub"`},
		{"no tombstones bucket", func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketTombs) }, `no "tombstones" bucket`},
		{"deleted record in keys", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketKeys).Put([]byte("key/000001"), v1rec(false, 2, 2, ""))
		}, `key "key/000001": a deleted key's record in "keys"`},
		{"short tombstone", func(tx *bolt.Tx) error { return tx.Bucket(bucketTombs).Put([]byte("key/000000"), []byte{1}) }, `tombstone "key/000000": 1 bytes, not 16`},
		{"live and deleted", func(tx *bolt.Tx) error { return tx.Bucket(bucketTombs).Put([]byte("key/000001"), make([]byte, 16)) }, `key "key/000001": both live and deleted`},
		{"nested bucket in tombstones", func(tx *bolt.Tx) error {
			_, err := tx.Bucket(bucketTombs).CreateBucket([]byte("sub"))
			return err
		}, `bucket tombstones holds a bucket "sub"`},
		{"schema 1 with tombstones", func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaSchema, u64(1)) }, `unexpected bucket "tombstones"`},
	}
	src := fullStore(t, 50)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := copyFile(t, src, func([]byte) {})
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(tt.mangle); err != nil {
				t.Fatal(err)
			}
			db.Close()
			_, err = Check(path, nil)
			wantDamaged(t, tt.name, err)
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check = %v; want it to say %q", err, tt.want)
			}
		})
	}

	// Another schema version is not damage.
	path := copyFile(t, src, func([]byte) {})
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaSchema, u64(SchemaVersion+1)) })
	db.Close()
	if _, err := Check(path, nil); !errors.Is(err, ErrSchema) {
		t.Fatalf("Check of another schema = %v; want ErrSchema", err)
	}
}

// TestTruncatedFile: a data file cut at any page boundary, or inside its
// first pages, is an error from Open and Check, never a panic.
func TestTruncatedFile(t *testing.T) {
	src := fullStore(t, 300)
	rep, err := Check(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := rep.PageSize
	// The file may be longer than its pages in use: cut below those.
	for _, size := range []int{1, 100, ps - 1, ps, ps + 1, 2 * ps, 2*ps + 8, 3 * ps, rep.Pages / 2 * ps, (rep.Pages - 1) * ps} {
		path := copyFile(t, src, func([]byte) {})
		if err := os.Truncate(path, int64(size)); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path, Options{NoSync: true})
		if err == nil {
			s.Close()
			t.Fatalf("Open of the file cut at %d bytes (%d pages in use) succeeded", size, rep.Pages)
		}
		if _, cerr := Check(path, nil); cerr == nil {
			t.Fatalf("Check of the file cut at %d bytes found nothing (Open: %v)", size, err)
		}
	}
}
