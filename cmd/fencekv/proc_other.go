//go:build !linux

package main

import "os"

// setSubreaper does nothing here: orphans go to init, which reaps them.
func setSubreaper() {}

// isTerminal reports whether f is a character device (a terminal, or a
// device such as /dev/null: taken as a terminal here).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
