package kv

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
)

// Limits of the storage itself: a key (or lock name) and a record must fit
// bbolt's. The engine refuses options above them at start, so that a
// command can never fail in the storage for its size.
const (
	MaxKeySize   = bolt.MaxKeySize
	MaxValueSize = bolt.MaxValueSize - recHeader
)

// Snapshot is a consistent read-only copy of the data file as of the last
// Checkpoint. It may be written out concurrently with the writer; it holds
// a bbolt read transaction until Close.
type Snapshot struct {
	tx *bolt.Tx
}

// Snapshot begins a Snapshot of the file. Checkpoint first: what the
// writer holds is not in it.
func (s *Store) Snapshot() (*Snapshot, error) {
	tx, err := s.db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("kv: snapshot: %w", err)
	}
	return &Snapshot{tx: tx}, nil
}

// Size is the snapshot's length in bytes.
func (s *Snapshot) Size() int64 { return s.tx.Size() }

// WriteTo writes the whole data file, as of the snapshot, to w.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) { return s.tx.WriteTo(w) }

// Close ends the snapshot. It is safe to call more than once.
func (s *Snapshot) Close() error {
	err := s.tx.Rollback()
	if errors.Is(err, bolt.ErrTxClosed) {
		return nil
	}
	return err
}

// Restore replaces the data file at path with the snapshot read from r. It
// writes a temporary file beside it, syncs it, checks it as Open does
// (every page walked before bbolt maps it, the schema), and only then
// renames it into place, so a
// truncated or foreign stream leaves the old file as it was. The file must
// not be open.
func Restore(path string, r io.Reader) error {
	tmp := path + ".restore"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("kv: restore: %w", err)
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var st *Store
		if st, err = Open(tmp, Options{}); err == nil {
			err = st.Close()
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("kv: restore: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
