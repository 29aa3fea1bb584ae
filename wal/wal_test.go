package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// open opens the log at path given after, and fails the test on an error.
func open(t *testing.T, path string, after uint64) (*Log, []Record, Tail) {
	t.Helper()
	l, recs, tail, err := Open(path, after)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l, recs, tail
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

func wantTail(t *testing.T, tail Tail, off int64, torn bool) {
	t.Helper()
	if tail.Offset != off || tail.Torn != torn || tail.Reason == "" {
		t.Fatalf("tail = %+v; want offset %d, torn %v, and a reason", tail, off, torn)
	}
}

// wantCorrupt checks that err is a *CorruptError at offset off, where
// record expected should be.
func wantCorrupt(t *testing.T, err error, path string, off int64, expected uint64) *CorruptError {
	t.Helper()
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open: err = %v; want a *CorruptError", err)
	}
	if ce.Offset != off || ce.Expected != expected || ce.Found <= ce.Expected-1 || ce.FoundAt < off {
		t.Fatalf("corruption %+v; want it at offset %d, record %d expected", ce, off, expected)
	}
	msg := err.Error()
	for _, want := range []string{path, fmt.Sprintf("offset %d", off), "backup", "fencekv check"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("message %q does not name %q", msg, want)
		}
	}
	return ce
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAppendReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, recs, tail := open(t, path, 9)
	wantRecs(t, recs, 0)
	wantTail(t, tail, 0, false)
	appendAll(t, l, 10, "one", "", "three")
	l.Close()
	l2, recs, tail := open(t, path, 9)
	wantRecs(t, recs, 10, "one", "", "three")
	wantTail(t, tail, 3*header+8, false)
	if l2.Size() != 3*header+8 {
		t.Fatalf("Size = %d; want %d", l2.Size(), 3*header+8)
	}
	appendAll(t, l2, 13, "four")
	l2.Close()
	_, recs, _ = open(t, path, 9)
	wantRecs(t, recs, 10, "one", "", "three", "four")
	// What the caller already has is not returned.
	_, recs, _ = open(t, path, 11)
	wantRecs(t, recs, 12, "three", "four")
}

// TestTornTail cuts the file at every byte of the last record: the records
// before it always come back, the torn one never, the tail says torn once
// its header is there, and the next append goes where the torn one started.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	l, _, _ := open(t, full, 0)
	appendAll(t, l, 1, "first", "second record")
	l.Close()
	data := readFile(t, full)[:l.Size()] // without the zeros preallocated after it
	lastStart := header + len("first")
	for cut := lastStart; cut < len(data); cut++ {
		path := filepath.Join(dir, fmt.Sprintf("cut%d", cut))
		writeFile(t, path, data[:cut])
		l, recs, tail := open(t, path, 0)
		wantRecs(t, recs, 1, "first")
		if tail.Offset != int64(lastStart) || cut == lastStart && tail.Torn || cut >= lastStart+header && !tail.Torn {
			t.Fatalf("cut at %d: tail %+v; want offset %d, torn once the header is there", cut, tail, lastStart)
		}
		appendAll(t, l, 2, "again")
		l.Close()
		_, recs, _ = open(t, path, 0)
		wantRecs(t, recs, 1, "first", "again")
	}
}

// TestDamagedLastRecord: the last record damaged in its payload, checksum
// or length, with nothing after it, is a torn tail, not an error.
func TestDamagedLastRecord(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "log")
	l, _, _ := open(t, src, 0)
	appendAll(t, l, 1, "a", "bb", "the last record")
	l.Close()
	good := readFile(t, src)[:l.Size()]
	last := 2*header + 3
	for name, damage := range map[string]func(b []byte){
		"payload garbage":   func(b []byte) { copy(b[last+header:], "GARBAGE GARBAGE") },
		"payload bit":       func(b []byte) { b[len(b)-1] ^= 0x10 },
		"crc":               func(b []byte) { b[last+4] ^= 1 },
		"length too long":   func(b []byte) { b[last+3] += 7 },
		"length impossible": func(b []byte) { b[last] = 0xff },
		"length shorter":    func(b []byte) { b[last+3] -= 2 },
	} {
		data := bytes.Clone(good)
		damage(data)
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		writeFile(t, path, data)
		l, recs, tail := open(t, path, 0)
		wantRecs(t, recs, 1, "a", "bb")
		wantTail(t, tail, int64(last), true)
		// The next append overwrites it.
		appendAll(t, l, 3, "new")
		l.Close()
		_, recs, _ = open(t, path, 0)
		wantRecs(t, recs, 1, "a", "bb", "new")
	}
}

// bigLog writes n records of varied sizes numbered from first on, and
// returns the file's bytes and where each record starts.
func bigLog(t *testing.T, path string, first uint64, n int) ([]byte, []int) {
	t.Helper()
	l, _, _ := open(t, path, first-1)
	rnd := rand.New(rand.NewPCG(1, 2))
	var starts []int
	off := 0
	for i := range n {
		p := make([]byte, rnd.IntN(200))
		for j := range p {
			p[j] = byte(rnd.IntN(256))
		}
		if err := l.Append(first+uint64(i), p); err != nil {
			t.Fatal(err)
		}
		starts = append(starts, off)
		off += header + len(p)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	return readFile(t, path)[:l.Size()], starts
}

// TestCorruptionIsAnError flips bits of a 431-record log in the first
// record, a middle one and the one before the last, in each field: Open
// fails with the offset of the damaged record instead of returning the
// records before it.
func TestCorruptionIsAnError(t *testing.T) {
	dir := t.TempDir()
	const n, first = 431, 1000
	good, starts := bigLog(t, filepath.Join(dir, "good"), first, n)
	for _, i := range []int{0, 1, 214, 215, n - 2} {
		for field, at := range map[string]int{"length low bit": 3, "length high bit": 0, "crc": 5, "lsn": 15, "lsn high": 8, "payload": header} {
			if i == 0 && field == "payload" && starts[1]-starts[0] == header {
				continue // an empty payload
			}
			data := bytes.Clone(good)
			bit := byte(1)
			if field == "length high bit" || field == "lsn high" {
				bit = 0x80
			}
			data[starts[i]+at] ^= bit
			path := filepath.Join(dir, fmt.Sprintf("rec%d-%s", i, strings.ReplaceAll(field, " ", "-")))
			writeFile(t, path, data)
			_, _, _, err := Open(path, first-1)
			ce := wantCorrupt(t, err, path, int64(starts[i]), first+uint64(i))
			if ce.Found != first+uint64(i)+1 || ce.FoundAt != int64(starts[i+1]) {
				t.Errorf("record %d, %s: found record %d at %d; want the next one, %d at %d",
					i, field, ce.Found, ce.FoundAt, first+i+1, starts[i+1])
			}
		}
	}
}

// TestEveryBitFlip flips, one at a time, every bit of a small log: in any
// record but the last, Open fails at that record; in the last, it returns
// the others.
func TestEveryBitFlip(t *testing.T) {
	const n, first = 12, 1
	good, starts := bigLog(t, filepath.Join(t.TempDir(), "log"), first, n)
	lastStart := starts[n-1]
	for i := range len(good) * 8 {
		data := bytes.Clone(good)
		data[i/8] ^= 1 << (i % 8)
		rec := 0
		for rec+1 < n && starts[rec+1] <= i/8 {
			rec++
		}
		recs, tail, err := read(data, first-1)
		if i/8 < lastStart {
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Offset != int64(starts[rec]) || ce.Expected != first+uint64(rec) {
				t.Fatalf("bit %d (record %d): err = %v, %d records; want corruption at %d", i, rec, err, len(recs), starts[rec])
			}
			continue
		}
		if err != nil || len(recs) != n-1 || tail.Offset != int64(lastStart) {
			t.Fatalf("bit %d of the last record: %d records, tail %+v, err %v; want %d records", i, len(recs), tail, err, n-1)
		}
	}
}

// TestGap: a good record numbered more than one above the one before it
// means records are missing: an error, not the end of the log.
func TestGap(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log")
	l, _, _ := open(t, path, 0)
	appendAll(t, l, 1, "one", "two")
	l.Append(4, []byte("four")) // three is missing
	appendAll(t, l, 5, "five")
	l.Close()
	_, _, _, err := Open(path, 0)
	wantCorrupt(t, err, path, 2*header+6, 3)

	// The data file is behind the log (the log numbers from 4, the data
	// file has up to 1): records 2 and 3 are missing.
	path2 := filepath.Join(dir, "behind")
	l, _, _ = open(t, path2, 3)
	appendAll(t, l, 4, "four", "five")
	l.Close()
	_, _, _, err = Open(path2, 1)
	wantCorrupt(t, err, path2, 0, 2)
}

// TestReset: after a reset the log starts over at the start of the file;
// records left from before it, further in the file, are numbered lower,
// and are neither returned nor taken for corruption.
func TestReset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _, _ := open(t, path, 0)
	var old []string
	for i := range 50 {
		old = append(old, fmt.Sprintf("old record %d with some bytes to leave behind", i))
	}
	appendAll(t, l, 1, old...)
	l.Reset() // a checkpoint covered 1..50
	if l.Size() != 0 {
		t.Fatalf("Size after Reset = %d; want 0", l.Size())
	}
	appendAll(t, l, 51, "new", "newer")
	l.Close()
	l2, recs, tail := open(t, path, 50)
	wantRecs(t, recs, 51, "new", "newer")
	wantTail(t, tail, 2*header+8, false)

	// Checkpointed again (51, 52) and reset, with nothing written after:
	// nothing is returned, and the next record goes at the start.
	l2.Reset()
	l2.Close()
	l3, recs, tail := open(t, path, 52)
	wantRecs(t, recs, 0)
	wantTail(t, tail, 2*header+8, false)
	if l3.Size() != 0 {
		t.Fatalf("Size = %d; want 0 (the next record goes at the start)", l3.Size())
	}
	appendAll(t, l3, 53, "newest")
	l3.Close()
	_, recs, _ = open(t, path, 52)
	wantRecs(t, recs, 53, "newest")
}

// TestLeftoverWholeRecord: a whole older record right after the live ones
// ends the log cleanly.
func TestLeftoverWholeRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _, _ := open(t, path, 0)
	appendAll(t, l, 1, "aaaa", "bbbb", "cccc")
	l.Reset()
	appendAll(t, l, 4, "dddd")
	l.Close()
	_, recs, tail := open(t, path, 3)
	wantRecs(t, recs, 4, "dddd")
	wantTail(t, tail, header+4, false)
	if !strings.Contains(tail.Reason, "record 2") {
		t.Fatalf("reason %q; want it to name record 2", tail.Reason)
	}
}

// TestOldRecordsThenNew: records the caller has, followed by newer ones
// without a reset between, are skipped; the newer ones are returned.
func TestOldRecordsThenNew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _, _ := open(t, path, 0)
	appendAll(t, l, 1, "one", "two", "three", "four")
	l.Close()
	l, recs, _ := open(t, path, 2)
	wantRecs(t, recs, 3, "three", "four")
	appendAll(t, l, 5, "five")
	l.Close()
	_, recs, _ = open(t, path, 2)
	wantRecs(t, recs, 3, "three", "four", "five")
}

// TestTornFirstRecordAfterReset: the first record after a reset is torn;
// Open returns nothing, the older records after it are not corruption, and
// the next append goes at the start.
func TestTornFirstRecordAfterReset(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log")
	l, _, _ := open(t, path, 0)
	appendAll(t, l, 1, "old one", "old two", "old three")
	l.Reset()
	appendAll(t, l, 4, "new four, longer than the old ones")
	l.Close()
	good := readFile(t, path)

	// Cut by a crash: the header of record 4 is there, not its payload.
	data := bytes.Clone(good)
	copy(data[header:], "garbage, a torn write")
	writeFile(t, path, data)
	l2, recs, tail := open(t, path, 3)
	wantRecs(t, recs, 0)
	wantTail(t, tail, 0, true)
	appendAll(t, l2, 4, "new")
	l2.Close()
	_, recs, _ = open(t, path, 3)
	wantRecs(t, recs, 4, "new")

	// Nothing recognizable of record 4 reached the disk: garbage over its
	// header too.
	data = bytes.Clone(good)
	copy(data, "garbage over the header")
	writeFile(t, path, data)
	_, recs, tail = open(t, path, 3)
	wantRecs(t, recs, 0)
	wantTail(t, tail, 0, false)
}

// TestZeros: a log of zeros (a preallocated file) is empty.
func TestZeros(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	writeFile(t, path, make([]byte, 4096))
	l, recs, tail := open(t, path, 7)
	wantRecs(t, recs, 0)
	wantTail(t, tail, 0, false)
	appendAll(t, l, 8, "eight")
	l.Close()
	_, recs, _ = open(t, path, 7)
	wantRecs(t, recs, 8, "eight")
}

// TestCorruptRecordInBigLog: a 16 MiB log whose second record is damaged
// is refused (the scan's speed is not asserted here).
func TestCorruptRecordInBigLog(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 16 MiB")
	}
	path := filepath.Join(t.TempDir(), "log")
	l, _, _ := open(t, path, 0)
	payload := bytes.Repeat([]byte("x"), 4096)
	n := (16 << 20) / (header + len(payload))
	for i := range n {
		if err := l.Append(uint64(i+1), payload); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	data := readFile(t, path)[:l.Size()]
	// The damaged record's length is garbage, and so is every byte up to
	// the last record: only that one is left to find.
	rec := header + len(payload)
	data[rec] = 0x7f
	for i := rec + header; i < len(data)-rec; i++ {
		data[i] = byte(i)
	}
	writeFile(t, path, data)
	_, _, _, err := Open(path, 0)
	wantCorrupt(t, err, path, int64(rec), 2)
}

// TestRead reads as Open does, without creating or changing the file.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := Read(filepath.Join(dir, "none"), 0); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Read of a missing log = %v; want ErrNotExist", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Read created the log: %v", err)
	}
	path := filepath.Join(dir, "log")
	l, _, _ := open(t, path, 0)
	appendAll(t, l, 1, "one", "two", "three")
	l.Close()
	recs, tail, err := Read(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	wantRecs(t, recs, 2, "two", "three")
	wantTail(t, tail, 3*header+11, false)
	data := readFile(t, path)
	data[header+1] ^= 1 // record one's payload
	writeFile(t, path, data)
	_, _, err = Read(path, 0)
	wantCorrupt(t, err, path, 0, 1)
}

// TestAppendMany: records appended together are written in one write,
// numbered in order, each where RecordSize says, and read back by Open and
// ReadAt as if appended one by one.
func TestAppendMany(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _, _, err := Open(path, 9)
	if err != nil {
		t.Fatal(err)
	}
	payloads := [][]byte{[]byte("one"), {}, []byte("three, longer")}
	if err := l.Append(10, payloads...); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(13, []byte("four")); err != nil {
		t.Fatal(err)
	}
	var size int64
	for _, p := range append(payloads, []byte("four")) {
		size += RecordSize(len(p))
	}
	if l.Size() != size {
		t.Fatalf("size %d, want %d", l.Size(), size)
	}
	l.Close()
	l, recs, tail, err := Open(path, 9)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var off int64
	for i, r := range recs {
		want := append(payloads, []byte("four"))[i]
		if r.LSN != 10+uint64(i) || string(r.Payload) != string(want) || r.Offset != off {
			t.Fatalf("record %d: %d %q at %d; want %d %q at %d", i, r.LSN, r.Payload, r.Offset, 10+i, want, off)
		}
		lsn, p, err := l.ReadAt(r.Offset, len(r.Payload))
		if err != nil || lsn != r.LSN || string(p) != string(want) {
			t.Fatalf("ReadAt(%d) = %d %q %v", r.Offset, lsn, p, err)
		}
		off += RecordSize(len(want))
	}
	if len(recs) != 4 || tail.Offset != size || tail.Torn {
		t.Fatalf("%d records, tail %+v; want 4 ending at %d", len(recs), tail, size)
	}
}

// TestPreallocated: the file grows ahead of the records, in steps, so that
// most appends do not change its size (a sync then has no size to
// journal); the zeros after the last record read as a clean end, a torn
// record in them as a torn tail, and a truncated log grows again.
func TestPreallocated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, _, _ := open(t, path, 0)
	payload := bytes.Repeat([]byte("p"), 1000)
	size := func() int64 {
		t.Helper()
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	changes, last := 0, size()
	const n = 3000
	for i := range n {
		if err := l.Append(uint64(i+1), payload); err != nil {
			t.Fatal(err)
		}
		if s := size(); s != last {
			changes, last = changes+1, s
		}
		if last < l.Size() {
			t.Fatalf("the file is %d bytes, the records %d", last, l.Size())
		}
	}
	if l.fixed {
		t.Skip("this file system cannot preallocate")
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	// 3 MB of records: 1 MiB, then 2, then 4 at a time.
	if changes > 4 {
		t.Fatalf("the file's size changed %d times over %d appends; want a few steps", changes, n)
	}
	if last == l.Size() {
		t.Fatalf("the file is %d bytes, no more than its records: nothing preallocated", last)
	}
	end := l.Size()
	// A torn append in the zeros: the header and half the payload.
	var b []byte
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = binary.BigEndian.AppendUint32(b, 12345)
	b = binary.BigEndian.AppendUint64(b, n+1)
	b = append(b, payload[:500]...)
	if _, err := l.f.WriteAt(b, end); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l, recs, tail := open(t, path, n-2)
	wantRecs(t, recs, n-1, string(payload), string(payload))
	wantTail(t, tail, end, true)
	if _, _, tail := open(t, path, n); tail.Reason == "zeros" {
		t.Fatalf("tail %+v: the torn record read as zeros", tail)
	}
	appendAll(t, l, n+1, "after the torn one")
	l.Close()
	l, recs, tail = open(t, path, n)
	wantRecs(t, recs, n+1, "after the torn one")
	if tail.Torn { // the rest of the torn record follows: older bytes
		t.Fatalf("tail %+v after the record that replaced the torn one; want a clean end", tail)
	}
	// Cut back, the log grows again from the cut.
	if err := l.Truncate(recs[0].Offset); err != nil {
		t.Fatal(err)
	}
	if s := size(); s != recs[0].Offset {
		t.Fatalf("truncated to %d bytes; the file has %d", recs[0].Offset, s)
	}
	appendAll(t, l, n+1, "again")
	if s := size(); s <= l.Size() {
		t.Fatalf("the file is %d bytes after an append past the cut, the records %d: nothing preallocated", s, l.Size())
	}
}
