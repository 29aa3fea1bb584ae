package wal

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpen: whatever bytes a log file holds, Open never panics; it either
// refuses the log as corrupt or returns records that it returns again after
// an append and a reopen, followed by the new record.
func FuzzOpen(f *testing.F) {
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed")
	l, _, _, _ := Open(seed, 0)
	l.Append(1, []byte("one"))
	l.Append(2, []byte("two"))
	l.Append(3, []byte("three"))
	l.Close()
	good, _ := os.ReadFile(seed)
	f.Add(good, uint64(0))
	f.Add(good, uint64(1))
	f.Add(good, uint64(3))
	f.Add(good[:len(good)-1], uint64(0))
	flipped := append([]byte{}, good...)
	flipped[header] ^= 1 // the first record's payload: corrupt
	f.Add(flipped, uint64(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, after uint64) {
		path := filepath.Join(t.TempDir(), "log")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		l, recs, tail, err := Open(path, after)
		if errors.Is(err, ErrCorrupt) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		next := after + 1
		if len(recs) > 0 {
			next = recs[len(recs)-1].LSN + 1
		}
		if next == 0 {
			l.Close()
			return // the numbers ran out
		}
		for i, r := range recs {
			if r.LSN != after+1+uint64(i) {
				t.Fatalf("record %d numbered %d; want %d", i, r.LSN, after+1+uint64(i))
			}
		}
		if tail.Offset < 0 || tail.Offset > int64(len(data)) || tail.Reason == "" {
			t.Fatalf("tail %+v of a %d-byte file", tail, len(data))
		}
		if err := l.Append(next, []byte("new")); err != nil {
			t.Fatal(err)
		}
		l.Close()
		l, again, _, err := Open(path, after)
		if err != nil {
			t.Fatalf("after an append: %v", err)
		}
		defer l.Close()
		if len(again) != len(recs)+1 || string(again[len(recs)].Payload) != "new" || again[len(recs)].LSN != next {
			t.Fatalf("after an append: %d records; want %d, the new one last", len(again), len(recs)+1)
		}
		for i := range recs {
			if string(again[i].Payload) != string(recs[i].Payload) || again[i].LSN != recs[i].LSN {
				t.Fatalf("record %d changed: %q -> %q", i, recs[i].Payload, again[i].Payload)
			}
		}
	})
}
