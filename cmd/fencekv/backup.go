package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

// DefaultHTTPAddr is where `fencekv serve` serves /metrics, /healthz and
// /readyz unless told otherwise.
const DefaultHTTPAddr = "127.0.0.1:7480"

func backupCommand() *cli.Command {
	return &cli.Command{
		Name:  "backup",
		Usage: "copy a running server's store into a backup file",
		UsageText: `fencekv backup [--addr ADDR] FILE

Takes a consistent copy of the store from a running server (a single node, or
any node of a cluster) while it keeps serving, and writes it to FILE: the data
file between a header (index, last token, revision, size) and a checksum. Every
write acknowledged before the backup started is in it. FILE is written beside
itself and renamed into place once complete and synced; an existing FILE is
not overwritten. Restore it with 'fencekv restore'.

The server needs free disk space for one more copy of its data file while the
backup runs.

Example:
  fencekv backup --addr 127.0.0.1:7420 /backups/fencekv-$(date +%F).fkvb`,
		Flags: append(clientFlags(), &cli.DurationFlag{Name: "backup-timeout", Value: time.Hour, Usage: "give up on the whole backup after this long"}),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("backup takes one FILE, got %q (see 'fencekv backup --help')", c.Args().Slice())
			}
			file := c.Args().First()
			if _, err := os.Lstat(file); err == nil {
				return usagef("%s exists: choose a new file", file)
			}
			return withClient(c, c.Duration("backup-timeout"), func(ctx context.Context, cl *wire.Client) error {
				start := time.Now()
				b, err := cl.Backup(ctx)
				if err != nil {
					return refused(c, err)
				}
				defer b.Close()
				if err := writeBackupFile(file, b); err != nil {
					return err
				}
				d := time.Since(start)
				return show(c, fmt.Sprintf("backup of %s written to %s: %d bytes of data file at index %d, last token %d, revision %d, in %v",
					cl.Addr(), file, b.Size, b.Index, uint64(b.LastToken), uint64(b.Revision), d.Round(time.Millisecond)),
					map[string]any{"file": file, "size": b.Size, "index": b.Index, "last_token": uint64(b.LastToken),
						"revision": uint64(b.Revision), "ms": d.Milliseconds()})
			})
		},
	}
}

// writeBackupFile writes the backup beside file, syncs it, and renames it
// into place: file appears only whole.
func writeBackupFile(file string, b *fencekv.Backup) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), filepath.Base(file)+".part-*")
	if err != nil {
		return err
	}
	err = fencekv.WriteBackup(tmp, fencekv.BackupInfo{Index: b.Index, LastToken: b.LastToken, Revision: b.Revision, Size: b.Size}, b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// Link, not rename: it fails rather than replace a file that
		// appeared meanwhile.
		err = os.Link(tmp.Name(), file)
	}
	os.Remove(tmp.Name())
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if d, err := os.Open(filepath.Dir(file)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

func restoreCommand() *cli.Command {
	return &cli.Command{
		Name:  "restore",
		Usage: "build a new data dir from a backup file (offline)",
		UsageText: `fencekv restore FILE --data DIR [--token-gap N]

Checks FILE whole (header, length, checksum, then every page of the data file)
and builds a data dir from it in DIR, which must not exist or be empty. Nothing
runs on DIR meanwhile: start 'fencekv serve --data DIR' afterwards. A damaged or
truncated backup is refused (exit 7) and DIR is left as it was.

Tokens never go back (G1): the old store may have issued tokens after the backup
was taken, so the restored store's token sequence is moved --token-gap past the
backup's last token (default 2^40); every token it issues is above that. Set the
gap above the number of tokens the old store can have issued since the backup.

A cluster is seeded from one restored dir: start its node alone with
--bootstrap-expect 1 (it puts the restored state into the raft log once it
leads), then start the other nodes on empty data dirs with --join.

Examples:
  fencekv restore /backups/fencekv-2025-01-31.fkvb --data /var/lib/fencekv
  fencekv restore backup.fkvb --data ./n0 && fencekv serve --node n0 --data ./n0 ... --bootstrap-expect 1`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "data", EnvVars: []string{"FENCEKV_DATA"}, Usage: "data `DIR` to build (new or empty; required)"},
			&cli.Uint64Flag{Name: "token-gap", Value: fencekv.DefaultTokenGap, Usage: "move the token sequence this far past the backup's last token"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON, for scripts"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("restore takes one FILE, got %q (see 'fencekv restore --help')", c.Args().Slice())
			}
			if c.String("data") == "" {
				return usagef("restore needs --data DIR, the data dir to build (see 'fencekv restore --help')")
			}
			if c.Uint64("token-gap") == 0 {
				return usagef("--token-gap must be positive")
			}
			res, err := fencekv.Restore(c.Args().First(), c.String("data"), c.Uint64("token-gap"))
			if errors.Is(err, fencekv.ErrBadBackup) {
				fmt.Fprintf(c.App.ErrWriter, "fencekv: %v\n", err)
				return statusError(exitViolation)
			}
			if err != nil {
				return err
			}
			return show(c, fmt.Sprintf("restored %s into %s: index %d, revision %d; tokens moved from %d to %d (the next token issued is %d)",
				c.Args().First(), c.String("data"), res.Backup.Index, uint64(res.Backup.Revision), uint64(res.Backup.LastToken),
				uint64(res.LastToken), uint64(res.LastToken)+1),
				map[string]any{"data": c.String("data"), "index": res.Backup.Index, "revision": uint64(res.Backup.Revision),
					"backup_last_token": uint64(res.Backup.LastToken), "last_token": uint64(res.LastToken)})
		},
	}
}
