package main

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// A job never outlives the run-locked that holds its lock, even when
// run-locked itself is killed with SIGKILL: run-locked starts the command
// under a guard, a second fencekv process that leads the command's
// process group and asks the kernel to signal it when run-locked dies
// (Linux's parent-death signal). The guard then terminates the whole
// group: SIGTERM, and SIGKILL after the grace period.
//
// The guard is `fencekv` run with guardArg as its first argument, before
// the CLI parses anything:
//
//	fencekv __run-locked-guard PARENT_PID GRACE -- COMMAND [ARGS...]

const guardArg = "__run-locked-guard"

// guardCommand returns the command that runs argv under a guard.
func guardCommand(grace time.Duration, argv []string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append([]string{guardArg, strconv.Itoa(os.Getpid()), grace.String(), "--"}, argv...)
	cmd := exec.Command(self, args...)
	// The guard leads a process group of its own (the command joins
	// it), and gets SIGTERM when the thread that started it dies: Go
	// never ends a thread that has not been locked, so in practice that
	// is when run-locked dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	return cmd, nil
}

// runGuard is the guard process: it runs the command in its own process
// group and exits with its status. Signals that run-locked sends to the
// group reach the command directly; the guard ignores them, unless its
// parent is gone: then it stops the group.
func runGuard(args []string) int {
	if len(args) < 4 || args[2] != "--" {
		return exitUsage
	}
	parent, err1 := strconv.Atoi(args[0])
	grace, err2 := time.ParseDuration(args[1])
	if err1 != nil || err2 != nil {
		return exitUsage
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	cmd := exec.Command(args[3], args[4:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		os.Stderr.WriteString("fencekv: run-locked: " + err.Error() + "\n")
		return 127
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	orphaned := func() bool { return os.Getppid() != parent }
	// run-locked may have died before the parent-death signal was set up.
	check := time.NewTicker(time.Second)
	defer check.Stop()
	for {
		select {
		case err := <-exited:
			return status(err)
		case <-sigs:
		case <-check.C:
		}
		if !orphaned() {
			continue
		}
		group := -os.Getpid()
		syscall.Kill(group, syscall.SIGTERM)
		select {
		case err := <-exited:
			syscall.Kill(group, syscall.SIGKILL) // the command's own children
			return status(err)
		case <-time.After(grace):
			syscall.Kill(group, syscall.SIGKILL)
			return status(<-exited)
		}
	}
}
