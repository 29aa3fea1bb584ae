package fencekv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/fencekv/fencekv/state"
)

// Backup is a consistent copy of a store being read out: a complete data
// file, Size bytes, as of log index Index. Read it to the end, then Close
// it; until then it holds a copy of the data file on disk.
type Backup struct {
	Index     uint64   // the log index it reflects (the raft index on a cluster node)
	LastToken Token    // the highest token issued as of the copy
	Revision  Revision // the store's revision as of the copy
	Size      int64    // bytes of data file to read

	io.ReadCloser
}

// Backup takes a consistent copy of the store while it keeps serving:
// every command acknowledged before the call is in it. The batch leader
// checkpoints and opens a snapshot in its turn; the snapshot is then copied
// into an unlinked temporary file in the data dir (so the data file's read
// transaction ends as soon as the copy is made, and a crash leaves nothing
// behind), which the Backup reads from. It needs free disk space for one
// more data file.
func (db *DB) Backup(ctx context.Context) (*Backup, error) {
	f, err := os.CreateTemp(filepath.Dir(db.m.Path()), ".backup-*")
	if err != nil {
		return nil, errorf(CodeUnavailable, "backup: %v", err)
	}
	// Unlinked at once: its space is freed when it is closed, or when the
	// process dies.
	os.Remove(f.Name())
	var (
		snap *state.Snapshot
		st   Status
	)
	err = db.inTurn(ctx, func() error {
		if err := db.failure(); err != nil {
			return errorf(CodeUnavailable, "the store failed: %v", err)
		}
		if err := db.checkpoint(); err != nil {
			db.fail(err)
			return err
		}
		s, err := db.m.Snapshot()
		if err != nil {
			return err
		}
		// Nothing is applied after the snapshot before the turn ends:
		// the published counters are the snapshot's.
		c, err := db.m.Counters()
		if err != nil {
			s.Close()
			return err
		}
		st.Counters = c
		snap = s
		return nil
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	size := snap.Size()
	_, err = snap.WriteTo(f)
	snap.Close()
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, errorf(CodeUnavailable, "backup: copying the data file: %v", err)
	}
	return &Backup{Index: snap.Index, LastToken: st.LastToken, Revision: st.Revision, Size: size, ReadCloser: f}, nil
}

// Ready reports whether the DB serves writes: nil, or why not (it is
// closed, or a failed commit put it in its failed state).
func (db *DB) Ready(ctx context.Context) error {
	db.qmu.Lock()
	closed := db.closed
	db.qmu.Unlock()
	if closed {
		return errors.New("the store is closed")
	}
	if err := db.failure(); err != nil {
		return fmt.Errorf("the store failed and refuses writes until restart: %v", err)
	}
	return nil
}
