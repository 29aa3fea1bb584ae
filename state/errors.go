package state

import (
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/fencekv/fencekv/fence"
)

// ErrVersion is returned when a log holds commands encoded by a version of
// fencekv newer than this build.
var ErrVersion = errors.New("fencekv: commands encoded by a newer version of fencekv (upgrade this binary)")

// errBadCommand is returned by readCommand for bytes appendCommand did not
// write.
var errBadCommand = errors.New("fencekv: malformed command in the log")

// ErrWatchCancelled is returned by Watcher.Err when the watcher fell
// behind (its buffer filled) or the store closed.
var ErrWatchCancelled = errors.New("fencekv: watch cancelled")

// errClosed answers a watch started on a machine whose watchers were
// closed (the store is closing).
var errClosed = fence.Errorf(fence.CodeUnavailable, "the store is closed")

// ErrPanic matches (errors.Is) an error made from a recovered panic.
var ErrPanic = errors.New("panic")

// PanicError is a recovered panic, with the stack it came from (for the
// log, not the message: a damaged file must not print a trace at a user).
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string        { return fmt.Sprintf("panic: %v", e.Value) }
func (e *PanicError) Is(target error) bool { return target == ErrPanic }

// Safely runs fn, turning a panic into a *PanicError.
func Safely(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{p, debug.Stack()}
		}
	}()
	return fn()
}

func errorf(code fence.Code, format string, args ...any) *fence.Error {
	return fence.Errorf(code, format, args...)
}
