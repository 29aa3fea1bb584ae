package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
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
		UsageText: `fencekv run-locked NAME [--ttl 10s] [--wait 30s] [--grace 3s] [--lock-delay D] [--lost-status 3] [--limit N] -- COMMAND [ARGS...]

Acquires NAME (queueing up to --wait), runs COMMAND with FENCEKV_TOKEN,
FENCEKV_LOCK and FENCEKV_ADDR in its environment, and renews the lease while it
runs, through reconnects: a server restarted (or, in a cluster, a new leader)
within the TTL costs nothing. If the lease may be lost (a renew is refused, or
none succeeded within the TTL less --grace), the command's process group is
sent SIGTERM, then SIGKILL after --grace, so that it has stopped before the
server may expire the lease; run-locked then releases the lock if the server
still holds it for this lease, and exits with --lost-status (3). When the
command ends, what it left running in its process group is stopped the same
way, the lock is released and run-locked exits with the command's status;
choose a --lost-status your command never exits with to tell the two apart.
Exit 4: the lock stayed held for all of --wait; 128+N: signal N came while
waiting (the command did not run). If run-locked itself dies, even by
kill -9, the command's process group is stopped. A terminal is not passed
as the command's standard input (/dev/null is).

With --json, run-locked prints its report (or error) as one JSON object on
stderr once the command has ended (stdout is the command's):
  {"command_status": C, "lease_lost": false, "lock": NAME, "status": S, "token": T}

With --limit N, NAME is a semaphore: up to N run-locked commands run at once,
each with a permit and token of its own, the others queue (first come, first
served) for the next permit freed.

The command should pass the token with its writes, so the store refuses them
if it is ever too late:
  fencekv run-locked nightly-report --ttl 30s -- \
    sh -c 'fencekv put reports/latest "$(date)" --token "$FENCEKV_TOKEN"'`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.DurationFlag{Name: "ttl", Value: 10 * time.Second, Usage: "lease length (renewed every third of it)"},
			&cli.DurationFlag{Name: "wait", Value: 30 * time.Second, Usage: "queue for the lock up to this long"},
			&cli.DurationFlag{Name: "grace", Value: 3 * time.Second, Usage: "after SIGTERM, wait this long before SIGKILL; on a lost lease the command gets SIGTERM this long before the lease may run out (shorter than --ttl; by default 3s, or a third of --ttl if less)"},
			&cli.DurationFlag{Name: "lock-delay", Usage: "after the lease runs out (not after a release), nobody may take the lock for this long: for commands that cannot fence their writes"},
			&cli.IntFlag{Name: "lost-status", Value: exitFenced, Usage: "exit `STATUS` when the lease may have been lost and the command was stopped (1-255)"},
			&cli.StringFlag{Name: "holder", Usage: "holder name shown by 'lock info' (default host:pid and a random suffix, which lets run-locked find a grant whose answer was lost)"},
			limitFlag(), // semaphore.go
		}),
		Action: runLocked,
	}
}

// signalled ends run-locked's wait for the lock: a signal came first.
type signalled struct{ s syscall.Signal }

func (e signalled) Error() string { return "interrupted by " + signalName(e.s) }

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return s.String()
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
	// With no --holder, WithLock acquires under a name of its own
	// (host:pid:suffix), by which it finds a grant whose answer was lost.
	holder := c.String("holder")
	// Signals to run-locked go to the child; the lock is released after.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	lostStatus := c.Int("lost-status")
	if lostStatus < 1 || lostStatus > 255 {
		return usagef("run-locked: --lost-status %d: want 1 to 255", lostStatus)
	}

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
	ttl, grace := c.Duration("ttl"), c.Duration("grace")
	if !c.IsSet("grace") {
		grace = min(grace, ttl/3)
	}
	if grace < 0 || grace >= ttl {
		return usagef("run-locked: --grace %v: want 0 or more, and shorter than --ttl (%v): on a lost lease the command gets SIGTERM --grace before the lease may run out", grace, ttl)
	}
	lo := &wire.LockOptions{
		AcquireOptions: fencekv.AcquireOptions{Wait: c.Duration("wait"), Holder: holder, LockDelay: c.Duration("lock-delay"), Limit: c.Int("limit")},
		// The command is told to stop grace before the lease may run
		// out, so that by then it has stopped, SIGKILL included.
		Margin: grace,
		// After a lost lease, the release is tried for up to the TTL:
		// a server back by then (restarted, so the lease has its full TTL
		// again) frees the lock at once rather than a TTL later.
		ReleaseTimeout: min(c.Duration("ttl"), 5*time.Second),
	}
	// The server bounds the wait (wait_ms); from the grant on, the lease's
	// own context governs. A signal while waiting ends the wait (the
	// command does not start); from the start on, signals go to the
	// command.
	wctx, begin, stopWait := waitInterrupts(ctx)
	defer stopWait()
	err = cl.WithLock(wctx, name, c.Duration("ttl"), lo, func(lctx context.Context, l fencekv.Lease) error {
		report["token"] = l.Token
		if cause := begin(); cause != nil {
			return cause // signalled as the lock was granted: released unused
		}
		return runChild(lctx, c, l, argv, sigs, grace)
	})
	return childResult(c, "run-locked", name, report, wctx, err, lostStatus)
}

// waitInterrupts is ctx, ended (with cause signalled) by SIGINT, SIGTERM
// or SIGHUP until begin is called: a wait for a lock that a signal
// interrupts. begin marks the start of the command (signals are the
// command's from then on) and returns the cause if a signal came first;
// stop releases what waitInterrupts holds.
func waitInterrupts(ctx context.Context) (wctx context.Context, begin func() error, stop func()) {
	wctx, stopWait := context.WithCancelCause(ctx)
	waitSigs := make(chan os.Signal, 1)
	signal.Notify(waitSigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var smu sync.Mutex
	started := false
	go func() {
		select {
		case s := <-waitSigs:
			smu.Lock()
			if !started {
				stopWait(signalled{s.(syscall.Signal)})
			}
			smu.Unlock()
		case <-wctx.Done():
		}
	}()
	begin = func() error {
		smu.Lock()
		started = true
		signal.Stop(waitSigs)
		smu.Unlock()
		return context.Cause(wctx)
	}
	stop = func() {
		stopWait(nil)
		signal.Stop(waitSigs)
	}
	return wctx, begin, stop
}

// childResult reports how a command run under a lease (by run-locked or
// elect, named by what) ended: err is what running it returned, wctx the
// wait for the lease (see waitInterrupts).
func childResult(c *cli.Context, what, name string, report map[string]any, wctx context.Context, err error, lostStatus int) error {
	var ce *childExit
	var sig signalled
	switch {
	case errors.As(context.Cause(wctx), &sig):
		// The wait was interrupted; the command never ran.
		report["status"] = 128 + int(sig.s)
		err := fmt.Errorf("%s %s: %v while waiting for the lock; the command did not run", what, name, sig)
		if !c.Bool("json") {
			fmt.Fprintf(c.App.ErrWriter, "fencekv: %v\n", err)
			return statusError(128 + int(sig.s))
		}
		report["error"], report["message"] = errSignalled, err.Error()
		json.NewEncoder(c.App.ErrWriter).Encode(report)
		return statusError(128 + int(sig.s))
	case errors.As(err, &ce) && ce.lost != nil:
		report["status"], report["lease_lost"] = lostStatus, true
		if !c.Bool("json") {
			fmt.Fprintf(c.App.ErrWriter, "fencekv: %s %s: %v\n", what, name, ce)
			return statusError(lostStatus)
		}
		report["command_status"] = ce.status
		for k, v := range errorJSON(ce) {
			report[k] = v
		}
		report["error"] = errLeaseLost
		return runLockedResult(c, report, statusError(lostStatus))
	case errors.As(err, &ce):
		report["status"], report["command_status"], report["lease_lost"] = ce.status, ce.status, false
		return runLockedResult(c, report, statusError(ce.status))
	case err != nil:
		return runLockedResult(c, report, err)
	}
	return nil
}

// runLockedResult reports how run-locked ended, with --json as one object
// on stderr (the report, with the error's fields if it failed), and
// returns the exit status. Without --json, an error is left to run to
// print.
func runLockedResult(c *cli.Context, report map[string]any, err error) error {
	if !c.Bool("json") {
		return err
	}
	if _, printed := err.(statusError); !printed {
		for k, v := range errorJSON(err) {
			report[k] = v
		}
		report["status"] = exitCode(err)
		err = statusError(exitCode(err))
	}
	json.NewEncoder(c.App.ErrWriter).Encode(report)
	return err
}

// runChild runs argv with the lease in its environment until it exits, or
// until ctx ends because the lease may be lost; then it stops the child.
// env is added to the command's environment.
func runChild(ctx context.Context, c *cli.Context, l fencekv.Lease, argv []string, sigs <-chan os.Signal, grace time.Duration, env ...string) error {
	// Under a guard (guard.go): if run-locked dies, even by SIGKILL, the
	// command's whole process group is stopped, so that a job never
	// outlives the process that holds its lock.
	cmd, err := guardCommand(grace, argv)
	if err != nil {
		fmt.Fprintf(c.App.ErrWriter, "fencekv: run-locked: %v\n", err)
		return &childExit{status: 127}
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.App.Writer, c.App.ErrWriter
	if isTerminal(os.Stdin) {
		// The command runs in a process group of its own, out of the
		// terminal's foreground: reading the terminal would stop it (and
		// run-locked would renew the lock for it for good). It reads
		// /dev/null instead.
		if null, err := os.Open(os.DevNull); err == nil {
			defer null.Close()
			cmd.Stdin = null
		}
	}
	cmd.Env = append(os.Environ(),
		"FENCEKV_TOKEN="+strconv.FormatUint(uint64(l.Token), 10),
		"FENCEKV_LOCK="+l.Name,
		"FENCEKV_ADDR="+c.String("addr"),
	)
	// The command's own fencekv calls reach the server the same way.
	cmd.Env = append(cmd.Env, clientSecurityOf(c).env()...)
	cmd.Env = append(cmd.Env, env...)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(c.App.ErrWriter, "fencekv: run-locked: %v\n", err)
		return &childExit{status: 127}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		select {
		case err := <-exited:
			// The guard ends once the command's whole group has.
			return &childExit{status: status(err)}
		case s := <-sigs:
			cmd.Process.Signal(s) // the guard forwards it to the command's group
		case <-ctx.Done():
			cause := context.Cause(ctx)
			// The guard stops the group: SIGTERM, SIGKILL after the grace.
			cmd.Process.Signal(guardStop)
			stuck := time.NewTimer(2*grace + sweepKillWait + 5*time.Second)
			defer stuck.Stop()
			var err error
			select {
			case err = <-exited:
			case <-stuck.C:
				fmt.Fprintf(c.App.ErrWriter, "fencekv: run-locked: the guard did not stop the command; killing it\n")
				cmd.Process.Kill()
				err = <-exited
			}
			return &childExit{status: status(err), lost: cause}
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
