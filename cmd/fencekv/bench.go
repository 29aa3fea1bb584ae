package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/bench"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

func benchCommand() *cli.Command {
	d := bench.DefaultConfig()
	return &cli.Command{
		Name:  "bench",
		Usage: "measure a server's throughput and latency under load",
		UsageText: `fencekv bench [--addr ADDR] [--workload NAME] [--clients N] [--duration 10s] [options]

Runs a closed-loop load against a server: --clients clients, each on a
connection of its own with one request at a time, for --warmup and then
--duration. Prints ops/s, latency percentiles (p50, p99, p99.9, max) and, for
the contended workload, grants per client and Jain's fairness index. A status
line goes to stderr once a second (--quiet turns it off). Exit status 1 if
any op failed.

Workloads:
  fenced-put  each client takes a lock of its own once, then puts to its own
              key with that lock's token
  lock-cycle  acquire the client's own lock, put with its token, release
  contended   every client queues for ONE lock: acquire (waiting), put with
              the token, release; reports grants/s and fairness
  get         read a random key of --keys preloaded keys
  mixed       --get-percent gets, the rest fenced puts to the client's share
              of the keys

Keys and locks are named under --prefix; runs reuse the keys (fences only
grow) and use new lock names each time. For the same workloads against etcd
and Redis, see bench/peers ('make bench-peers').

Example:
  fencekv bench --workload lock-cycle --clients 64 --duration 10s --json`,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "addr", Value: DefaultAddr, EnvVars: []string{"FENCEKV_ADDR"}, Usage: "server `ADDRESS` (host:port); a cluster's nodes, comma-separated, spread the clients over them"},
			&cli.StringFlag{Name: "workload", Aliases: []string{"w"}, Value: string(d.Workload), Usage: "fenced-put, lock-cycle, contended, get or mixed"},
			&cli.IntFlag{Name: "clients", Aliases: []string{"c"}, Value: d.Clients, Usage: "concurrent clients, one connection each"},
			&cli.DurationFlag{Name: "duration", Aliases: []string{"d"}, Value: d.Duration, Usage: "measured time"},
			&cli.DurationFlag{Name: "warmup", Value: d.Warmup, Usage: "unmeasured time before it"},
			&cli.IntFlag{Name: "value-size", Value: d.ValueSize, Usage: "bytes per value written"},
			&cli.IntFlag{Name: "keys", Value: d.Keys, Usage: "keys preloaded and read by get and mixed"},
			&cli.IntFlag{Name: "get-percent", Value: d.GetPercent, Usage: "mixed: share of gets, 0..100"},
			&cli.DurationFlag{Name: "ttl", Value: d.TTL, Usage: "lease of every lock taken"},
			&cli.DurationFlag{Name: "wait", Value: d.Wait, Usage: "contended: longest wait for the lock"},
			&cli.StringFlag{Name: "prefix", Value: d.Prefix, Usage: "`PREFIX` of every key and lock name used"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON (latencies in microseconds)"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no status line on stderr"},
			&cli.StringFlag{Name: "cpu-profile", Usage: "write a CPU profile of the load generator to `FILE` (for performance work on the client)"},
		}, clientSecurityFlags()...), // security.go
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			wl, err := bench.ParseWorkload(c.String("workload"))
			if err != nil {
				return usageError{err}
			}
			cfg := bench.Config{
				Workload:   wl,
				Clients:    c.Int("clients"),
				Duration:   c.Duration("duration"),
				Warmup:     c.Duration("warmup"),
				ValueSize:  c.Int("value-size"),
				Keys:       c.Int("keys"),
				GetPercent: c.Int("get-percent"),
				TTL:        c.Duration("ttl"),
				Wait:       c.Duration("wait"),
				Prefix:     c.String("prefix"),
			}
			if !c.Bool("quiet") {
				cfg.Progress = c.App.ErrWriter
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			stopProfile, err := startCPUProfile(c.String("cpu-profile"))
			if err != nil {
				return err
			}
			defer stopProfile()
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			do, err := clientSecurityOf(c).dialOptions()
			if err != nil {
				return err
			}
			return runBench(ctx, c.String("addr"), do, cfg, c.Bool("json"), c.App.Writer)
		},
	}
}

// runBench runs one benchmark against the server at addr and prints its
// result. An interrupt (ctx ending) stops the run early; what was measured
// is still printed.
func runBench(ctx context.Context, addr string, do *wire.DialOptions, cfg bench.Config, asJSON bool, out io.Writer) error {
	hint := func(err error) error {
		return fmt.Errorf("%w (is 'fencekv serve' running at %s? set --addr or FENCEKV_ADDR)", err, addr)
	}
	count, err := bench.CountCommitsWith(ctx, addr, do)
	if denied := err; errors.Is(denied, fencekv.ErrPermissionDenied) {
		// status needs admin: run without the group-commit figures.
		count, err = func(context.Context) (bench.Commits, error) { return bench.Commits{}, denied }, nil
	}
	if err != nil {
		return hint(err)
	}
	res, err := bench.Run(ctx, bench.DialFencekvWith(addr, do), cfg)
	if err != nil && res.Clients == 0 {
		return hint(err)
	}
	var gc *bench.Commits
	if c, cerr := count(context.WithoutCancel(ctx)); cerr == nil {
		gc = &c
	}
	if err == nil && res.Errors > 0 {
		err = fmt.Errorf("%d ops failed, the first: %s", res.Errors, res.FirstError)
	}
	if asJSON {
		// One object: the result, and the error's code and message if
		// the run failed (see errorJSON).
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		v := struct {
			bench.Result
			GroupCommit *bench.Commits `json:"group_commit,omitempty"`
			Error       any            `json:"error,omitempty"`
			Message     any            `json:"message,omitempty"`
		}{Result: res, GroupCommit: gc}
		if err != nil {
			e := errorJSON(err)
			v.Error, v.Message = e["error"], e["message"]
		}
		if jerr := enc.Encode(v); jerr != nil {
			return jerr
		}
		if err != nil {
			return statusError(exitCode(err))
		}
		return nil
	}
	printBench(out, addr, res, gc)
	return err
}

func printBench(w io.Writer, addr string, r bench.Result, gc *bench.Commits) {
	l := r.Latency
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }
	note := ""
	if r.Interrupted {
		note = " (interrupted)"
	}
	fmt.Fprintf(w, "%s against %s: %d clients, %v measured%s, %d-byte values\n", r.Workload, addr, r.Clients, r.Elapsed.Round(time.Millisecond), note, r.ValueSize)
	what := "ops/s"
	if r.Workload == bench.Contended {
		what = "grants/s"
	}
	fmt.Fprintf(w, "  throughput  %.0f %s (%d ops, %d errors)\n", r.OpsPerSec, what, r.Ops, r.Errors)
	fmt.Fprintf(w, "  latency     p50 %s  p99 %s  p99.9 %s  max %s  mean %s\n", ms(l.P50), ms(l.P99), ms(l.P999), ms(l.Max), ms(l.Mean))
	if r.Workload == bench.Contended {
		fmt.Fprintf(w, "  grants      %d..%d per client, Jain's fairness %.4f\n", r.GrantsMin, r.GrantsMax, r.Fairness)
	}
	if gc != nil && gc.Commits > 0 {
		fmt.Fprintf(w, "  commits     %d commands in %d transactions, %.1f per commit (whole run, warm-up included)\n", gc.Commands, gc.Commits, gc.PerTx)
	}
}
