package wal

import (
	"errors"
	"os"
	"syscall"
)

// fdatasync flushes the file's data and the metadata needed to read it
// back (its size), not its timestamps.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// preallocate extends f by n bytes from off, reading as zeros, its size
// changed (mode 0). It fails with errors.ErrUnsupported where the file
// system cannot do it.
func preallocate(f *os.File, off, n int64) error {
	for {
		err := syscall.Fallocate(int(f.Fd()), 0, off, n)
		switch err {
		case nil:
			return nil
		case syscall.EINTR:
			continue
		case syscall.EOPNOTSUPP, syscall.ENOSYS:
			return errors.ErrUnsupported
		}
		return err
	}
}
