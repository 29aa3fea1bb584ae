package wal

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func open(t *testing.T, path string) (*Log, [][]byte) {
	t.Helper()
	l, recs, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l, recs
}

func appendAll(t *testing.T, l *Log, payloads ...string) {
	t.Helper()
	for _, p := range payloads {
		if err := l.Append([]byte(p)); err != nil {
			t.Fatalf("Append(%q): %v", p, err)
		}
	}
	if err := l.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

func wantRecs(t *testing.T, got [][]byte, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("records = %q; want %q", got, want)
	}
	for i := range want {
		if string(got[i]) != want[i] {
			t.Fatalf("record %d = %q; want %q (all: %q)", i, got[i], want[i], got)
		}
	}
}

func TestAppendReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, recs := open(t, path)
	wantRecs(t, recs)
	appendAll(t, l, "one", "", "three")
	l.Close()
	l2, recs := open(t, path)
	wantRecs(t, recs, "one", "", "three")
	appendAll(t, l2, "four")
	l2.Close()
	_, recs = open(t, path)
	wantRecs(t, recs, "one", "", "three", "four")
}

// TestTornTail cuts the file at every byte of the last record: the records
// before it always come back, the torn one never, and the next append goes
// where the torn one started.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	l, _ := open(t, full)
	appendAll(t, l, "first", "second record")
	l.Close()
	data, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	lastStart := header + len("first")
	for cut := lastStart; cut < len(data); cut++ {
		path := filepath.Join(dir, fmt.Sprintf("cut%d", cut))
		if err := os.WriteFile(path, data[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		l, recs := open(t, path)
		wantRecs(t, recs, "first")
		appendAll(t, l, "again")
		l.Close()
		_, recs = open(t, path)
		wantRecs(t, recs, "first", "again")
	}
}

func TestCorruptRecordEndsTheLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _ := open(t, path)
	appendAll(t, l, "a", "bbbb", "c")
	l.Close()
	data, _ := os.ReadFile(path)
	i := bytes.Index(data, []byte("bbbb"))
	data[i] ^= 0xff
	os.WriteFile(path, data, 0o600)
	_, recs := open(t, path)
	wantRecs(t, recs, "a")
}

// TestReset: after a reset the log starts over at the start of the file;
// records left from before it, further in the file, never come back.
func TestReset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _ := open(t, path)
	appendAll(t, l, "old one", "old two", "old three")
	l.Reset()
	if l.Size() != 0 {
		t.Fatalf("Size after Reset = %d; want 0", l.Size())
	}
	appendAll(t, l, "new")
	l.Close()
	l2, recs := open(t, path)
	wantRecs(t, recs, "new")
	// A reset with nothing written after it: Open still returns the old
	// records (the caller knows they are reflected elsewhere and resets).
	l2.Reset()
	l2.Close()
	l3, recs := open(t, path)
	wantRecs(t, recs, "new")
	l3.Reset()
	appendAll(t, l3, "newer", "newest")
	l3.Close()
	_, recs = open(t, path)
	wantRecs(t, recs, "newer", "newest")
}
