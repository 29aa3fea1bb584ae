package wal

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpen: whatever bytes a log file holds, Open never panics, and what it
// returns it returns again after an append and a reopen, followed by the
// new record.
func FuzzOpen(f *testing.F) {
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed")
	l, _, _ := Open(seed)
	l.Append(1, []byte("one"))
	l.Append(2, []byte("two"))
	l.Close()
	good, _ := os.ReadFile(seed)
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "log")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		l, recs, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		next := uint64(1)
		if len(recs) > 0 {
			next = recs[len(recs)-1].LSN + 1
		}
		if err := l.Append(next, []byte("new")); err != nil {
			t.Fatal(err)
		}
		l.Close()
		l, again, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		// Bytes after the new record may happen to continue the numbering
		// (a crafted file); the new record still follows the old ones.
		if len(again) < len(recs)+1 || string(again[len(recs)].Payload) != "new" || again[len(recs)].LSN != next {
			t.Fatalf("after an append: %d records; want %d or more, the new one at %d", len(again), len(recs)+1, len(recs))
		}
		for i := range recs {
			if string(again[i].Payload) != string(recs[i].Payload) || again[i].LSN != recs[i].LSN {
				t.Fatalf("record %d changed: %q -> %q", i, recs[i].Payload, again[i].Payload)
			}
		}
	})
}
