package wal

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func open(t *testing.T, path string) (*Log, []Record) {
	t.Helper()
	l, recs, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l, recs
}

// appendAll appends the payloads numbered from lsn on, and syncs.
func appendAll(t *testing.T, l *Log, lsn uint64, payloads ...string) {
	t.Helper()
	for i, p := range payloads {
		if err := l.Append(lsn+uint64(i), []byte(p)); err != nil {
			t.Fatalf("Append(%q): %v", p, err)
		}
	}
	if err := l.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

// wantRecs checks the payloads, and that they are numbered from first on.
func wantRecs(t *testing.T, got []Record, first uint64, want ...string) {
	t.Helper()
	var g []string
	for _, r := range got {
		g = append(g, string(r.Payload))
	}
	if fmt.Sprint(g) != fmt.Sprint(want) || len(g) != len(want) {
		t.Fatalf("records = %q; want %q", g, want)
	}
	for i, r := range got {
		if r.LSN != first+uint64(i) {
			t.Fatalf("record %d numbered %d; want %d", i, r.LSN, first+uint64(i))
		}
	}
}

func TestAppendReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, recs := open(t, path)
	wantRecs(t, recs, 0)
	appendAll(t, l, 10, "one", "", "three")
	l.Close()
	l2, recs := open(t, path)
	wantRecs(t, recs, 10, "one", "", "three")
	appendAll(t, l2, 13, "four")
	l2.Close()
	_, recs = open(t, path)
	wantRecs(t, recs, 10, "one", "", "three", "four")
}

// TestTornTail cuts the file at every byte of the last record: the records
// before it always come back, the torn one never, and the next append goes
// where the torn one started.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	l, _ := open(t, full)
	appendAll(t, l, 1, "first", "second record")
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
		wantRecs(t, recs, 1, "first")
		appendAll(t, l, 2, "again")
		l.Close()
		_, recs = open(t, path)
		wantRecs(t, recs, 1, "first", "again")
	}
}

func TestCorruptRecordEndsTheLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _ := open(t, path)
	appendAll(t, l, 1, "a", "bbbb", "c")
	l.Close()
	data, _ := os.ReadFile(path)
	i := bytes.Index(data, []byte("bbbb"))
	data[i] ^= 0xff
	os.WriteFile(path, data, 0o600)
	_, recs := open(t, path)
	wantRecs(t, recs, 1, "a")
}

// TestReset: after a reset the log starts over at the start of the file;
// records left from before it, further in the file, never come back after
// newer ones, because they are numbered lower.
func TestReset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _ := open(t, path)
	appendAll(t, l, 1, "old one", "old two", "old three")
	l.Reset()
	if l.Size() != 0 {
		t.Fatalf("Size after Reset = %d; want 0", l.Size())
	}
	appendAll(t, l, 4, "new")
	l.Close()
	l2, recs := open(t, path)
	wantRecs(t, recs, 4, "new")
	// A reset with nothing written after it: Open still returns the old
	// records (the caller knows their numbers are behind it).
	l2.Reset()
	l2.Close()
	l3, recs := open(t, path)
	wantRecs(t, recs, 4, "new")
	l3.Reset()
	appendAll(t, l3, 5, "newer", "newest")
	l3.Close()
	_, recs = open(t, path)
	wantRecs(t, recs, 5, "newer", "newest")
}

// TestTornFirstRecordAfterReset: the first record after a reset is torn;
// Open returns nothing, and old records further on (numbered lower than
// anything new) never follow a newer one.
func TestTornFirstRecordAfterReset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _ := open(t, path)
	appendAll(t, l, 1, "old one", "old two", "old three")
	l.Close()
	data, _ := os.ReadFile(path)
	copy(data, "garbage, a torn write")
	os.WriteFile(path, data, 0o600)
	l2, recs := open(t, path)
	if len(recs) != 0 {
		t.Fatalf("records after a torn first one = %d; want none", len(recs))
	}
	appendAll(t, l2, 4, "new")
	l2.Close()
	_, recs = open(t, path)
	wantRecs(t, recs, 4, "new")
}
