package kv

import (
	"fmt"
	"path/filepath"
	"testing"
)

// scanKeys lists the live keys and values a reader sees under prefix.
func scanKeys(t *testing.T, s *Store, prefix string) string {
	t.Helper()
	var out string
	_ = s.View(func(tx *Tx) error {
		items, _ := tx.Scan([]byte(prefix), nil, 100, 1<<20)
		for _, e := range items {
			out += fmt.Sprintf("%s=%s ", e.Key, e.Value)
		}
		return nil
	})
	return out
}

func namesLen(ns *names) int {
	n := 0
	ns.each(func(*chain) { n++ })
	return n
}

func lockNames(t *testing.T, s *Store) string {
	t.Helper()
	var out string
	_ = s.View(func(tx *Tx) error {
		tx.Locks(nil, nil, func(name, rec []byte) bool {
			out += fmt.Sprintf("%s=%s ", name, rec)
			return true
		})
		return nil
	})
	return out
}

// TestWriterPublishCheckpoint: readers see the writer's changes only once
// published, merged with the file in order (overlay entries replacing the
// file's, deleted locks gone), and the same after a checkpoint moves them
// into the file and empties the overlay.
func TestWriterPublishCheckpoint(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) {
		for _, k := range []string{"b", "d", "f"} {
			tx.Put([]byte(k), []byte("file"), Write{})
		}
		tx.PutLock("L1", []byte("file"))
		tx.PutLock("L3", []byte("file"))
	})
	w, err := s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	if w2, _ := s.Writer(); w2 != w {
		t.Fatalf("Writer returned a second writer while one is open")
	}
	key := []byte("a")
	w.Put(key, []byte("new"), Write{Token: 3})
	key[0] = 'z' // the caller reuses its buffer: the store must have copied it
	w.Put([]byte("d"), []byte("new"), Write{})
	w.Delete([]byte("f"), Write{})
	w.Put([]byte("g"), []byte("new"), Write{})
	w.PutLock("L2", []byte("new"))
	w.DeleteLock("L3")

	const before = "b=file d=file f=file "
	if got := scanKeys(t, s, ""); got != before {
		t.Fatalf("before Publish, scan = %q; want %q", got, before)
	}
	if e := get(t, s, "a"); e.Found {
		t.Fatalf("before Publish, get a = %+v; want not found", e)
	}
	s.Publish()
	const after = "a=new b=file d=new g=new "
	if got := scanKeys(t, s, ""); got != after {
		t.Fatalf("after Publish, scan = %q; want %q", got, after)
	}
	if e := get(t, s, "a"); !e.Found || string(e.Value) != "new" || e.Fence != 3 {
		t.Fatalf("after Publish, get a = %+v", e)
	}
	if e := get(t, s, "f"); e.Found {
		t.Fatalf("after Publish, get f = %+v; want deleted", e)
	}
	const locks = "L1=file L2=new "
	if got := lockNames(t, s); got != locks {
		t.Fatalf("after Publish, locks = %q; want %q", got, locks)
	}
	var rev Revision
	_ = s.View(func(tx *Tx) error { rev = tx.Revision(); return nil })
	if rev != 7 {
		t.Fatalf("revision seen by a reader = %d; want 7", rev)
	}

	if err := s.Checkpoint(Marks{Applied: 42, Term: 3}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if v := s.ov.cur; namesLen(&v.g.keys) != 0 || namesLen(&v.g.locks) != 0 || v.set {
		t.Fatalf("overlay not emptied by Checkpoint")
	}
	if got := scanKeys(t, s, ""); got != after {
		t.Fatalf("after Checkpoint, scan = %q; want %q", got, after)
	}
	if got := lockNames(t, s); got != locks {
		t.Fatalf("after Checkpoint, locks = %q; want %q", got, locks)
	}
	if m, err := s.Marks(); err != nil || m != (Marks{Applied: 42, Term: 3}) {
		t.Fatalf("Marks = %+v, %v; want {42 3}", m, err)
	}
}

// TestAbortKeepsPublished: Abort drops unpublished changes from the file's
// future, but readers keep what was published (it is durable elsewhere).
func TestAbortKeepsPublished(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	w, _ := s.Writer()
	w.Put([]byte("k"), []byte("published"), Write{})
	s.Publish()
	w.Put([]byte("k"), []byte("unpublished"), Write{})
	s.Abort()
	if e := get(t, s, "k"); string(e.Value) != "published" {
		t.Fatalf("get after Abort = %q; want the published value", e.Value)
	}
	s.Close()
	s, err = Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if e := get(t, s, "k"); e.Found {
		t.Fatalf("the file has %q; want nothing (never checkpointed)", e.Value)
	}
}
