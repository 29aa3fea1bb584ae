//go:build unix

package main

import "syscall"

// raiseFileLimit raises the soft limit on open file descriptors to the
// hard limit, where that is allowed, and returns the soft limit in force:
// each client connection takes one descriptor. (The Go runtime already
// does this at start on most systems; this makes it explicit, and tells.)
func raiseFileLimit() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur < rl.Max {
		raised := rl
		raised.Cur = raised.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return uint64(rl.Cur), err
		}
		rl = raised
	}
	return uint64(rl.Cur), nil // int64 on FreeBSD
}
