package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

func runLockedCommand() *cli.Command {
	return &cli.Command{
		Name:      "run-locked",
		Usage:     "run a command while holding a lock (like flock(1), distributed)",
		ArgsUsage: "NAME -- COMMAND [ARGS...]",
		UsageText: `fencekv run-locked NAME [--ttl 10s] [--wait 30s] [--grace 10s] -- COMMAND [ARGS...]

Acquires NAME (queueing up to --wait), runs COMMAND with FENCEKV_TOKEN,
FENCEKV_LOCK and FENCEKV_ADDR in its environment, and renews the lease while it
runs. If the lease may be lost (a renew is refused, or none succeeded within the
TTL), the command is sent SIGTERM, then SIGKILL after --grace, and run-locked
exits 3. When the command ends, the lock is released and run-locked exits with
the command's status. Exit 4: the lock stayed held for all of --wait.

The command should pass the token with its writes, so the store refuses them
if it is ever too late:
  fencekv run-locked nightly-report --ttl 30s -- \
    sh -c 'fencekv put reports/latest "$(date)" --token "$FENCEKV_TOKEN"'`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.DurationFlag{Name: "ttl", Value: 10 * time.Second, Usage: "lease length (renewed every third of it)"},
			&cli.DurationFlag{Name: "wait", Value: 30 * time.Second, Usage: "queue for the lock up to this long"},
			&cli.DurationFlag{Name: "grace", Value: 10 * time.Second, Usage: "after SIGTERM, wait this long before SIGKILL"},
			&cli.StringFlag{Name: "holder", Usage: "holder name shown by 'lock info' (default host:pid)"},
		}),
		Action: runLocked,
	}
}

// childExit is how the child ended.
type childExit struct {
	status int
	lost   error // the lease was lost and the child was stopped
}

func (e *childExit) Error() string {
	if e.lost != nil {
		return fmt.Sprintf("lease lost, command stopped: %v", e.lost)
	}
	return fmt.Sprintf("command exited with status %d", e.status)
}

func runLocked(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) < 2 {
		return usagef("run-locked: want NAME -- COMMAND [ARGS...]")
	}
	name, argv := args[0], args[1:]
	if argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return usagef("run-locked: no command to run after --")
	}
	holder := c.String("holder")
	if holder == "" {
		host, _ := os.Hostname()
		holder = host + ":" + strconv.Itoa(os.Getpid())
	}
	// Signals to run-locked go to the child; the lock is released after.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	ctx := c.Context
	do, err := clientSecurityOf(c).dialOptions()
	if err != nil {
		return err
	}
	cl, err := dialAny(ctx, splitList(c.String("addr")), do)
	if err != nil {
		return dialError(err)
	}
	defer cl.Close()
	lo := &wire.LockOptions{AcquireOptions: fencekv.AcquireOptions{Wait: c.Duration("wait"), Holder: holder}}
	// The server bounds the wait (wait_ms); from the grant on, the lease's
	// own context governs.
	err = cl.WithLock(ctx, name, c.Duration("ttl"), lo, func(lctx context.Context, l fencekv.Lease) error {
		return runChild(lctx, c, l, argv, sigs)
	})
	var ce *childExit
	switch {
	case errors.As(err, &ce) && ce.lost != nil:
		fmt.Fprintf(c.App.ErrWriter, "fencekv: run-locked %s: %v\n", name, ce)
		return statusError(exitFenced)
	case errors.As(err, &ce):
		return statusError(ce.status)
	case err != nil:
		return refused(c, err)
	}
	return nil
}

// runChild runs argv with the lease in its environment until it exits, or
// until ctx ends because the lease may be lost; then it stops the child.
func runChild(ctx context.Context, c *cli.Context, l fencekv.Lease, argv []string, sigs <-chan os.Signal) error {
	// Under a guard (guard.go): if run-locked dies, even by SIGKILL, the
	// command's whole process group is stopped, so that a job never
	// outlives the process that holds its lock.
	cmd, err := guardCommand(c.Duration("grace"), argv)
	if err != nil {
		fmt.Fprintf(c.App.ErrWriter, "fencekv: run-locked: %v\n", err)
		return &childExit{status: 127}
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.App.Writer, c.App.ErrWriter
	cmd.Env = append(os.Environ(),
		"FENCEKV_TOKEN="+strconv.FormatUint(uint64(l.Token), 10),
		"FENCEKV_LOCK="+l.Name,
		"FENCEKV_ADDR="+c.String("addr"),
	)
	// The command's own fencekv calls reach the server the same way.
	cmd.Env = append(cmd.Env, clientSecurityOf(c).env()...)
	// The guard leads its own process group (the command is in it), so
	// that a lost lease stops the command's children too.
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(c.App.ErrWriter, "fencekv: run-locked: %v\n", err)
		return &childExit{status: 127}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	signalGroup := func(s syscall.Signal) { syscall.Kill(-cmd.Process.Pid, s) }
	for {
		select {
		case err := <-exited:
			return &childExit{status: status(err)}
		case s := <-sigs:
			signalGroup(s.(syscall.Signal))
		case <-ctx.Done():
			cause := context.Cause(ctx)
			signalGroup(syscall.SIGTERM)
			grace := time.NewTimer(c.Duration("grace"))
			defer grace.Stop()
			select {
			case <-exited:
			case <-grace.C:
				signalGroup(syscall.SIGKILL)
				<-exited
			}
			return &childExit{status: exitFenced, lost: cause}
		}
	}
}

// status is a shell's view of how a process ended: its exit status, or
// 128 + the signal that killed it.
func status(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitError
}
