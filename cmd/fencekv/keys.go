package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

func flags(groups ...[]cli.Flag) []cli.Flag {
	var out []cli.Flag
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

// nargs checks the number of positional arguments.
func nargs(c *cli.Context, min, max int) error {
	n := c.NArg()
	if n < min || n > max {
		return usagef("%s: want %s (see '%s --help')", c.Command.Name, c.Command.ArgsUsage, c.Command.HelpName)
	}
	return nil
}

// value reads a value argument; "-" means standard input.
func value(c *cli.Context, arg string) ([]byte, error) {
	if arg != "-" {
		return []byte(arg), nil
	}
	b, err := io.ReadAll(c.App.Reader)
	if err != nil {
		return nil, fmt.Errorf("reading the value from stdin: %w", err)
	}
	return b, nil
}

func writeJSON(key []byte, r fencekv.WriteResult) map[string]any {
	return setText(map[string]any{"fence": r.Fence, "revision": r.Revision}, "key", key)
}

func getCommand() *cli.Command {
	return &cli.Command{
		Name:      "get",
		Usage:     "print a key's value",
		ArgsUsage: "KEY",
		UsageText: `fencekv get KEY [--json | --raw | -o FILE]

Prints the value followed by a newline; --raw prints its bytes alone, and
-o FILE writes them to FILE, so that 'put k - < f' and 'get k -o g' (or
'get k --raw > g') copy a file exactly. A missing key prints nothing,
writes no file, and exits 6; --json shows found, fence and revision as
well (a deleted key still has its fence).

Examples:
  fencekv get config/mode
  fencekv get inventory/sku-1 --json     # value, fence and revision
  fencekv get backups/config.tar -o config.tar`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.BoolFlag{Name: "raw", Usage: "print the value's bytes alone, with no newline"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "write the value's bytes to `FILE` (\"-\": standard output) instead of printing it"},
		}),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 1, 1); err != nil {
				return err
			}
			key := []byte(c.Args().First())
			out := c.String("output")
			if c.Bool("raw") && (c.Bool("json") || c.IsSet("output")) {
				return usagef("get: --raw prints the value alone: not with --json or -o")
			}
			if c.IsSet("output") && out == "" {
				return usagef("get: -o needs a FILE (\"-\": standard output)")
			}
			if out == "-" && c.Bool("json") {
				return usagef("get: -o - and --json would both write to standard output")
			}
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				e, err := cl.Get(ctx, key)
				if err != nil {
					return refused(c, err)
				}
				if out != "" && e.Found {
					if err := writeValue(c, out, e.Value); err != nil {
						return err
					}
				}
				if c.Bool("json") {
					out := setText(map[string]any{"found": e.Found, "fence": e.Fence, "revision": e.Revision}, "key", key)
					if e.Found {
						setText(out, "value", e.Value)
					} else {
						out["value"] = nil // an empty value is "": a missing key has none
					}
					if err := show(c, "", out); err != nil {
						return err
					}
				} else if e.Found && out != "" {
					// written to the file
				} else if e.Found && c.Bool("raw") {
					if _, err := c.App.Writer.Write(e.Value); err != nil {
						return err
					}
				} else if e.Found {
					fmt.Fprintf(c.App.Writer, "%s\n", e.Value)
				} else {
					fmt.Fprintf(c.App.ErrWriter, "fencekv: %q not found (fence %d)\n", key, e.Fence)
				}
				if !e.Found {
					return statusError(exitNotFound)
				}
				return nil
			})
		},
	}
}

// writeValue writes a value's bytes to path, or to standard output for
// "-".
func writeValue(c *cli.Context, path string, v []byte) error {
	if path == "-" {
		_, err := c.App.Writer.Write(v)
		return err
	}
	if err := os.WriteFile(path, v, 0o666); err != nil {
		return fmt.Errorf("get: -o: %w", err)
	}
	return nil
}

func putCommand() *cli.Command {
	return &cli.Command{
		Name:      "put",
		Usage:     "write a value (fenced with --token)",
		ArgsUsage: "KEY VALUE|-",
		UsageText: `fencekv put KEY VALUE [--token N] [--strict] [--lock NAME]
fencekv put KEY - < file        (the value from standard input)

Examples:
  fencekv put config/mode blue
  fencekv put inventory/sku-1 42 --token 34          # refused if the key's fence is above 34
  fencekv put inventory/sku-1 42 --token 34 --lock inventory   # and only while lock 'inventory' is held by 34`,
		Flags: flags(clientFlags(), writeFlags()),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 2, 2); err != nil {
				return err
			}
			key := []byte(c.Args().Get(0))
			val, err := value(c, c.Args().Get(1))
			if err != nil {
				return err
			}
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				r, err := cl.Put(ctx, key, val, writeOptions(c))
				if err != nil {
					return refused(c, err)
				}
				return show(c, fmt.Sprintf("OK fence=%d revision=%d", r.Fence, r.Revision), writeJSON(key, r))
			})
		},
	}
}

func delCommand() *cli.Command {
	return &cli.Command{
		Name:      "del",
		Aliases:   []string{"delete"},
		Usage:     "delete a key (its fence stays)",
		ArgsUsage: "KEY",
		UsageText: "fencekv del KEY [--token N] [--strict] [--lock NAME]\n\nThe key's fence survives the delete: later writes with older tokens are still refused.\n\nExample:\n  fencekv del inventory/sku-1 --token \"$token\"",
		Flags:     flags(clientFlags(), writeFlags()),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 1, 1); err != nil {
				return err
			}
			key := []byte(c.Args().First())
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				deleted, r, err := cl.Delete(ctx, key, writeOptions(c))
				if err != nil {
					return refused(c, err)
				}
				word := "deleted"
				if !deleted {
					word = "not found"
				}
				out := writeJSON(key, r)
				out["deleted"] = deleted
				return show(c, fmt.Sprintf("OK %s fence=%d revision=%d", word, r.Fence, r.Revision), out)
			})
		},
	}
}

func casCommand() *cli.Command {
	return &cli.Command{
		Name:      "cas",
		Usage:     "write a value if the key is at a revision (0: absent)",
		ArgsUsage: "KEY REVISION VALUE|-",
		UsageText: "fencekv cas KEY REVISION VALUE [--token N] [--strict] [--lock NAME]\n\nExample: fencekv cas config/mode 0 blue    # create only if absent",
		Flags:     flags(clientFlags(), writeFlags()),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 3, 3); err != nil {
				return err
			}
			key := []byte(c.Args().Get(0))
			rev, err := strconv.ParseUint(c.Args().Get(1), 10, 64)
			if err != nil {
				return usagef("cas: REVISION %q is not a number", c.Args().Get(1))
			}
			val, err := value(c, c.Args().Get(2))
			if err != nil {
				return err
			}
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				r, err := cl.CAS(ctx, key, fencekv.Revision(rev), val, writeOptions(c))
				if err != nil {
					return refused(c, err)
				}
				return show(c, fmt.Sprintf("OK fence=%d revision=%d", r.Fence, r.Revision), writeJSON(key, r))
			})
		},
	}
}

func incrCommand() *cli.Command {
	return &cli.Command{
		Name:      "incr",
		Usage:     "add to an integer value (a missing key counts as 0)",
		ArgsUsage: "KEY [DELTA]",
		UsageText: "fencekv incr KEY [DELTA] [--token N] [--strict] [--lock NAME]\n\nDELTA defaults to 1 and may be negative: fencekv incr stock -5",
		Flags:     flags(clientFlags(), writeFlags()),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 1, 2); err != nil {
				return err
			}
			key := []byte(c.Args().Get(0))
			delta := int64(1)
			if c.NArg() == 2 {
				d, err := strconv.ParseInt(c.Args().Get(1), 10, 64)
				if err != nil {
					return usagef("incr: DELTA %q is not a 64-bit integer", c.Args().Get(1))
				}
				delta = d
			}
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				n, r, err := cl.Incr(ctx, key, delta, writeOptions(c))
				if err != nil {
					return refused(c, err)
				}
				out := writeJSON(key, r)
				out["value"] = n
				return show(c, fmt.Sprintf("%d", n), out)
			})
		},
	}
}

func scanCommand() *cli.Command {
	return &cli.Command{
		Name:      "scan",
		Usage:     "list keys by prefix, in byte order",
		ArgsUsage: "[PREFIX]",
		UsageText: `fencekv scan [PREFIX] [--after KEY | --start KEY] [--limit N] [--json]

Lists live keys in byte order with their values, fences and revisions, at most
--limit of them (100). When more keys follow, it says so on stderr (with --json:
"more": true); page on with --after and the last key listed, which lists the
keys after it (--start lists from a key on, that key included).

Examples:
  fencekv scan inventory/
  fencekv scan inventory/ --after inventory/sku-5 --limit 10 --json`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.StringFlag{Name: "after", Usage: "list the keys after `KEY` (the last of the previous page)"},
			&cli.StringFlag{Name: "start", Usage: "first `KEY` to list (inclusive)"},
			&cli.IntFlag{Name: "limit", Value: 100, Usage: "most keys to list"},
		}),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 0, 1); err != nil {
				return err
			}
			o := fencekv.ScanOptions{Prefix: []byte(c.Args().First()), Limit: c.Int("limit")}
			switch {
			case c.IsSet("after") && c.IsSet("start"):
				return usagef("scan: give --after or --start, not both")
			case c.IsSet("after"):
				// The first key after K in byte order is K followed by a
				// zero byte.
				o.Start = append([]byte(c.String("after")), 0)
			case c.String("start") != "":
				o.Start = []byte(c.String("start"))
			}
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				items, more, err := cl.Scan(ctx, o)
				if err != nil {
					return refused(c, err)
				}
				var b strings.Builder
				list := make([]map[string]any, 0, len(items))
				for _, it := range items {
					fmt.Fprintf(&b, "%s\t%s\t(fence %d, revision %d)\n", it.Key, it.Value, it.Fence, it.Revision)
					m := setText(map[string]any{"fence": it.Fence, "revision": it.Revision}, "key", it.Key)
					list = append(list, setText(m, "value", it.Value))
				}
				if len(items) == 0 && !c.Bool("json") {
					// A note, not a key: on stderr, so that a pipe gets nothing.
					fmt.Fprintln(c.App.ErrWriter, "(no keys)")
					return nil
				}
				if err := show(c, strings.TrimSuffix(b.String(), "\n"), map[string]any{"items": list, "more": more}); err != nil {
					return err
				}
				if more && !c.Bool("json") {
					fmt.Fprintf(c.App.ErrWriter, "(more keys after %q: raise --limit, or page on with --after %q)\n", items[len(items)-1].Key, items[len(items)-1].Key)
				}
				return nil
			})
		},
	}
}
