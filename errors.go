package fencekv

import (
	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/kv"
)

// Error is a refusal with a stable Code and the facts to act on it. It is
// the same type whether the engine is embedded or reached over the wire, so
// errors.Is(err, fencekv.ErrStaleToken) works either way.
type Error = fence.Error

// Code is the stable name of a refusal; see the Code constants.
type Code = fence.Code

// Token is a fencing token; Revision counts accepted writes store-wide.
type (
	Token    = fence.Token
	Revision = fence.Revision
)

// The refusal codes. The list is append-only; wire/PROTOCOL.md documents
// each with its facts.
const (
	CodeStaleToken    = fence.CodeStaleToken
	CodeNotHolder     = fence.CodeNotHolder
	CodeLeaseExpired  = fence.CodeLeaseExpired
	CodeLockHeld      = fence.CodeLockHeld
	CodeCompareFailed = fence.CodeCompareFailed
	CodeNotInteger    = fence.CodeNotInteger
	CodeTooLarge      = fence.CodeTooLarge
	CodeBadRequest    = fence.CodeBadRequest
	CodeUnknownMethod = fence.CodeUnknownMethod
	CodeUnavailable   = fence.CodeUnavailable
	CodeNotLeader     = fence.CodeNotLeader
	CodeLimitExceeded = fence.CodeLimitExceeded
	CodeInternal      = fence.CodeInternal
	CodeCompacted     = fence.CodeCompacted

	CodeUnauthenticated  = fence.CodeUnauthenticated
	CodePermissionDenied = fence.CodePermissionDenied

	CodeTLSRequired = fence.CodeTLSRequired
)

// Sentinels for errors.Is; each matches every refusal with its code.
var (
	ErrStaleToken    = fence.ErrStaleToken         // is returned when a write's token is below the key's fence
	ErrNotHolder     = fence.ErrNotHolder          // is returned when the named lock is not held by the token
	ErrLeaseExpired  = fence.ErrLeaseExpired       // is returned when the token's lease has run out
	ErrLockHeld      = fence.ErrLockHeld           // is returned when an acquire cannot be granted now
	ErrCompareFailed = fence.ErrCompareFailed      // is returned when a cas finds another revision
	ErrNotInteger    = fence.ErrNotInteger         // is returned when incr finds a non-integer or overflows
	ErrTooLarge      = fence.ErrTooLarge           // is returned when a key or value is over its limit
	ErrBadRequest    = fence.ErrBadRequest         // is returned when arguments are missing or out of range
	ErrUnavailable   = fence.ErrUnavailable        // is returned when the DB is closed or failed
	ErrLimitExceeded = fence.ErrLimitExceeded      // is returned when a limit such as MaxWaiters is reached
	ErrInternal      = fence.ErrInternal           // is returned when a bug (a recovered panic) failed the request
	ErrCompacted     = &Error{Code: CodeCompacted} // is returned when a watch starts before the history kept

	ErrUnauthenticated  = fence.ErrUnauthenticated  // is returned by a server with an auth file before the connection authenticated, or for a wrong name or secret
	ErrPermissionDenied = fence.ErrPermissionDenied // is returned when the principal has no right to the method, key or lock name
)

// ErrLocked is returned by Open when another process has the data dir open.
var ErrLocked = kv.ErrLocked

// ErrSchema is returned by Open when the data file has another schema version.
var ErrSchema = kv.ErrSchema

func errorf(code Code, format string, args ...any) *Error { return fence.Errorf(code, format, args...) }

// OutcomeUnknown is Error.Outcome for a write that may have been applied.
const OutcomeUnknown = fence.OutcomeUnknown
