package main

import (
	"fmt"
	"os"
	"os/exec"

	"github.com/fencekv/fencekv/verify"
	"github.com/urfave/cli/v2"
)

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name:  "verify",
		Usage: "prove fencing against a live server with real process pauses",
		UsageText: `fencekv verify [--addr ADDR[,ADDR...]] [--rounds 100] [--ttl 2s] [--clients 4] [--updates 200]

Runs against a live server, or every node of a cluster (--addr a,b,c), and
exits non-zero if any stale write was accepted. Against a cluster it goes on
through failovers: a call answered unavailable, or whose connection broke, is
retried on the next node, and an update whose outcome a failover left unknown
is counted as such (its counter may or may not include it):

 1. Pause injection with real processes: a client process acquires a lock and is
    stopped with SIGSTOP before its write, for longer than the TTL. In even
    rounds a newer holder acquires and writes, then the paused client resumes
    and writes with its old token: it must be refused (stale_token). In odd
    rounds nobody acquires, and the resumed client's held write must be refused
    (lease_expired).
 2. Inventory: --clients clients take one lock, read a counter, pause (some
    past the TTL) and update it with a fenced incr or a held read-modify-write
    put. Each counter must equal exactly its acknowledged updates.

Scratch keys and locks live under verify/<random>/ and are deleted at the end
(deleted keys keep their fences; expired lock records go after 10 minutes).`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.IntFlag{Name: "rounds", Value: verify.Defaults.Rounds, Usage: "pause-injection rounds"},
			&cli.DurationFlag{Name: "ttl", Value: verify.Defaults.TTL, Usage: "lease length of the rounds and the inventory run"},
			&cli.IntFlag{Name: "clients", Value: verify.Defaults.Clients, Usage: "inventory clients, and pause rounds run at once"},
			&cli.IntFlag{Name: "updates", Value: verify.Defaults.Updates, Usage: "inventory updates"},
		}),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("verify takes no arguments")
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			cfg := verify.Config{
				Addr:    c.String("addr"),
				Rounds:  c.Int("rounds"),
				TTL:     c.Duration("ttl"),
				Clients: c.Int("clients"),
				Updates: c.Int("updates"),
				Client: func(args []string) *exec.Cmd {
					return exec.Command(self, append([]string{"verify-client"}, args...)...)
				},
				Progress: c.App.ErrWriter,
			}
			if cfg.Rounds < 0 || cfg.Updates < 0 || cfg.Clients <= 0 || cfg.TTL <= 0 {
				return usagef("verify: --rounds and --updates must be >= 0, --clients and --ttl > 0")
			}
			rep, err := verify.Run(c.Context, cfg)
			if rep != nil && c.Bool("json") {
				show(c, "", rep)
			} else if rep != nil {
				fmt.Fprint(c.App.Writer, rep.String())
			}
			if err != nil {
				return fmt.Errorf("verify could not finish: %w", err)
			}
			if !rep.OK() {
				return statusError(exitViolation)
			}
			return nil
		},
	}
}

// verifyClientCommand is the paused client that verify re-executes; it is
// hidden from help.
func verifyClientCommand() *cli.Command {
	return &cli.Command{
		Name:            "verify-client",
		Hidden:          true,
		SkipFlagParsing: true,
		Action: func(c *cli.Context) error {
			if code := verify.ClientMain(c.Args().Slice(), c.App.Reader, c.App.Writer); code != 0 {
				return statusError(code)
			}
			return nil
		},
	}
}
