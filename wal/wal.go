// Package wal is fencekv's write-ahead log: a file of checksummed,
// numbered records, made durable with one fdatasync per append batch.
//
// The engine appends the commands of each group commit as one record and
// syncs it before it answers any of them; the bbolt file is brought up to
// date (checkpointed) only now and then, after which the log starts over.
// After a crash, the records the bbolt file does not reflect are replayed.
//
// A record on disk is
//
//	length  uint32, big-endian: the payload's length
//	crc     uint32, big-endian: CRC-32C of lsn and payload
//	lsn     uint64, big-endian: the record's number, given by the caller
//	payload
//
// Starting over (Reset) does not truncate the file: new records overwrite
// old ones from the start, because overwriting a file's blocks and syncing
// costs less than growing it (no metadata to journal). Reading stops at the
// first record that is cut short, fails its checksum, or does not number
// one more than the record before it: a torn append (never synced, so never
// acknowledged), or records left from before the last Reset. For the last
// rule to hold, the caller numbers records with one increasing sequence that
// never restarts (fencekv uses the sequence its data file records as
// applied), so a record left from before a Reset never numbers one more
// than a newer one.
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
)

// MaxRecord is the largest payload Append accepts.
const MaxRecord = 1 << 30

const header = 16

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrTooLarge is returned by Append for a payload over MaxRecord.
var ErrTooLarge = errors.New("wal: record too large")

// Log is an open write-ahead log.
type Log struct {
	f   *os.File
	off int64  // where the next record goes
	buf []byte // reused for appends
}

// Record is a record read back by Open.
type Record struct {
	LSN     uint64
	Payload []byte
}

// Open opens or creates the log at path and returns it with the records
// since its last Reset, in order (possibly preceded by records from before
// it, which the caller recognises by their numbers). The next Append goes
// after them.
func Open(path string) (*Log, []Record, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("wal: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("wal: %w", err)
	}
	l := &Log{f: f}
	var recs []Record
	for off := 0; len(data)-off >= header; {
		n := int(binary.BigEndian.Uint32(data[off:]))
		sum := binary.BigEndian.Uint32(data[off+4:])
		lsn := binary.BigEndian.Uint64(data[off+8:])
		if n > MaxRecord || len(data)-off-header < n ||
			crc32.Checksum(data[off+8:off+header+n], castagnoli) != sum ||
			(len(recs) > 0 && lsn != recs[len(recs)-1].LSN+1) {
			break
		}
		recs = append(recs, Record{LSN: lsn, Payload: data[off+header : off+header+n]})
		off += header + n
		l.off = int64(off)
	}
	return l, recs, nil
}

// Append writes record lsn after the last. lsn must be one more than the
// last record's (any number for the first after Open or Reset, but never one
// used before). It is not durable until Sync returns.
func (l *Log) Append(lsn uint64, payload []byte) error {
	if len(payload) > MaxRecord {
		return ErrTooLarge
	}
	b := l.buf[:0]
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = binary.BigEndian.AppendUint32(b, 0) // the checksum, below
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = append(b, payload...)
	binary.BigEndian.PutUint32(b[4:], crc32.Checksum(b[8:], castagnoli))
	l.buf = b
	if _, err := l.f.WriteAt(b, l.off); err != nil {
		return fmt.Errorf("wal: append: %w", err)
	}
	l.off += int64(len(b))
	return nil
}

// Sync makes every appended record durable (fdatasync).
func (l *Log) Sync() error {
	if err := fdatasync(l.f); err != nil {
		return fmt.Errorf("wal: sync: %w", err)
	}
	return nil
}

// Size is the length of the records since the last Reset, in bytes.
func (l *Log) Size() int64 { return l.off }

// Reset starts the log over: the next record is written at the start of
// the file, and Open will not return the records before it. Call it only
// once every record is reflected elsewhere (a checkpoint) and durable there.
func (l *Log) Reset() {
	l.off = 0
}

// Close closes the file. It does not sync.
func (l *Log) Close() error { return l.f.Close() }
