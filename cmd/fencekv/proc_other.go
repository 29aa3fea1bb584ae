//go:build !linux

package main

import (
	"os"
	"syscall"
)

// setSubreaper does nothing here: orphans go to init, which reaps them.
func setSubreaper() {}

// isTerminal reports whether f is a character device (a terminal, or a
// device such as /dev/null: taken as a terminal here).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// guardAttr is how run-locked starts its guard: in a process group of its
// own. There is no parent-death signal here; the guard checks every
// second whether run-locked is gone.
func guardAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
