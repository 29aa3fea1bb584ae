package fencekv

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"testing"
)

// FuzzReadBackup: a backup file's bytes, whatever they are, either read
// through (header, data, trailer: the checksum matches) or are refused as
// ErrBadBackup, never a panic, a hang or another error; what reads through
// writes back to the same bytes.
func FuzzReadBackup(f *testing.F) {
	for _, data := range [][]byte{nil, []byte("a data file"), bytes.Repeat([]byte{7}, 5000)} {
		var b bytes.Buffer
		info := BackupInfo{Index: 9, LastToken: 33, Revision: 12, Size: int64(len(data))}
		if err := WriteBackup(&b, info, bytes.NewReader(data)); err != nil {
			f.Fatal(err)
		}
		f.Add(b.Bytes())
	}
	f.Add([]byte(backupMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		info, err := ReadBackupHeader(r, int64(len(b)))
		if err != nil {
			if !errors.Is(err, ErrBadBackup) {
				t.Fatalf("header refused with %v; want ErrBadBackup", err)
			}
			return
		}
		data, err := io.ReadAll(&checkedData{r: r, left: info.Size, sum: crc32.New(castagnoli)})
		if err != nil {
			if !errors.Is(err, ErrBadBackup) {
				t.Fatalf("data refused with %v; want ErrBadBackup", err)
			}
			return
		}
		var again bytes.Buffer
		if err := WriteBackup(&again, info, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again.Bytes(), b) {
			t.Fatalf("a backup that read through writes back differently")
		}
	})
}
