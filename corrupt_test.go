package fencekv

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv/wal"
)

// A damaged disk never loses or invents state silently: a damaged log
// record that is not the torn tail of the last append stops Open with an
// error naming the file and offset; a torn tail is dropped and the token
// sequence moves past any token it could have issued (G1).

// crashCopy copies a data dir's files as a crash would leave them: the DB
// stays open (nothing is closed, checkpointed or flushed beyond what each
// acknowledged call made durable).
func crashCopy(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	for _, name := range []string{DataFile, LogFile} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// logRecords returns the offsets of the log's records, in order.
func logRecords(t *testing.T, path string) []int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int64
	var last uint64
	for off := 0; off+16 <= len(b); {
		n := int(binary.BigEndian.Uint32(b[off:]))
		lsn := binary.BigEndian.Uint64(b[off+8:])
		if n == 0 || off+16+n > len(b) || (len(offs) > 0 && lsn != last+1) {
			break
		}
		offs = append(offs, int64(off))
		last = lsn
		off += 16 + n
	}
	return offs
}

func tokensAndWrites(t *testing.T) (dir string, last Token) {
	t.Helper()
	dir = t.TempDir()
	db, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 5 {
		l, err := db.Acquire(ctx, "L", time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Put(ctx, []byte("K"), []byte{byte('a' + i)}, WriteOptions{Token: l.Token}); err != nil {
			t.Fatal(err)
		}
		if err := db.Release(ctx, "L", l.Token); err != nil {
			t.Fatal(err)
		}
		last = l.Token
	}
	t.Cleanup(func() { db.Close() })
	return dir, last
}

func TestLogCorruptionRefused(t *testing.T) {
	dir, _ := tokensAndWrites(t)
	recs := logRecords(t, filepath.Join(dir, LogFile))
	if len(recs) < 4 {
		t.Fatalf("%d log records; want several", len(recs))
	}
	for _, rec := range []int{0, 1, len(recs) / 2, len(recs) - 2} {
		for _, at := range []int64{2, 6, 12, 20} { // length, checksum, number, payload
			cp := crashCopy(t, dir)
			path := filepath.Join(cp, LogFile)
			b, _ := os.ReadFile(path)
			b[recs[rec]+at] ^= 0x10
			os.WriteFile(path, b, 0o600)
			db, err := Open(cp, nil)
			if err == nil {
				db.Close()
				t.Fatalf("record %d byte %d flipped: Open succeeded; want corruption refused", rec, at)
			}
			if !errors.Is(err, wal.ErrCorrupt) || !strings.Contains(err.Error(), "offset") {
				t.Fatalf("record %d byte %d flipped: %v; want wal.ErrCorrupt naming the offset", rec, at, err)
			}
		}
	}
}

func TestTornTailMovesTokensOn(t *testing.T) {
	dir, last := tokensAndWrites(t)
	recs := logRecords(t, filepath.Join(dir, LogFile))
	cp := crashCopy(t, dir)
	path := filepath.Join(cp, LogFile)
	// Cut the last record short, as a crash in the middle of its write.
	if err := os.Truncate(path, recs[len(recs)-1]+20); err != nil {
		t.Fatal(err)
	}
	db, err := Open(cp, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l, err := db.Acquire(context.Background(), "L2", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= last {
		t.Fatalf("token after a torn tail %d; want above %d, the last issued before the crash", l.Token, last)
	}
}

// TestLimitsWithinStorage: a key limit above what the storage can hold is
// refused at Open, so no command can fail in the storage for its size
// (which once drew a token in the live run and not in replay).
func TestLimitsWithinStorage(t *testing.T) {
	o := DefaultOptions()
	o.MaxKeySize = 40_000
	if db, err := Open(t.TempDir(), &o); err == nil {
		db.Close()
		t.Fatal("Open with MaxKeySize 40000 succeeded; want it refused")
	}
}
