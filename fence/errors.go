package fence

import (
	"errors"
	"fmt"
	"time"
)

// Code is the stable name of a refusal. Codes cross the wire, so the list is
// append-only: a code, once shipped, keeps its spelling and its meaning.
type Code string

// The refusal codes of fencekv, shared by the storage engine, the lease
// manager, the engine and the wire protocol.
const (
	CodeStaleToken    Code = "stale_token"    // a write's token is below the key's fence; Fence is set
	CodeNotHolder     Code = "not_holder"     // the lock is free or held by another token; Token is the current holder's, if any
	CodeLeaseExpired  Code = "lease_expired"  // the token is the lock's latest grant but its lease ran out
	CodeLockHeld      Code = "lock_held"      // an acquire cannot be granted now; Holder, Token and RetryAfter are set
	CodeCompareFailed Code = "compare_failed" // a cas found another revision; Revision is the key's current one
	CodeNotInteger    Code = "not_integer"    // incr found a value that is not a signed 64-bit decimal, or overflowed
	CodeTooLarge      Code = "too_large"      // a key, value or message is over its limit
	CodeBadRequest    Code = "bad_request"    // the request is malformed or its arguments are out of range
	CodeUnknownMethod Code = "unknown_method" // the wire method does not exist
	CodeUnavailable   Code = "unavailable"    // the store is closed, shutting down, or failed to commit
	CodeNotLeader     Code = "not_leader"     // in a cluster, this node is not the leader; Leader is set if known
	CodeLimitExceeded Code = "limit_exceeded" // a server-side limit (connections, in-flight requests, waiters) is reached
	CodeInternal      Code = "internal"       // a bug: the server recovered from a panic while serving the request
	CodeCompacted     Code = "compacted"      // a watch asked for a revision older than the history kept; Revision is the oldest kept

	CodeUnauthenticated  Code = "unauthenticated"   // the connection has not authenticated (or its name or secret was wrong)
	CodePermissionDenied Code = "permission_denied" // the principal has no right to this method, key or lock name

	CodeTLSRequired Code = "tls_required" // a TLS server was sent plain bytes (the error notification only): connect with TLS

	CodeLimitMismatch Code = "limit_mismatch" // an acquire's limit (permits) is not the one the lock has while a permit is live
)

// Error is a refusal: a stable Code plus the facts a caller needs to act on
// it. The zero value of each fact means "not applicable".
//
// errors.Is(err, target) holds when target is an *Error with the same Code,
// so the sentinels below match refusals that carry facts.
type Error struct {
	Code    Code
	Message string

	Fence      Token         // stale_token: the key's fence
	Token      Token         // not_holder, lock_held: the current holder's token (0: none)
	Holder     string        // lock_held: the current holder's display name
	RetryAfter time.Duration // lock_held: how long until the lock may be free
	Revision   Revision      // compare_failed: the key's current revision
	Key        string        // in a txn: the key the refusal is about (stale_token, compare_failed, not_integer)
	Leader     string        // not_leader: the leader's address, if known
	Outcome    string        // unavailable: OutcomeUnknown when a write may have been applied
}

// OutcomeUnknown is Error.Outcome for a write that was proposed but whose
// fate is unknown (the leadership was lost, or the connection to the
// server broke, after it was sent): it may or may not have been applied.
// unavailable without it means the command was not applied.
const OutcomeUnknown = "unknown"

// Error implements the error interface.
func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) {
		return false
	}
	return t.Code == e.Code
}

// Sentinels for errors.Is. Each matches every refusal with its code.
var (
	// ErrStaleToken is returned when a write's token is below the key's
	// fence (or not above it, for a strict write).
	ErrStaleToken = &Error{Code: CodeStaleToken}
	// ErrNotHolder is returned when a held write, renew or release names a
	// lock that is free or held by another token.
	ErrNotHolder = &Error{Code: CodeNotHolder}
	// ErrLeaseExpired is returned when the token is the lock's latest grant
	// but its lease has run out.
	ErrLeaseExpired = &Error{Code: CodeLeaseExpired}
	// ErrLockHeld is returned when an acquire cannot be granted now.
	ErrLockHeld = &Error{Code: CodeLockHeld}
	// ErrCompareFailed is returned when a cas finds another revision.
	ErrCompareFailed = &Error{Code: CodeCompareFailed}
	// ErrNotInteger is returned when incr finds a value that is not a
	// signed 64-bit decimal integer, or the sum would overflow.
	ErrNotInteger = &Error{Code: CodeNotInteger}
	// ErrTooLarge is returned when a key, value or message is over its limit.
	ErrTooLarge = &Error{Code: CodeTooLarge}
	// ErrBadRequest is returned when arguments are missing or out of range.
	ErrBadRequest = &Error{Code: CodeBadRequest}
	// ErrUnavailable is returned when the store cannot serve the request now.
	ErrUnavailable = &Error{Code: CodeUnavailable}
	// ErrLimitExceeded is returned when a server-side limit is reached.
	ErrLimitExceeded = &Error{Code: CodeLimitExceeded}
	// ErrInternal is returned when the server recovered from a bug (a
	// panic) while serving the request.
	ErrInternal = &Error{Code: CodeInternal}
	// ErrUnauthenticated is returned when a server with an auth file is
	// asked for anything but ping and auth before the connection has
	// authenticated, and by auth for a wrong name or secret.
	ErrUnauthenticated = &Error{Code: CodeUnauthenticated}
	// ErrPermissionDenied is returned when the authenticated principal has
	// no right to the method, key or lock name.
	ErrPermissionDenied = &Error{Code: CodePermissionDenied}
)

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
