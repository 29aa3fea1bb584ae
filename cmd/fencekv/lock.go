package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

func lockCommand() *cli.Command {
	return &cli.Command{
		Name:  "lock",
		Usage: "acquire, renew, release and inspect locks",
		Description: `A lock is a lease with a fencing token. Pass the token with every write
you make under the lock (--token), so the store refuses your writes once
someone newer has written. For a command that should run while holding a lock,
use 'fencekv run-locked', which also keeps the lease alive.`,
		Subcommands: []*cli.Command{
			lockAcquireCommand(),
			lockRenewCommand(),
			lockReleaseCommand(),
			lockInfoCommand(),
			lockListCommand(),
		},
	}
}

func tokenArg(c *cli.Context) (fencekv.Token, error) {
	if c.IsSet("token") {
		return fencekv.Token(c.Uint64("token")), nil
	}
	if c.NArg() == 2 {
		t, err := strconv.ParseUint(c.Args().Get(1), 10, 64)
		if err != nil {
			return 0, usagef("TOKEN %q is not a number", c.Args().Get(1))
		}
		return fencekv.Token(t), nil
	}
	return 0, usagef("%s: give the lease's token with --token N (or as the second argument)", c.Command.FullName())
}

// withLease is the action of a command on one lease (NAME and --token):
// it checks the arguments and runs fn with a client.
func withLease(fn func(ctx context.Context, c *cli.Context, cl *wire.Client, name string, token fencekv.Token) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		if err := nargs(c, 1, 2); err != nil {
			return err
		}
		token, err := tokenArg(c)
		if err != nil {
			return err
		}
		name := c.Args().First()
		return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
			return fn(ctx, c, cl, name, token)
		})
	}
}

func tokenFlag() cli.Flag {
	return &cli.Uint64Flag{Name: "token", Aliases: []string{"t"}, EnvVars: []string{"FENCEKV_TOKEN"}, Usage: "the lease's `TOKEN`"}
}

func lockAcquireCommand() *cli.Command {
	return &cli.Command{
		Name:      "acquire",
		Usage:     "take a lock and print its fencing token",
		ArgsUsage: "NAME",
		UsageText: `fencekv lock acquire NAME [--ttl 10s] [--wait 0s] [--holder TEXT] [--lock-delay 0s] [--limit N]

Prints the token. The lease ends after --ttl unless renewed ('fencekv lock
renew'). With --wait, queues (first come, first served) until granted or the
wait ends; exit status 4 if the lock stays held.

Example:
  token=$(fencekv lock acquire inventory --ttl 30s)
  fencekv put inventory/sku-1 42 --token "$token"
  fencekv lock release inventory --token "$token"`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.DurationFlag{Name: "ttl", Value: 10 * time.Second, Usage: "lease length"},
			&cli.DurationFlag{Name: "wait", Usage: "queue for the lock up to this long"},
			&cli.StringFlag{Name: "holder", Usage: "a name for the holder, shown by 'lock info'"},
			&cli.DurationFlag{Name: "lock-delay", Usage: "after this lease expires (not after a release), nobody may acquire for this long"},
			limitFlag(), // semaphore.go
		}),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 1, 1); err != nil {
				return err
			}
			name := c.Args().First()
			o := &fencekv.AcquireOptions{Holder: c.String("holder"), Wait: c.Duration("wait"), LockDelay: c.Duration("lock-delay"), Limit: c.Int("limit")}
			return withClient(c, o.Wait, func(ctx context.Context, cl *wire.Client) error {
				l, err := cl.Acquire(ctx, name, c.Duration("ttl"), o)
				if err != nil {
					return refused(c, err)
				}
				return show(c, strconv.FormatUint(uint64(l.Token), 10),
					setText(map[string]any{"token": l.Token, "ttl_ms": l.TTL.Milliseconds()}, "lock", []byte(name)))
			})
		},
	}
}

func lockRenewCommand() *cli.Command {
	return &cli.Command{
		Name:      "renew",
		Usage:     "give a lease its full TTL again",
		ArgsUsage: "NAME [TOKEN]",
		UsageText: "fencekv lock renew NAME --token N\n\nGives the lease its full TTL again, from now. Safe to retry. Exit status 3 if the lease\nran out (lease_expired) or another token holds the lock (not_holder).\n\nExample:\n  fencekv lock renew inventory --token \"$token\"",
		Flags:     flags(clientFlags(), []cli.Flag{tokenFlag()}),
		Action: withLease(func(ctx context.Context, c *cli.Context, cl *wire.Client, name string, token fencekv.Token) error {
			ttl, err := cl.Renew(ctx, name, token)
			if err != nil {
				return refused(c, err)
			}
			return show(c, fmt.Sprintf("OK ttl=%v", ttl), setText(map[string]any{"token": token, "ttl_ms": ttl.Milliseconds()}, "lock", []byte(name)))
		}),
	}
}

func lockReleaseCommand() *cli.Command {
	return &cli.Command{
		Name:      "release",
		Usage:     "release a lock held by a token",
		ArgsUsage: "NAME [TOKEN]",
		UsageText: "fencekv lock release NAME --token N\n\nExit status 3 if the token does not hold the lock (any more). The next queued\nacquire, if any, gets the lock at once.\n\nExample:\n  fencekv lock release inventory --token \"$token\"",
		Flags:     flags(clientFlags(), []cli.Flag{tokenFlag()}),
		Action: withLease(func(ctx context.Context, c *cli.Context, cl *wire.Client, name string, token fencekv.Token) error {
			if err := cl.Release(ctx, name, token); err != nil {
				return refused(c, err)
			}
			return show(c, "OK released", setText(map[string]any{"token": token, "released": true}, "lock", []byte(name)))
		}),
	}
}

func lockJSON(in fencekv.LockInfo) map[string]any {
	m := map[string]any{"held": in.Held, "token": in.Token,
		"ttl_ms": in.TTL.Milliseconds(), "waiters": in.Waiters, "lock_delay_ms": in.Delay.Milliseconds()}
	return semJSON(setText(setText(m, "lock", []byte(in.Name)), "holder", []byte(in.Holder)), in) // semaphore.go
}

func lockLine(in fencekv.LockInfo) string {
	if in.Sem != nil {
		return semLine(in) // semaphore.go
	}
	if in.Held {
		s := fmt.Sprintf("%s\theld by token %d for %v", in.Name, in.Token, in.TTL.Round(time.Millisecond))
		if in.TTL <= 0 {
			// Run out; the server is applying its expiry (milliseconds).
			s = fmt.Sprintf("%s\theld by token %d, whose lease has just run out", in.Name, in.Token)
		}
		if in.Holder != "" {
			s += fmt.Sprintf(" (holder %q)", in.Holder)
		}
		if in.Waiters > 0 {
			s += fmt.Sprintf(", %d waiting", in.Waiters)
		}
		return s
	}
	s := fmt.Sprintf("%s\tfree", in.Name)
	if in.Token != 0 {
		s += fmt.Sprintf(" (last token %d)", in.Token)
	}
	if in.Delay > 0 {
		s += fmt.Sprintf(", in lock-delay for %v", in.Delay.Round(time.Millisecond))
	}
	return s
}

func lockInfoCommand() *cli.Command {
	return &cli.Command{
		Name:      "info",
		Usage:     "show who holds a lock",
		ArgsUsage: "NAME",
		UsageText: "fencekv lock info NAME [--json]\n\nShows whether the lock is held, by which token and holder, for how long more, how\nmany are queued, and any lock-delay left. For a semaphore (--limit), its limit\nand every permit held: token, time left, holder.\n\nExample:\n  fencekv lock info inventory",
		Flags:     clientFlags(),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 1, 1); err != nil {
				return err
			}
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				in, err := cl.LockInfo(ctx, c.Args().First())
				if err != nil {
					return refused(c, err)
				}
				return show(c, lockLine(in), lockJSON(in))
			})
		},
	}
}

func lockListCommand() *cli.Command {
	return &cli.Command{
		Name:      "list",
		Aliases:   []string{"ls"},
		Usage:     "list held locks by prefix",
		ArgsUsage: "[PREFIX]",
		UsageText: "fencekv lock list [PREFIX] [--limit N] [--json]\n\nExample:\n  fencekv lock list jobs/",
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.IntFlag{Name: "limit", Value: 100, Usage: "most locks to list"},
		}),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 0, 1); err != nil {
				return err
			}
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				ls, more, err := cl.Locks(ctx, c.Args().First(), "", c.Int("limit"))
				if err != nil {
					return refused(c, err)
				}
				lines := make([]string, 0, len(ls))
				list := make([]map[string]any, 0, len(ls))
				for _, in := range ls {
					lines = append(lines, lockLine(in))
					list = append(list, lockJSON(in))
				}
				// Notes, not locks, go to stderr: a pipe gets only locks.
				if len(ls) == 0 && !c.Bool("json") {
					fmt.Fprintln(c.App.ErrWriter, "(no locks held)")
					return nil
				}
				if err := show(c, strings.Join(lines, "\n"), map[string]any{"locks": list, "more": more}); err != nil {
					return err
				}
				if more && !c.Bool("json") {
					fmt.Fprintln(c.App.ErrWriter, "(more locks: raise --limit)")
				}
				return nil
			})
		},
	}
}
