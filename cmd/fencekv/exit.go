package main

import (
	"errors"
	"fmt"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

// Exit statuses, documented in the app's help and README.md.
const (
	exitOK        = 0
	exitError     = 1 // the server or the connection failed
	exitUsage     = 2 // bad arguments, bad_request, too_large, unknown_method, limit_mismatch, TLS settings that do not match the server's
	exitFenced    = 3 // stale_token, not_holder, lease_expired; run-locked lost its lease
	exitLockHeld  = 4 // lock_held, or a wait ran out
	exitCondition = 5 // compare_failed, not_integer
	exitNotFound  = 6 // get of a missing key
	exitViolation = 7 // verify found a broken guarantee

	exitUnauthenticated = 8 // unauthenticated: no credentials, or a wrong name or secret
	exitDenied          = 9 // permission_denied: the principal has no right to it
)

// usageError marks a mistake in the command line.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// statusError carries an exit status with no message of its own (the
// command already printed what happened).
type statusError int

func (e statusError) Error() string { return "" }
func (e statusError) ExitCode() int { return int(e) }

var _ cli.ExitCoder = statusError(0)

func exitCode(err error) int {
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	var ue usageError
	var te *wire.TLSError
	if errors.As(err, &ue) || errors.As(err, &te) {
		return exitUsage // a TLS refusal is a setting to fix, not an outage
	}
	var fe *fencekv.Error
	if errors.As(err, &fe) {
		switch fe.Code {
		case fencekv.CodeStaleToken, fencekv.CodeNotHolder, fencekv.CodeLeaseExpired:
			return exitFenced
		case fencekv.CodeLockHeld:
			return exitLockHeld
		case fencekv.CodeCompareFailed, fencekv.CodeNotInteger:
			return exitCondition
		case fencekv.CodeBadRequest, fencekv.CodeTooLarge, fencekv.CodeUnknownMethod, fencekv.CodeLimitMismatch:
			return exitUsage
		case fencekv.CodeUnauthenticated:
			return exitUnauthenticated
		case fencekv.CodePermissionDenied:
			return exitDenied
		}
	}
	return exitError
}

// describe renders a refusal for people: its code and message, which
// carries the facts (fence, holder token, time to wait).
func describe(err error) string {
	return err.Error()
}

// noArgs refuses arguments to a command that takes none. A lone true or
// false is most often a boolean flag's value written after a space
// (--event-loop false), which the flag does not take.
func noArgs(c *cli.Context) error {
	if c.NArg() == 0 {
		return nil
	}
	a := c.Args().Slice()
	hint := ""
	if a[0] == "true" || a[0] == "false" {
		hint = fmt.Sprintf(": a boolean flag takes its value after '=', as in --FLAG=%s", a[0])
	}
	return usagef("%s takes no arguments, got %q%s (see 'fencekv %s --help')", c.Command.Name, a, hint, c.Command.Name)
}
