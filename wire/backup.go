package wire

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"sync"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// Online backup (PROTOCOL.md, backup and backup_read): `backup` takes a
// consistent copy of the store, tied to the connection; `backup_read`
// returns it in chunks of BackupChunk bytes, in order. The copy is
// released when its last byte has been read, when another backup is
// started, or when the connection closes. A connection holds at most one
// backup, and the connection's reader serves backup_read itself (like
// the reads), so a connection holds at most its pending budget plus one
// chunk of it in memory.

// BackupChunk is the most bytes one backup_read answer carries.
const BackupChunk = 1 << 20

// backupSource is an engine that can take a consistent copy of its
// store (a *fencekv.DB, a cluster node).
type backupSource interface {
	Backup(ctx context.Context) (*fencekv.Backup, error)
}

// connBackup is a connection's open backup.
type connBackup struct {
	mu  sync.Mutex // guards the fields: backup runs in a handler, backup_read in the reader
	b   *fencekv.Backup
	pos int64       // bytes read so far
	sum hash.Hash32 // CRC-32C of them
	buf []byte      // one chunk, reused
}

// release closes the open backup, if any.
func (cb *connBackup) release() {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	cb.closeLocked()
}

func (cb *connBackup) closeLocked() {
	if cb.b != nil {
		cb.b.Close()
		cb.b, cb.buf, cb.sum = nil, nil, nil
	}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// backupMethod, backupReadMethod and forwardingMethod are the
// connection's own methods (methods.go).
func (c *conn) backupMethod(ctx context.Context, eng Engine, _ *args, e *encoder) error {
	return c.backup(ctx, eng, e)
}

func (c *conn) backupReadMethod(_ context.Context, _ Engine, a *args, e *encoder) error {
	return c.backupRead(a, e)
}

func (c *conn) forwardingMethod(_ context.Context, _ Engine, _ *args, e *encoder) error {
	e.EncodeMapLen(0) // serveRequest has marked the connection
	return nil
}

func (c *conn) backup(ctx context.Context, eng Engine, e *encoder) error {
	src, ok := eng.(backupSource)
	if !ok {
		return &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "this server cannot take backups"}
	}
	// A new backup replaces the connection's previous one.
	c.bk.release()
	b, err := src.Backup(ctx)
	if err != nil {
		return err
	}
	c.bk.mu.Lock()
	c.bk.closeLocked() // another backup call raced this one: the last one wins
	c.bk.b, c.bk.pos, c.bk.sum = b, 0, crc32.New(castagnoli)
	c.bk.mu.Unlock()
	e.EncodeMapLen(5)
	e.uint("size", uint64(b.Size))
	e.uint("index", b.Index)
	e.uint("last_token", uint64(b.LastToken))
	e.uint("revision", uint64(b.Revision))
	e.uint("chunk_size", BackupChunk)
	return nil
}

func (c *conn) backupRead(a *args, e *encoder) error {
	if err := need(a, fOffset); err != nil {
		return err
	}
	cb := &c.bk
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.b == nil {
		return badRequest("no backup is open on this connection: call backup first")
	}
	if a.offset != uint64(cb.pos) {
		return badRequest("backup_read at offset %d: the backup is read in order, and its next byte is at %d", a.offset, cb.pos)
	}
	n := min(int64(BackupChunk), cb.b.Size-cb.pos)
	if cb.buf == nil {
		cb.buf = make([]byte, min(int64(BackupChunk), cb.b.Size))
	}
	buf := cb.buf[:n]
	if _, err := io.ReadFull(cb.b, buf); err != nil {
		cb.closeLocked()
		return &fencekv.Error{Code: fencekv.CodeUnavailable, Message: fmt.Sprintf("backup: reading the copy at offset %d: %v", a.offset, err)}
	}
	cb.sum.Write(buf)
	cb.pos += n
	done := cb.pos == cb.b.Size
	if done {
		e.EncodeMapLen(3)
	} else {
		e.EncodeMapLen(2)
	}
	e.bin("data", buf)
	e.bool("done", done)
	if done {
		e.uint("crc32c", uint64(cb.sum.Sum32()))
		cb.closeLocked()
	}
	return nil
}

// Backup starts an online backup of the server's store: a consistent copy
// that holds every write acknowledged before the call (on a cluster node
// too). Read it to the end (its bytes are a complete data file, Size of
// them), then Close it. The last chunk is checked against the server's
// checksum: a mismatch is an error in place of io.EOF. A Client reads one
// backup at a time: starting another releases the first on the server.
func (c *Client) Backup(ctx context.Context) (*fencekv.Backup, error) {
	b := &fencekv.Backup{}
	err := c.do(ctx, "backup", nil, func(dec *msgpack.Decoder) error {
		return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
			var v uint64
			switch k {
			case "size":
				err = decodeTo(dec, &v)
				b.Size = int64(v)
			case "index":
				err = decodeTo(dec, &b.Index)
			case "last_token":
				err = decodeTo(dec, (*uint64)(&b.LastToken))
			case "revision":
				err = decodeTo(dec, (*uint64)(&b.Revision))
			default:
				err = dec.Skip()
			}
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	if b.Size < 0 {
		return nil, fmt.Errorf("wire: backup: the server announced %d bytes", b.Size)
	}
	b.ReadCloser = &backupReader{c: c, ctx: ctx, size: b.Size, sum: crc32.New(castagnoli)}
	return b, nil
}

// backupReader reads a backup's chunks with backup_read.
type backupReader struct {
	c    *Client
	ctx  context.Context
	size int64
	pos  int64
	sum  hash.Hash32
	buf  []byte // the rest of the last chunk
	err  error  // sticky: io.EOF once checked, or the failure
}

func (r *backupReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.err = r.next()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// next reads the next chunk into buf, or sets the end.
func (r *backupReader) next() error {
	if r.pos == r.size {
		return io.EOF
	}
	var (
		data []byte
		done bool
		crc  uint64
		got  bool
	)
	err := r.c.do(r.ctx, "backup_read", func(p params) error {
		p.EncodeMapLen(1)
		p.uint("offset", uint64(r.pos))
		return nil
	}, func(dec *msgpack.Decoder) error {
		return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
			switch k {
			case "data":
				data, err = dec.DecodeBytes()
			case "done":
				done, err = dec.DecodeBool()
			case "crc32c":
				err = decodeTo(dec, &crc)
				got = true
			default:
				err = dec.Skip()
			}
			return err
		})
	})
	if err != nil {
		return err
	}
	r.sum.Write(data)
	r.pos += int64(len(data))
	r.buf = data
	switch {
	case r.pos > r.size:
		return fmt.Errorf("wire: backup: the server sent %d bytes of a %d-byte backup", r.pos, r.size)
	case done != (r.pos == r.size):
		return fmt.Errorf("wire: backup: the server ended the backup at %d of %d bytes", r.pos, r.size)
	case len(data) == 0 && !done:
		return errors.New("wire: backup: the server sent an empty chunk")
	case done && (!got || uint32(crc) != r.sum.Sum32()):
		return errors.New("wire: backup: the copy received does not match the server's checksum")
	}
	return nil
}

// Close stops reading; the server releases the backup when the
// connection starts another or closes.
func (r *backupReader) Close() error {
	if r.err == nil {
		r.err = errors.New("wire: backup: closed")
	}
	return nil
}
