package main

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// A job never outlives the run-locked that holds its lock, nor the lock:
// run-locked starts the command under a guard, a second fencekv process
// that asks the kernel to signal it when run-locked dies (Linux's
// parent-death signal), runs the command in a process group of its own,
// and is the subreaper of everything the command starts. The guard ends
// only once that whole group has: when the command exits, what it left
// running in its group is stopped (SIGTERM, and SIGKILL after the grace
// period) before run-locked releases the lock; when run-locked asks it to
// (the lease may be lost: SIGUSR1), or dies, the guard stops the group the
// same way.
//
// The guard is `fencekv` run with guardArg as its first argument, before
// the CLI parses anything:
//
//	fencekv __run-locked-guard PARENT_PID GRACE -- COMMAND [ARGS...]

const guardArg = "__run-locked-guard"

// guardStop is the signal run-locked sends the guard to stop the command's
// group; SIGINT, SIGTERM and SIGHUP it forwards to the group.
const guardStop = syscall.SIGUSR1

// guardCommand returns the command that runs argv under a guard.
func guardCommand(grace time.Duration, argv []string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append([]string{guardArg, strconv.Itoa(os.Getpid()), grace.String(), "--"}, argv...)
	cmd := exec.Command(self, args...)
	// The guard leads a process group of its own, out of the terminal's
	// foreground: a Ctrl-C reaches run-locked, which forwards it. On
	// Linux it gets SIGTERM when run-locked dies (guardAttr); elsewhere
	// it sees run-locked gone within a second (runGuard's check).
	cmd.SysProcAttr = guardAttr()
	return cmd, nil
}

// runGuard is the guard process: it runs the command in a process group
// of its own and exits with its status once the group is gone.
func runGuard(args []string) int {
	if len(args) < 4 || args[2] != "--" {
		return exitUsage
	}
	parent, err1 := strconv.Atoi(args[0])
	grace, err2 := time.ParseDuration(args[1])
	if err1 != nil || err2 != nil {
		return exitUsage
	}
	// What the command leaves behind is reparented to the guard, which
	// reaps it (sweep); without this, to whatever reaps orphans, if
	// anything does.
	setSubreaper()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, guardStop)
	cmd := exec.Command(args[3], args[4:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		os.Stderr.WriteString("fencekv: run-locked: " + err.Error() + "\n")
		return 127
	}
	group := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	orphaned := func() bool { return os.Getppid() != parent }
	// run-locked may have died before the parent-death signal was set up.
	check := time.NewTicker(time.Second)
	defer check.Stop()
	for {
		select {
		case err := <-exited:
			sweep(group, grace)
			return status(err)
		case s := <-sigs:
			if s != guardStop && !orphaned() {
				syscall.Kill(-group, s.(syscall.Signal))
				continue
			}
		case <-check.C:
			if !orphaned() {
				continue
			}
		}
		// Asked to stop the command, or run-locked is gone.
		syscall.Kill(-group, syscall.SIGTERM)
		t := time.NewTimer(grace)
		var err error
		select {
		case err = <-exited:
			t.Stop()
		case <-t.C:
			syscall.Kill(-group, syscall.SIGKILL)
			err = <-exited
		}
		sweep(group, grace)
		return status(err)
	}
}

// sweep stops what is left of the command's process group once the command
// has been reaped: SIGTERM, then SIGKILL if some of it is still there
// after grace; it returns when the group is empty (or has resisted SIGKILL
// for sweepKillWait, in an uninterruptible sleep).
func sweep(group int, grace time.Duration) {
	if !groupAlive(group) {
		return
	}
	syscall.Kill(-group, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	killed := false
	for groupAlive(group) {
		if time.Now().After(deadline) {
			if killed {
				os.Stderr.WriteString("fencekv: run-locked: processes of the command's group did not end after SIGKILL\n")
				return
			}
			syscall.Kill(-group, syscall.SIGKILL)
			killed, deadline = true, time.Now().Add(sweepKillWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sweepKillWait bounds the wait for a group sent SIGKILL.
const sweepKillWait = 5 * time.Second

// groupAlive reaps the guard's children that have ended (called only once
// the command itself has been reaped: the command's Wait must get its
// status) and reports whether any process is left in the group.
func groupAlive(group int) bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			break
		}
	}
	return syscall.Kill(-group, 0) == nil
}
