//go:build !unix

package main

import "errors"

// raiseFileLimit has nothing to raise on this system.
func raiseFileLimit() (uint64, error) {
	return 0, errors.New("no file descriptor limit to raise on this system")
}
