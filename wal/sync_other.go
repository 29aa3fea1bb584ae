//go:build !linux

package wal

import (
	"errors"
	"os"
)

func fdatasync(f *os.File) error { return f.Sync() }

// preallocate is Linux's only: elsewhere the log grows with its records.
func preallocate(*os.File, int64, int64) error { return errors.ErrUnsupported }
