package main

// 'fencekv elect' and 'fencekv leader': leader election (wire/PROTOCOL.md
// §12) from the shell. elect runs a command while leading, with the
// child-process machinery of run-locked (runlocked.go).

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

func electCommand() *cli.Command {
	return &cli.Command{
		Name:      "elect",
		Usage:     "run a command while leading an election; campaign again when leadership is lost",
		ArgsUsage: "NAME -- COMMAND [ARGS...]",
		UsageText: `fencekv elect NAME [--value V] [--ttl 10s] [--grace 3s] [--once] [--lost-status 3] -- COMMAND [ARGS...]

Campaigns for the election NAME (the lock NAME; candidates lead in the order
they queued), and runs COMMAND while leading, with FENCEKV_TOKEN (the epoch),
FENCEKV_LOCK (NAME), FENCEKV_VALUE and FENCEKV_ADDR in its environment. The
leadership is a lease, renewed while the command runs, exactly as run-locked
keeps its lock: if it may be lost, the command's process group gets SIGTERM
--grace before the lease may run out (SIGKILL after --grace), and elect
campaigns again (with --once, it exits with --lost-status instead). When the
command ends, elect resigns (the next candidate leads at once) and exits with
the command's status. 128+N: signal N came while campaigning. If elect dies,
even by kill -9, the command's process group is stopped and the next
candidate leads once the TTL has passed.

--value is what 'fencekv leader NAME' shows (default host:pid); give each
candidate its own.

With --json, elect prints its report as one JSON object on stderr once it
exits, as run-locked does.

The command should pass the epoch with its writes, so that a deposed leader's
are refused:
  fencekv elect nightly-report --value "$(hostname)" -- \
    sh -c 'fencekv put reports/latest "$(date)" --lock nightly-report --token "$FENCEKV_TOKEN"'`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.StringFlag{Name: "value", Usage: "the leader's value shown to others, 1-4096 bytes (default host:pid)"},
			&cli.DurationFlag{Name: "ttl", Value: 10 * time.Second, Usage: "leadership lease length (renewed every third of it, less --grace)"},
			&cli.DurationFlag{Name: "grace", Value: 3 * time.Second, Usage: "after SIGTERM, wait this long before SIGKILL; on a lost leadership the command gets SIGTERM this long before the lease may run out (shorter than --ttl; by default 3s, or a third of --ttl if less)"},
			&cli.BoolFlag{Name: "once", Usage: "exit (with --lost-status) when leadership is lost, rather than campaign again"},
			&cli.IntFlag{Name: "lost-status", Value: exitFenced, Usage: "with --once, exit `STATUS` when leadership may have been lost and the command was stopped (1-255)"},
		}),
		Action: elect,
	}
}

func elect(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) < 2 {
		return usagef("elect: want NAME -- COMMAND [ARGS...]")
	}
	name, argv := args[0], args[1:]
	if argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return usagef("elect: no command to run after --")
	}
	value := c.String("value")
	if !c.IsSet("value") {
		host, _ := os.Hostname()
		value = host + ":" + strconv.Itoa(os.Getpid())
	}
	lostStatus := c.Int("lost-status")
	if lostStatus < 1 || lostStatus > 255 {
		return usagef("elect: --lost-status %d: want 1 to 255", lostStatus)
	}
	ttl, grace := c.Duration("ttl"), c.Duration("grace")
	if !c.IsSet("grace") {
		grace = min(grace, ttl/3)
	}
	if grace < 0 || grace >= ttl {
		return usagef("elect: --grace %v: want 0 or more, and shorter than --ttl (%v): on a lost leadership the command gets SIGTERM --grace before the lease may run out", grace, ttl)
	}
	o := &fencekv.CampaignOptions{Margin: grace}
	if grace == 0 {
		o.Margin = -1 // none
	}
	if err := fencekv.CheckCampaign(name, value, ttl, o); err != nil {
		return usagef("elect: %v", err)
	}
	// Signals while leading go to the command.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	ctx := c.Context
	report := map[string]any{}
	setText(report, "lock", []byte(name))
	do, err := clientSecurityOf(c).dialOptions()
	if err != nil {
		return runLockedResult(c, report, err)
	}
	cl, err := dial(ctx, c, do)
	if err != nil {
		return runLockedResult(c, report, err)
	}
	defer cl.Close()
	for {
		wctx, begin, stopWait := waitInterrupts(ctx)
		l, err := cl.Campaign(wctx, name, value, ttl, o)
		if err != nil {
			stopWait()
			return childResult(c, "elect", name, report, wctx, err, lostStatus)
		}
		report["token"] = l.Token
		if cause := begin(); cause != nil {
			// Signalled as leadership was won: resign unused.
			resign(l)
			stopWait()
			return childResult(c, "elect", name, report, wctx, cause, lostStatus)
		}
		if !c.Bool("json") {
			fmt.Fprintf(c.App.ErrWriter, "fencekv: elect %s: leading with epoch %d as %q\n", name, l.Token, value)
		}
		err = runChild(l.Context(), c, l.Lease, argv, sigs, grace, "FENCEKV_VALUE="+value)
		resign(l)
		stopWait()
		var ce *childExit
		if !c.Bool("once") && asChildExit(err, &ce) && ce.lost != nil {
			fmt.Fprintf(c.App.ErrWriter, "fencekv: elect %s: %v; campaigning again\n", name, ce)
			continue
		}
		return childResult(c, "elect", name, report, wctx, err, lostStatus)
	}
}

func asChildExit(err error, ce **childExit) bool {
	e, ok := err.(*childExit)
	if ok {
		*ce = e
	}
	return ok
}

// resign gives a leadership up, within 5s (a server that does not answer:
// the lease then runs out on its own).
func resign(l *fencekv.Leadership) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.Resign(ctx)
}

func leaderCommand() *cli.Command {
	return &cli.Command{
		Name:      "leader",
		Usage:     "show an election's leader (its value and epoch), or follow it with --watch",
		ArgsUsage: "NAME",
		UsageText: `fencekv leader NAME [--watch] [--json]

Shows who leads the election NAME (see 'fencekv elect'): the leader's value and
epoch (the lock's token), or that nobody leads. With --watch, prints the
current state and then each change, one line (or JSON object) each, until
interrupted; leaders that come and go between two reads may be coalesced,
but epochs only rise and the latest state is always shown.

Example:
  fencekv leader nightly-report --watch`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.BoolFlag{Name: "watch", Usage: "follow the changes until interrupted"},
		}),
		Action: func(c *cli.Context) error {
			if err := nargs(c, 1, 1); err != nil {
				return err
			}
			name := c.Args().First()
			if name == "" {
				return usagef("leader: the election name is empty")
			}
			if !c.Bool("watch") {
				return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
					l, err := cl.Leader(ctx, name)
					if err != nil {
						return refused(c, err)
					}
					return show(c, leaderLine(l), leaderJSON(l))
				})
			}
			// Until interrupted: SIGINT or SIGTERM end it cleanly (exit 0).
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			do, err := clientSecurityOf(c).dialOptions()
			if err != nil {
				return err
			}
			cl, err := dial(ctx, c, do)
			if err != nil {
				return err
			}
			defer cl.Close()
			obs, err := cl.Observe(ctx, name)
			if err != nil {
				return refused(c, err)
			}
			for l := range obs {
				if err := show(c, leaderLine(l), leaderJSON(l)); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func leaderJSON(l fencekv.Leader) map[string]any {
	m := map[string]any{"held": l.Held, "epoch": l.Token, "ttl_ms": l.TTL.Milliseconds()}
	return setText(setText(m, "election", []byte(l.Name)), "value", []byte(l.Value))
}

func leaderLine(l fencekv.Leader) string {
	if !l.Held {
		if l.Token != 0 {
			return fmt.Sprintf("%s\tno leader (last epoch %d)", l.Name, l.Token)
		}
		return fmt.Sprintf("%s\tno leader", l.Name)
	}
	if l.TTL <= 0 {
		return fmt.Sprintf("%s\tled by %q, epoch %d, whose lease has just run out", l.Name, l.Value, l.Token)
	}
	return fmt.Sprintf("%s\tled by %q, epoch %d, for %v", l.Name, l.Value, l.Token, l.TTL.Round(time.Millisecond))
}
