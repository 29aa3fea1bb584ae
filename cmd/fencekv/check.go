package main

import (
	"fmt"
	"io"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster"
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
    writes are lost, and the server refuses to start);
  - on a cluster node, raft's log (raft-log/): every entry's checksum, and that
    its segments follow one another, with the same three ways to end.

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
			if err := noArgs(c); err != nil {
				return err
			}
			rep, err := fencekv.Check(c.String("data"))
			if err != nil {
				return err
			}
			raftLog := cluster.CheckLog(c.String("data")) // nil but on a cluster node
			if raftLog != nil && !raftLog.OK {
				rep.OK = false
			}
			if c.Bool("json") {
				out := struct {
					*fencekv.CheckReport
					RaftLog *cluster.LogReport `json:"raft_log,omitempty"`
				}{rep, raftLog}
				if err := show(c, "", out); err != nil {
					return err
				}
			} else {
				writeCheckReport(c.App.Writer, rep, raftLog)
			}
			if !rep.OK {
				return statusError(exitViolation)
			}
			return nil
		},
	}
}

// writeCheckReport prints the report for people; raftLog is nil but for a
// cluster node's data dir.
func writeCheckReport(w io.Writer, r *fencekv.CheckReport, raftLog *cluster.LogReport) {
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
		end := fmt.Sprintf("a clean end at offset %d (after it: %s; not a next record)", l.End, l.EndWhat)
		if l.EndWhat == "the end of the file" {
			end = fmt.Sprintf("a clean end at offset %d, the end of the file", l.End)
		}
		if l.Torn {
			end = fmt.Sprintf("torn last record at offset %d (%s): a write cut short by a crash, never acknowledged; the next start drops it", l.End, l.EndWhat)
		}
		fmt.Fprintf(w, "write-ahead log %s: ok: %s; %s\n", l.Path, recs, end)
	}
	switch rl := raftLog; {
	case rl == nil:
	case !rl.OK:
		fmt.Fprintf(w, "raft log %s: CORRUPT: %s\n", rl.Dir, rl.Error)
	default:
		entries := "no entries"
		if rl.Entries > 0 {
			entries = fmt.Sprintf("%d entries (%d to %d)", rl.Entries, rl.First, rl.Last)
		}
		end := "a clean end"
		if rl.Torn {
			end = "a torn last entry: a write cut short by a crash, never acknowledged; the next start drops it"
		}
		fmt.Fprintf(w, "raft log %s: ok: %d segments, %s; %s\n", rl.Dir, rl.Segments, entries, end)
	}
	if r.OK {
		fmt.Fprintln(w, "OK")
		return
	}
	fmt.Fprintln(w, "DAMAGED: a server refuses to start on this dir; restore it from a backup (README.md: \"The data dir\")")
}
