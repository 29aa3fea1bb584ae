package fencekv

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/wal"
)

// CheckReport is what fencekv check found in a data dir.
type CheckReport struct {
	Dir  string         `json:"data_dir"`
	OK   bool           `json:"ok"`
	Data DataFileReport `json:"data_file"`
	Log  LogReport      `json:"log"`
}

type DataFileReport struct {
	Path      string `json:"path"`
	OK        bool   `json:"ok"`
	Error     string `json:"error,omitempty"` // what is damaged
	Applied   uint64 `json:"applied"`         // the last log record the file reflects
	Revision  uint64 `json:"revision"`
	LastToken uint64 `json:"last_token"`
	LiveKeys  uint64 `json:"live_keys"`
	Keys      int    `json:"key_records"`
	Locks     int    `json:"lock_records"`
	Pages     int    `json:"pages"`
	PageSize  int    `json:"page_size"`
}

type LogReport struct {
	Path    string `json:"path"`
	Checked bool   `json:"checked"` // false: the data file is damaged, so where the log starts is unknown
	Exists  bool   `json:"exists"`
	OK      bool   `json:"ok"`
	Records int    `json:"records"` // records after the data file's checkpoint
	First   uint64 `json:"first,omitempty"`
	Last    uint64 `json:"last,omitempty"`
	End     int64  `json:"end_offset"` // where the records end
	Torn    bool   `json:"torn"`       // a torn last record starts at end_offset
	EndWhat string `json:"end,omitempty"`
	Error   string `json:"error,omitempty"` // corruption: what and where
	Offset  *int64 `json:"corrupt_offset,omitempty"`
}

// Check checks the data file and the write-ahead log of the data dir dir,
// read-only (fencekv check), holding the data file's lock (shared)
// throughout: every page of the data file, bbolt's consistency check, the
// schema and counters; and the log records after the data file's
// checkpoint, with how the log ends (clean, a torn last append, or
// corruption and where). It returns an error only when the dir cannot be
// checked: missing, unreadable, or in use by a server.
func Check(dir string) (*CheckReport, error) {
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("data dir %s is not a directory", dir)
	}
	rep := &CheckReport{Dir: dir}
	rep.Data.Path = filepath.Join(dir, DataFile)
	rep.Log.Path = filepath.Join(dir, LogFile)
	_, err := kv.Check(rep.Data.Path, func(r kv.Report) error {
		rep.Data = DataFileReport{Path: rep.Data.Path, OK: true, Applied: r.Applied, Revision: uint64(r.Revision),
			LastToken: uint64(r.LastToken), LiveKeys: r.LiveKeys, Keys: r.Keys, Locks: r.Locks, Pages: r.Pages, PageSize: r.PageSize}
		rep.Log.Checked = true
		return checkLog(&rep.Log, r.Applied)
	})
	switch {
	case err == nil:
	case errors.Is(err, kv.ErrLocked):
		return nil, fmt.Errorf("data dir %s is in use by a running fencekv server: stop it first (check reads the files as they are on disk)", dir)
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("no data file in %s (%s): not a fencekv data dir, or never opened", dir, DataFile)
	case errors.Is(err, kv.ErrDamaged), errors.Is(err, kv.ErrSchema):
		rep.Data.Error = err.Error()
	default:
		return nil, err
	}
	rep.OK = rep.Data.OK && rep.Log.OK
	return rep, nil
}

// checkLog reads the log after the data file's applied record.
func checkLog(lr *LogReport, applied uint64) error {
	recs, tail, err := wal.Read(lr.Path, applied)
	var ce *wal.CorruptError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		lr.OK = true // nothing written since the last checkpoint; the server creates it
		return nil
	case errors.As(err, &ce):
		lr.Exists = true
		lr.Error, lr.Offset = err.Error(), &ce.Offset
		return nil
	case err != nil:
		return err
	}
	lr.Exists, lr.OK = true, true
	lr.Records = len(recs)
	if len(recs) > 0 {
		lr.First, lr.Last = recs[0].LSN, recs[len(recs)-1].LSN
	}
	lr.End, lr.Torn, lr.EndWhat = tail.Offset, tail.Torn, tail.Reason
	return nil
}
