// Package wal is fencekv's write-ahead log: a file of checksummed,
// numbered records, made durable with one fdatasync per append batch.
//
// The engine appends the commands of each group commit as one record and
// syncs it before it answers any of them; the bbolt file is brought up to
// date (checkpointed) only now and then, after which the log starts over.
// After a crash, the records the bbolt file does not reflect are replayed.
//
// # Records
//
// A record on disk is
//
//	length  uint32, big-endian: the payload's length (at most MaxRecord)
//	crc     uint32, big-endian: CRC-32C (Castagnoli) of lsn and payload
//	lsn     uint64, big-endian: the record's number, given by the caller
//	payload
//
// The caller numbers records with one increasing sequence that never
// restarts (fencekv uses the sequence its data file records as applied):
// each record numbers one more than the one before it, and after a
// checkpoint that made the data file reflect records up to A, the next
// record is numbered A+1.
//
// Starting over (Reset) does not truncate the file: new records overwrite
// old ones from the start, because overwriting a file's blocks and syncing
// costs less than growing it (no metadata to journal). So bytes of records
// from before the last Reset, numbered A or lower, may follow the live
// records: whole ones, or the rest of one cut by a newer record.
//
// Growing the file costs the same at each sync: the file's new size must
// be journaled with the data. So the file is extended ahead of the
// records, in steps (preallocate: fallocate on Linux, doubling up to
// maxGrow at a time), and most syncs find the size unchanged: on this
// project's ext4 test machines an append and sync that grew the file took
// twice as long as one into a preallocated file. The bytes past the last
// record are then zeros, which read as a clean end (below); where the
// file system cannot preallocate, the log grows with its records. The
// price: a power cut during the sync of an append of several records may
// leave a later one of them on the disk without an earlier one (an
// appended file's size, journaled after its data, kept that from
// happening), which Open reports as corrupt although none was synced.
//
// # Reading: the end of the log, torn tails and corruption
//
// Open(path, after) (and Read, which only reads) is given A, the last
// record the caller already has. It reads records from offset 0 on, while
// they are whole, pass their checksum and number one more than the record
// before them. Records numbered A or
// lower at the start are skipped (left from before the checkpoint); the
// others (A+1, A+2, ...) are returned. Where this run of records stops, the
// log ends, in one of three ways (Tail):
//
//   - Clean: the next bytes are the end of the file, zeros, a whole record
//     numbered no higher than the last one read (left from before a Reset),
//     or bytes that are not the start of the next record (their number is not
//     the next one): the rest of an older record.
//   - Torn: the next bytes start the next record (they carry its number) but
//     it is cut short by the end of the file, its length is impossible, or
//     its checksum fails. Every append is synced before the next one is
//     made, so only the last append can be torn by a crash; it was never
//     synced, so never acknowledged. (Damage to the last record after it was
//     synced looks the same: the caller treats what it may have held as
//     possibly issued. Damage to the last record's number field makes it
//     look like older bytes instead: a clean end.)
//   - Corrupt: somewhere from where the next append would go (the end of
//     the run, or offset 0 if it returned nothing) on, a whole record with
//     a good checksum is numbered above the last record read (and at most
//     A+2^32 — numbers further off are taken for noise). The records between
//     are lost: the run stopped at a damaged record that was not the last
//     append (bit rot, a bad disk, a hand edit), or a record is missing (the
//     log jumps from N to N+2 or more). Open fails with a *CorruptError
//     (errors.Is(err, ErrCorrupt)) naming the file and the offset, instead of
//     silently dropping acknowledged records. To find such a record after a
//     damaged one, whose length field cannot be trusted, Open tries every
//     byte offset up to the end of the file, checking the number and length
//     before the checksum.
//
// The next Append goes right after the last record returned (over a torn
// record or older bytes), or at offset 0 if Open returned none.
//
// A Log is used by one goroutine at a time.
package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/fencekv/fencekv/diskfault"
)

// MaxRecord is the largest payload Append accepts.
const MaxRecord = 1 << 30

const header = 16

// window bounds the numbers Open takes for records of the log: at most
// after+window. A record numbered further off is noise, not evidence of
// lost records (a log this long would be 64 GiB of headers alone).
const window = 1 << 32

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrTooLarge is returned by Append for a payload over MaxRecord.
var ErrTooLarge = errors.New("wal: record too large")

// ErrCorrupt is matched (errors.Is) by the *CorruptError Open returns.
var ErrCorrupt = errors.New("wal: the write-ahead log is corrupt")

// CorruptError is Open's error for a log that lost records it had synced:
// the run of good records stops at Offset, and a good record numbered
// above the last one read (Found, at FoundAt) comes later.
type CorruptError struct {
	Path     string
	Offset   int64  // where the run of good records stops: the damaged or missing record
	Expected uint64 // the number of the record that should be at Offset
	Found    uint64 // the number of a good record found later in the file
	FoundAt  int64  // its offset
	Reason   string // what is wrong at Offset
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("wal: %s is corrupt at offset %d: record %d should be there, but there is %s; "+
		"record %d follows at offset %d, so this is not a torn last write, and going on would lose acknowledged writes. "+
		"Restore the data dir from a backup ('fencekv check --data DIR' shows the damage)",
		e.Path, e.Offset, e.Expected, e.Reason, e.Found, e.FoundAt)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Tail is how the log read by Open ends (see the package doc).
type Tail struct {
	// Offset is where the run of records read ends: the first byte after
	// the last record read, returned or skipped.
	Offset int64
	// Torn reports that a torn record, numbered as the next one, starts at
	// Offset (and nothing numbered above it follows). Its contents are lost.
	Torn bool
	// Reason says, for people, what Open found at Offset.
	Reason string
}

// Log is an open write-ahead log.
type Log struct {
	f      *os.File
	off    int64  // where the next record goes
	size   int64  // the file's size: appends below it do not grow it
	fixed  bool   // the file system cannot preallocate: appends grow the file
	synced int64  // the records before it are synced (see Synced)
	buf    []byte // reused for appends
	faults string // the failpoints' prefix (diskfault): "wal", or SetFaultPoints'
}

// Record is a record read back by Open.
type Record struct {
	LSN     uint64
	Payload []byte
	Offset  int64 // where it starts in the file (for ReadAt)
}

// Open opens or creates the log at path, and returns it with the records
// numbered above after (the last record the caller already has, 0 for
// none), in order, and how the log ends. It fails with a *CorruptError if
// records the log once held are lost (see the package doc). The next
// Append goes after the records returned, or at offset 0 if there are none.
func Open(path string, after uint64) (*Log, []Record, Tail, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, Tail{}, fmt.Errorf("wal: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, nil, Tail{}, fmt.Errorf("wal: %w", err)
	}
	recs, tail, err := read(data, after)
	if err != nil {
		f.Close()
		if ce, ok := err.(*CorruptError); ok {
			ce.Path = path
		}
		return nil, nil, Tail{}, err
	}
	if diskfault.Enabled {
		diskfault.LogOpened(path, data) // the power-loss recorder: what is on the disk
	}
	l := &Log{f: f, faults: "wal", size: int64(len(data))}
	if len(recs) > 0 {
		l.off = tail.Offset
	}
	return l, recs, tail, nil
}

// Read reads the log at path as Open does, without opening it for writing
// or creating it (for inspection: fencekv check).
func Read(path string, after uint64) ([]Record, Tail, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, Tail{}, fmt.Errorf("wal: %w", err)
	}
	recs, tail, err := read(data, after)
	if ce, ok := err.(*CorruptError); ok {
		ce.Path = path
	}
	return recs, tail, err
}

// read parses a log's bytes as Open describes.
func read(data []byte, after uint64) ([]Record, Tail, error) {
	var recs []Record
	var prev uint64 // the last record read, skipped or returned
	off := 0
	for {
		lsn, n, ok := record(data, off)
		if !ok {
			break
		}
		if off > 0 && (lsn != prev+1 || prev == ^uint64(0)) || off == 0 && lsn > after && lsn != after+1 {
			break
		}
		if lsn > after {
			recs = append(recs, Record{LSN: lsn, Payload: data[off+header : off+header+n], Offset: int64(off)})
		}
		prev = lsn
		off += header + n
	}
	last := after
	scanFrom := 0 // where the next append goes
	if len(recs) > 0 {
		last = recs[len(recs)-1].LSN
		scanFrom = off
	}
	limit := after + window
	if limit < after {
		limit = ^uint64(0)
	}
	// Any good record numbered above the last one read, from where the
	// next append goes on, proves that records were lost.
	if at, lsn, found := findLater(data, scanFrom, last, limit); found {
		return nil, Tail{}, &CorruptError{Offset: int64(off), Expected: last + 1,
			Found: lsn, FoundAt: int64(at), Reason: describe(data, off, last)}
	}
	return recs, Tail{Offset: int64(off), Torn: torn(data, off, last), Reason: describe(data, off, last)}, nil
}

// record decodes the header at off and reports whether a whole record with
// a good checksum starts there.
func record(data []byte, off int) (lsn uint64, n int, ok bool) {
	if len(data)-off < header {
		return 0, 0, false
	}
	n64 := uint64(binary.BigEndian.Uint32(data[off:]))
	lsn = binary.BigEndian.Uint64(data[off+8:])
	if n64 > MaxRecord || n64 > uint64(len(data)-off-header) {
		return lsn, 0, false
	}
	n = int(n64)
	sum := binary.BigEndian.Uint32(data[off+4:])
	return lsn, n, crc32.Checksum(data[off+8:off+header+n], castagnoli) == sum
}

// findLater returns the first offset from from on where a good record
// numbered in (last, limit] starts. It looks at every byte offset, and
// computes a checksum only where the number and length fit.
func findLater(data []byte, from int, last, limit uint64) (at int, lsn uint64, found bool) {
	for p := from; p <= len(data)-header; p++ {
		lsn := binary.BigEndian.Uint64(data[p+8:])
		if lsn <= last || lsn > limit {
			continue
		}
		if _, _, ok := record(data, p); ok {
			return p, lsn, true
		}
	}
	return 0, 0, false
}

// torn reports whether the bytes at off begin record last+1, damaged: its
// header names it (as far as the file goes) but the record is not whole.
func torn(data []byte, off int, last uint64) bool {
	rest := data[off:]
	if len(rest) > header {
		rest = rest[:header]
	}
	if allZero(rest) {
		return false
	}
	var want [8]byte
	binary.BigEndian.PutUint64(want[:], last+1)
	if len(rest) <= 8 {
		return true // a cut header: nothing of its number to check
	}
	got := rest[8:]
	return string(got) == string(want[:len(got)])
}

// describe says what is at off, where the run of records stopped, for
// Tail.Reason and CorruptError.Reason.
func describe(data []byte, off int, last uint64) string {
	rest := len(data) - off
	switch {
	case rest == 0:
		return "the end of the file"
	case rest < header && allZero(data[off:]):
		return fmt.Sprintf("%d zero bytes to the end of the file", rest)
	case rest < header:
		return fmt.Sprintf("%d bytes, too few for a record header, to the end of the file", rest)
	case allZero(data[off : off+header]):
		return "zeros"
	}
	n := uint64(binary.BigEndian.Uint32(data[off:]))
	lsn, _, ok := record(data, off)
	switch {
	case ok && lsn <= last:
		return fmt.Sprintf("record %d, left from before the last checkpoint", lsn)
	case ok:
		return fmt.Sprintf("record %d where record %d should be", lsn, last+1)
	case lsn != last+1:
		return fmt.Sprintf("bytes that do not start record %d (its number field reads %d)", last+1, lsn)
	case n > MaxRecord:
		return fmt.Sprintf("record %d with an impossible length (%d bytes)", lsn, n)
	case n > uint64(rest-header):
		return fmt.Sprintf("record %d cut short: its length is %d bytes, the file has %d more", lsn, n, rest-header)
	}
	return fmt.Sprintf("record %d with a bad checksum", lsn)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Append writes records numbered lsn, lsn+1, ..., one per payload, after
// the last, in one write. lsn must be one more than the last record's:
// after Open, one more than the last record it returned (or than its
// after, if it returned none); after Reset, one more than the last record
// the checkpoint covered. They are not durable until Sync returns. The
// first starts at Size as it was, and each takes RecordSize of its
// payload's length.
func (l *Log) Append(lsn uint64, payloads ...[]byte) error {
	b := l.buf[:0]
	for i, p := range payloads {
		if len(p) > MaxRecord {
			return ErrTooLarge
		}
		start := len(b)
		b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
		b = binary.BigEndian.AppendUint32(b, 0) // the checksum, below
		b = binary.BigEndian.AppendUint64(b, lsn+uint64(i))
		b = append(b, p...)
		binary.BigEndian.PutUint32(b[start+4:], crc32.Checksum(b[start+8:], castagnoli))
	}
	l.buf = b
	if diskfault.Enabled {
		if err := diskfault.Hit(l.faults + ".write"); err != nil {
			return fmt.Errorf("wal: append: %w", err)
		}
		diskfault.LogWrite(l.f.Name(), l.off, int64(len(b)))
	}
	end := l.off + int64(len(b))
	if end > l.size && !l.fixed {
		l.grow(end)
	}
	if _, err := l.f.WriteAt(b, l.off); err != nil {
		return fmt.Errorf("wal: append: %w", err)
	}
	l.off = end
	l.size = max(l.size, end)
	return nil
}

// minGrow and maxGrow bound the steps the file grows by: its size so far,
// within these.
const (
	minGrow = 1 << 20
	maxGrow = 16 << 20
)

// grow extends the file past end, ahead of the appends (see the package
// doc). A file system that cannot do it gets plain appends from then on;
// any other failure (a full disk) is left to the write that follows.
func (l *Log) grow(end int64) {
	step := min(max(l.size, minGrow), maxGrow)
	size := end + step
	switch err := preallocate(l.f, l.size, size-l.size); {
	case err == nil:
		l.size = size
	case errors.Is(err, errors.ErrUnsupported):
		l.fixed = true
	}
}

// RecordSize is how many bytes of the file a record with an n-byte payload
// takes.
func RecordSize(n int) int64 { return int64(header + n) }

// SyncDir makes the creation, removal and renaming of files in dir
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Sync makes every appended record durable (fdatasync).
func (l *Log) Sync() error {
	if diskfault.Enabled {
		if err := diskfault.Hit(l.faults + ".sync"); err != nil {
			return fmt.Errorf("wal: sync: %w", err)
		}
	}
	if err := fdatasync(l.f); err != nil {
		return fmt.Errorf("wal: sync: %w", err)
	}
	if diskfault.Enabled {
		diskfault.LogSynced(l.f.Name(), l.f)
	}
	l.synced = l.off
	return nil
}

// SetFaultPoints names the log's failpoints (package diskfault, in a
// build with -tags failpoints): prefix.write and prefix.sync. A log opened
// by Open has "wal"'s; the raft log's segments set "raftlog".
func (l *Log) SetFaultPoints(prefix string) { l.faults = prefix }

// Size is the length of the records since the last Reset, in bytes.
func (l *Log) Size() int64 { return l.off }

// Synced is the length of the records, from the start of the file, that
// the last Sync (or Truncate) made durable: less than Size while records
// appended since wait for a sync.
func (l *Log) Synced() int64 { return l.synced }

// Reset starts the log over: the next record is written at the start of
// the file. Call it only once every record is reflected elsewhere (a
// checkpoint) and durable there; the next Open must be given the last
// record's number as after.
func (l *Log) Reset() {
	l.off, l.synced = 0, 0
}

// Close closes the file. It does not sync.
func (l *Log) Close() error { return l.f.Close() }

// ReadAt reads back the record at off whose payload is n bytes long (as
// Open returned it, or as Append wrote it at the Size before), checking its
// length and checksum: a record damaged since is an error that matches
// ErrCorrupt. It may run while another goroutine appends.
func (l *Log) ReadAt(off int64, n int) (lsn uint64, payload []byte, err error) {
	b := make([]byte, header+n)
	if _, err := l.f.ReadAt(b, off); err != nil {
		return 0, nil, fmt.Errorf("wal: read %s at %d: %w", l.f.Name(), off, err)
	}
	lsn, got, ok := record(b, 0)
	if !ok || got != n {
		return 0, nil, fmt.Errorf("wal: %s: the record at offset %d is damaged: %w", l.f.Name(), off, ErrCorrupt)
	}
	return lsn, b[header:], nil
}

// Truncate cuts the log at off, which must be where a record starts (or
// Size), and syncs the cut: the records from off on are gone, and the next
// Append goes at off.
func (l *Log) Truncate(off int64) error {
	if err := l.f.Truncate(off); err != nil {
		return fmt.Errorf("wal: truncate: %w", err)
	}
	if err := fdatasync(l.f); err != nil {
		return fmt.Errorf("wal: truncate: %w", err)
	}
	if diskfault.Enabled {
		diskfault.LogTruncated(l.f.Name(), l.f, off)
	}
	l.off, l.size = off, off
	l.synced = min(l.synced, off)
	return nil
}
