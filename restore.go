package fencekv

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/wal"
)

// A backup file (what `fencekv backup` writes and `fencekv restore`
// reads) is a data file between a header and a trailer:
//
//	header, 48 bytes, big-endian:
//	  0  magic "FKVBACKU"
//	  8  version uint32 (1)
//	 12  CRC-32C (Castagnoli) of the header with these 4 bytes zero
//	 16  index uint64: the log index the copy reflects
//	 24  last token uint64, as of the copy
//	 32  revision uint64, as of the copy
//	 40  size uint64: bytes of data file that follow
//	data: the bbolt data file, size bytes
//	trailer, 12 bytes:
//	  0  CRC-32C of the data, uint32
//	  4  magic "FKVBEND\n"
//
// A file whose length is not 48 + size + 12 is cut short (or has bytes
// appended); a checksum that does not match is damage. Either is refused
// before anything is restored.
const (
	backupMagic       = "FKVBACKU"
	backupEndMagic    = "FKVBEND\n"
	backupVersion     = 1
	backupHeaderSize  = 48
	backupTrailerSize = 12
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// BackupInfo describes a backup file.
type BackupInfo struct {
	Index     uint64
	LastToken Token
	Revision  Revision
	Size      int64 // bytes of data file
}

// WriteBackup writes a backup file to w: the header for info, info.Size
// bytes of data file read from data, and the trailer with their checksum.
func WriteBackup(w io.Writer, info BackupInfo, data io.Reader) error {
	h := make([]byte, backupHeaderSize)
	copy(h, backupMagic)
	binary.BigEndian.PutUint32(h[8:], backupVersion)
	binary.BigEndian.PutUint64(h[16:], info.Index)
	binary.BigEndian.PutUint64(h[24:], uint64(info.LastToken))
	binary.BigEndian.PutUint64(h[32:], uint64(info.Revision))
	binary.BigEndian.PutUint64(h[40:], uint64(info.Size))
	binary.BigEndian.PutUint32(h[12:], crc32.Checksum(h, castagnoli))
	if _, err := w.Write(h); err != nil {
		return err
	}
	sum := crc32.New(castagnoli)
	n, err := io.Copy(io.MultiWriter(w, sum), io.LimitReader(data, info.Size))
	if err != nil {
		return err
	}
	if n != info.Size {
		return fmt.Errorf("backup: the data file ended after %d of %d bytes", n, info.Size)
	}
	t := make([]byte, backupTrailerSize)
	binary.BigEndian.PutUint32(t, sum.Sum32())
	copy(t[4:], backupEndMagic)
	_, err = w.Write(t)
	return err
}

// ErrBadBackup matches (errors.Is) every refusal of a backup file that is
// damaged, cut short, or not a backup file.
var ErrBadBackup = errors.New("not a sound fencekv backup")

type badBackup struct{ msg string }

func (e *badBackup) Error() string        { return e.msg }
func (e *badBackup) Is(target error) bool { return target == ErrBadBackup }

func badBackupf(format string, args ...any) error {
	return &badBackup{fmt.Sprintf(format, args...)}
}

// ReadBackupHeader reads and checks a backup file's header, and checks
// that the file (of fileSize bytes) is as long as the header says.
func ReadBackupHeader(r io.Reader, fileSize int64) (BackupInfo, error) {
	h := make([]byte, backupHeaderSize)
	if _, err := io.ReadFull(r, h); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return BackupInfo{}, badBackupf("the file is cut short: %d bytes, less than a backup's header", fileSize)
		}
		return BackupInfo{}, err
	}
	if string(h[:8]) != backupMagic {
		return BackupInfo{}, badBackupf("not a fencekv backup file (no backup header)")
	}
	if v := binary.BigEndian.Uint32(h[8:]); v != backupVersion {
		return BackupInfo{}, badBackupf("backup format version %d; this fencekv reads version %d", v, backupVersion)
	}
	want := binary.BigEndian.Uint32(h[12:])
	binary.BigEndian.PutUint32(h[12:], 0)
	if crc32.Checksum(h, castagnoli) != want {
		return BackupInfo{}, badBackupf("the backup's header is damaged (checksum mismatch)")
	}
	info := BackupInfo{
		Index:     binary.BigEndian.Uint64(h[16:]),
		LastToken: Token(binary.BigEndian.Uint64(h[24:])),
		Revision:  Revision(binary.BigEndian.Uint64(h[32:])),
	}
	size := binary.BigEndian.Uint64(h[40:])
	if size > math.MaxInt64-backupHeaderSize-backupTrailerSize {
		return BackupInfo{}, badBackupf("the backup's header is damaged (size %d)", size)
	}
	info.Size = int64(size)
	if whole := backupHeaderSize + info.Size + backupTrailerSize; fileSize != whole {
		if fileSize < whole {
			return info, badBackupf("the file is cut short: %d bytes, its header says %d", fileSize, whole)
		}
		return info, badBackupf("the file has %d bytes after the backup's end: not one whole backup", fileSize-whole)
	}
	return info, nil
}

// checkedData reads a backup's data, then checks its trailer: at the end
// it returns io.EOF only if the checksum matches.
type checkedData struct {
	r    io.Reader // the file after the header
	left int64     // data bytes not yet read
	sum  hash.Hash32
}

func (c *checkedData) Read(p []byte) (int, error) {
	if c.left == 0 {
		t := make([]byte, backupTrailerSize)
		if _, err := io.ReadFull(c.r, t); err != nil {
			return 0, badBackupf("the file is cut short: no trailer after the data")
		}
		if string(t[4:]) != backupEndMagic || binary.BigEndian.Uint32(t) != c.sum.Sum32() {
			return 0, badBackupf("the backup is damaged: its data does not match its checksum")
		}
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.sum.Write(p[:n])
	c.left -= int64(n)
	if errors.Is(err, io.EOF) {
		if c.left > 0 {
			return n, badBackupf("the file is cut short in its data")
		}
		err = nil
	}
	return n, err
}

// DefaultTokenGap is how far Restore moves the token sequence past the
// backup's last token: 2^40, more than a server issuing a million tokens a
// second issues in 12 days.
const DefaultTokenGap = 1 << 40

// RestoreResult says what Restore built.
type RestoreResult struct {
	Backup    BackupInfo
	LastToken Token // the restored store's token sequence: the next token issued is above it
}

// RestoredFile is the file Restore leaves in a data dir beside the data
// file. A cluster node started on the dir seeds a new cluster from it (it
// must be started alone, with --bootstrap-expect 1); a single node
// ignores it.
const RestoredFile = "restored"

// Restore builds a new data dir from a backup file, offline. dir must not
// exist or be empty. The file is checked whole (header, length, checksum,
// then the data file page by page) before it is put in place, so a
// damaged or truncated backup is refused with ErrBadBackup and leaves dir
// empty.
//
// G1 across a restore: the old store may have issued tokens after the
// backup was taken, which the backup cannot know. So the restored store's
// token sequence is moved gap past the backup's last token: the next token
// it issues is above last token + gap. Choose gap above the number of
// tokens the old store can have issued since the backup.
//
// The restored data file starts a new log: its applied index and term are
// reset to 0, so a single node starts a new write-ahead log on it and a
// cluster node a new raft log.
func Restore(file, dir string, gap uint64) (RestoreResult, error) {
	var res RestoreResult
	if gap == 0 {
		return res, errors.New("restore: the token gap must be positive")
	}
	if err := emptyDir(dir); err != nil {
		return res, err
	}
	f, err := os.Open(file)
	if err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	br := bufio.NewReaderSize(f, 1<<20)
	info, err := ReadBackupHeader(br, fi.Size())
	if err != nil {
		return res, fmt.Errorf("restore %s: %w", file, err)
	}
	res.Backup = info
	created := false
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		created = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, fmt.Errorf("restore: data dir: %w", err)
	}
	path := filepath.Join(dir, DataFile)
	fail := func(err error) (RestoreResult, error) {
		os.Remove(path)
		os.Remove(filepath.Join(dir, RestoredFile))
		if created {
			os.Remove(dir)
		}
		return res, err
	}
	if err := kv.Restore(path, &checkedData{r: br, left: info.Size, sum: crc32.New(castagnoli)}); err != nil {
		if errors.Is(err, ErrBadBackup) {
			return fail(fmt.Errorf("restore %s: %w", file, errors.Unwrap(err)))
		}
		return fail(fmt.Errorf("restore %s: %w", file, err))
	}
	last, err := raiseTokens(path, gap)
	if err != nil {
		return fail(fmt.Errorf("restore %s: %w", file, err))
	}
	res.LastToken = last
	if err := os.WriteFile(filepath.Join(dir, RestoredFile), []byte(fmt.Sprintf(
		"restored from a backup at index %d; tokens moved from %d to %d\n", info.Index, info.LastToken, last)), 0o600); err != nil {
		return fail(fmt.Errorf("restore: %w", err))
	}
	if err := wal.SyncDir(dir); err != nil {
		return fail(fmt.Errorf("restore: %w", err))
	}
	return res, nil
}

// raiseTokens moves the data file's token sequence gap past its last
// token, and resets its log marks, in one checkpoint.
func raiseTokens(path string, gap uint64) (Token, error) {
	st, err := kv.Open(path, kv.Options{})
	if err != nil {
		return 0, err
	}
	w, err := st.Writer()
	if err != nil {
		st.Close()
		return 0, err
	}
	last := w.LastToken()
	if uint64(last) > math.MaxUint64-gap {
		st.Close()
		return 0, fmt.Errorf("the backup's last token %d plus the gap %d overflows the token sequence", last, gap)
	}
	floor := last + Token(gap)
	w.RaiseToken(floor)
	st.Publish()
	if err := st.Checkpoint(kv.Marks{}); err != nil {
		st.Close()
		return 0, err
	}
	return floor, st.Close()
}

// emptyDir refuses a dir that exists and holds anything.
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("restore: data dir: %w", err)
	case len(ents) > 0:
		return fmt.Errorf("restore: data dir %s is not empty: restore only into a new or empty dir", dir)
	}
	return nil
}
