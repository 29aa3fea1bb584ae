package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/wal"
	"github.com/urfave/cli/v2"
)

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "check a data dir's files for damage, without changing them",
		UsageText: `fencekv check [--data DIR] [--json]

Reads the data dir of a stopped server and changes nothing:
  - the data file (fencekv.db): every page, bbolt's consistency check, the schema,
    the counters and every key record;
  - the write-ahead log (fencekv.wal): the records after the data file's last
    checkpoint, and how the log ends: cleanly; with a torn last record (a write
    cut short by a crash, never acknowledged, which the next start drops); or
    corrupt (a damaged or missing record with records after it: acknowledged
    writes are lost, and the server refuses to start).

It refuses while a server has the dir open (stop it first). Exit status: 0 sound
(a torn last record included), 7 damaged, 1 the dir could not be checked.
What it cannot find: a flipped bit in a value (bbolt keeps no checksums of data).

Examples:
  fencekv check --data /var/lib/fencekv
  fencekv check --data ./fencekv-data --json | jq .log`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "data", Value: "./fencekv-data", EnvVars: []string{"FENCEKV_DATA"}, Usage: "data `DIR` to check"},
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON, for scripts"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("check takes no arguments, got %q (see 'fencekv check --help')", c.Args().Slice())
			}
			rep, err := checkDir(c.String("data"))
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if err := show(c, "", rep); err != nil {
					return err
				}
			} else {
				rep.write(c.App.Writer)
			}
			if !rep.OK {
				return statusError(exitViolation)
			}
			return nil
		},
	}
}

// checkReport is what fencekv check found in a data dir.
type checkReport struct {
	Dir  string         `json:"data_dir"`
	OK   bool           `json:"ok"`
	Data dataFileReport `json:"data_file"`
	Log  logCheckReport `json:"log"`
}

type dataFileReport struct {
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

type logCheckReport struct {
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

// checkDir checks the data file and the log of dir, read-only, holding the
// data file's lock (shared) throughout. It returns an error only when the
// dir cannot be checked: missing, unreadable, or in use by a server.
func checkDir(dir string) (*checkReport, error) {
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("data dir %s is not a directory", dir)
	}
	rep := &checkReport{Dir: dir}
	rep.Data.Path = filepath.Join(dir, fencekv.DataFile)
	rep.Log.Path = filepath.Join(dir, fencekv.LogFile)
	_, err := kv.Check(rep.Data.Path, func(r kv.Report) error {
		rep.Data = dataFileReport{Path: rep.Data.Path, OK: true, Applied: r.Applied, Revision: uint64(r.Revision),
			LastToken: uint64(r.LastToken), LiveKeys: r.LiveKeys, Keys: r.Keys, Locks: r.Locks, Pages: r.Pages, PageSize: r.PageSize}
		rep.Log.Checked = true
		return checkLog(&rep.Log, r.Applied)
	})
	switch {
	case err == nil:
	case errors.Is(err, kv.ErrLocked):
		return nil, fmt.Errorf("data dir %s is in use by a running fencekv server: stop it first (check reads the files as they are on disk)", dir)
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("no data file in %s (%s): not a fencekv data dir, or never opened", dir, fencekv.DataFile)
	case errors.Is(err, kv.ErrDamaged), errors.Is(err, kv.ErrSchema):
		rep.Data.Error = err.Error()
	default:
		return nil, err
	}
	rep.OK = rep.Data.OK && rep.Log.OK
	return rep, nil
}

// checkLog reads the log after the data file's applied record.
func checkLog(lr *logCheckReport, applied uint64) error {
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

// write prints the report for people.
func (r *checkReport) write(w io.Writer) {
	fmt.Fprintf(w, "fencekv check %s\n", r.Dir)
	d := r.Data
	if d.OK {
		fmt.Fprintf(w, "data file %s: ok: %d pages of %d bytes; %d live keys (%d key records), %d lock records; revision %d, last token %d; checkpointed up to log record %d\n",
			d.Path, d.Pages, d.PageSize, d.LiveKeys, d.Keys, d.Locks, d.Revision, d.LastToken, d.Applied)
	} else {
		fmt.Fprintf(w, "data file %s: DAMAGED: %s\n", d.Path, d.Error)
	}
	l := r.Log
	switch {
	case !l.Checked:
		fmt.Fprintf(w, "write-ahead log %s: not checked: where it starts is recorded in the data file\n", l.Path)
	case !l.Exists:
		fmt.Fprintf(w, "write-ahead log %s: ok: none (nothing written since the last checkpoint)\n", l.Path)
	case l.Error != "":
		fmt.Fprintf(w, "write-ahead log %s: CORRUPT: %s\n", l.Path, l.Error)
	default:
		recs := "no records after the checkpoint"
		if l.Records > 0 {
			recs = fmt.Sprintf("%d records after the checkpoint (%d to %d)", l.Records, l.First, l.Last)
		}
		end := fmt.Sprintf("clean end at offset %d (%s)", l.End, l.EndWhat)
		if l.Torn {
			end = fmt.Sprintf("torn last record at offset %d (%s): a write cut short by a crash, never acknowledged; the next start drops it", l.End, l.EndWhat)
		}
		fmt.Fprintf(w, "write-ahead log %s: ok: %s; %s\n", l.Path, recs, end)
	}
	if r.OK {
		fmt.Fprintln(w, "OK")
		return
	}
	fmt.Fprintln(w, "DAMAGED: a server refuses to start on this dir; restore it from a backup (README.md: \"The data dir\")")
}
