package main

import (
	"os"
	"syscall"
	"unsafe"
)

// setSubreaper makes the calling process the reaper of its orphaned
// descendants (prctl PR_SET_CHILD_SUBREAPER).
func setSubreaper() {
	const prSetChildSubreaper = 36
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
}

// guardAttr is how run-locked starts its guard: in a process group of its
// own, with SIGTERM when the thread that started it dies (Go never ends a
// thread that has not been locked, so in practice when run-locked dies).
func guardAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
