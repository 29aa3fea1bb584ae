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
			if err := noArgs(c); err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			sec := clientSecurityOf(c)
			do, err := sec.dialOptions()
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
					cmd := exec.Command(self, append([]string{"verify-client"}, args...)...)
					cmd.Env = append(os.Environ(), sec.env()...) // TLS and credentials, by file
					return cmd
				},
				Dial:     do,
				Progress: c.App.ErrWriter,
			}
			if cfg.Rounds < 0 || cfg.Updates < 0 || cfg.Clients <= 0 || cfg.TTL <= 0 {
				return usagef("verify: --rounds and --updates must be >= 0, --clients and --ttl > 0")
			}
			rep, err := verify.Run(c.Context, cfg)
			if err != nil {
				err = fmt.Errorf("verify could not finish: %w", err)
			}
			if c.Bool("json") && rep != nil {
				// One object: the report, and the error if it did not finish.
				out := verifyJSON(rep)
				if err != nil {
					for k, v := range errorJSON(err) {
						out[k] = v
					}
					show(c, "", out)
					return statusError(exitCode(err))
				}
				show(c, "", out)
			} else if rep != nil {
				fmt.Fprint(c.App.Writer, rep.String())
			}
			if err != nil {
				return err
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
			do, err := clientSecurityFromEnv().dialOptions()
			if err != nil {
				return err
			}
			if code := verify.ClientMainWith(c.Args().Slice(), c.App.Reader, c.App.Writer, do); code != 0 {
				return statusError(code)
			}
			return nil
		},
	}
}

// verifyJSON is the report as --json prints it, in the CLI's style:
// snake_case names, durations in *_ms.
func verifyJSON(r *verify.Report) map[string]any {
	violations := r.Violations
	if violations == nil {
		violations = []string{}
	}
	return map[string]any{
		"ok":             r.OK(),
		"prefix":         r.Prefix,
		"rounds":         r.Rounds,
		"stale_refused":  r.StaleRefused,
		"stale_accepted": r.StaleAccepted,
		"held_refused":   r.HeldRefused,
		"held_accepted":  r.HeldAccepted,
		"updates":        r.Updates,
		"acked":          r.Acked,
		"late_attempted": r.LateAttempted,
		"late_refused":   r.LateRefused,
		"late_accepted":  r.LateAccepted,
		"counter":        r.Counter,
		"total":          r.Total,
		"violations":     violations,
		"elapsed_ms":     r.Elapsed.Milliseconds(),
	}
}
