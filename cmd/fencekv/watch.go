package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"unicode/utf8"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

func watchCommand() *cli.Command {
	return &cli.Command{
		Name:      "watch",
		Usage:     "print every change to keys (and locks) as it happens",
		ArgsUsage: "[PREFIX]",
		UsageText: `fencekv watch [PREFIX] [--locks] [--from REVISION] [--json]

Prints each change under PREFIX, once it is durable, one per line, in revision
order, until interrupted: puts (with the value), deletes (with the fence
that outlives them), and with --locks the grants, releases and expiries of
locks whose names start with PREFIX. It reconnects (to any --addr) and resumes
without a gap or a repeat. --from replays the changes kept since REVISION.

Example:
  fencekv watch config/ --json`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.BoolFlag{Name: "locks", Usage: "also lock grants, releases and expiries"},
			&cli.Uint64Flag{Name: "from", Usage: "replay the kept changes from `REVISION` on"},
		}),
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usagef("watch takes at most one PREFIX")
			}
			o := fencekv.WatchOptions{Prefix: []byte(c.Args().First()), Locks: c.Bool("locks"), StartRevision: fencekv.Revision(c.Uint64("from"))}
			// Until interrupted: SIGINT or SIGTERM end it cleanly (exit 0).
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			do, err := clientSecurityOf(c).dialOptions()
			if err != nil {
				return err
			}
			w, err := wire.WatchWith(ctx, splitList(c.String("addr")), o, do)
			if err != nil {
				return refused(c, dialError(err, do))
			}
			defer w.Close()
			for {
				select {
				case <-ctx.Done():
					return nil
				case b, ok := <-w.Events():
					if !ok {
						if err := w.Err(); err != nil {
							return refused(c, err)
						}
						return nil
					}
					for _, e := range b {
						if err := showEvent(c, e); err != nil {
							return err
						}
					}
				}
			}
		},
	}
}

func showEvent(c *cli.Context, e fencekv.Event) error {
	var human string
	out := map[string]any{"type": e.Type, "revision": e.Revision}
	switch e.Type {
	case "put":
		human = fmt.Sprintf("%d put %q = %q fence %d", e.Revision, e.Key, e.Value, e.Fence)
		out["key"], out["fence"] = string(e.Key), e.Fence
		if utf8.Valid(e.Value) {
			out["value"] = string(e.Value)
		} else {
			out["value_base64"] = e.Value
		}
	case "delete":
		human = fmt.Sprintf("%d delete %q fence %d", e.Revision, e.Key, e.Fence)
		out["key"], out["fence"] = string(e.Key), e.Fence
	default:
		human = fmt.Sprintf("%d %s %q token %d", e.Revision, e.Type, e.Lock, e.Token)
		out["lock"], out["token"] = e.Lock, e.Token
	}
	return show(c, human, out)
}
