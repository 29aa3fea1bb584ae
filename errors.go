package fencekv

import "github.com/fencekv/fencekv/kv"

// Error is a refusal with a stable Code and the facts to act on it. It is
// the same type whether the engine is embedded or reached over the wire, so
// errors.Is(err, fencekv.ErrStaleToken) works either way.
type Error = kv.Error

// Code is the stable name of a refusal; see the Code constants.
type Code = kv.Code

// Token is a fencing token; Revision counts accepted writes store-wide.
type (
	Token    = kv.Token
	Revision = kv.Revision
)

// The refusal codes. The list is append-only; wire/PROTOCOL.md documents
// each with its facts.
const (
	CodeStaleToken    = kv.CodeStaleToken
	CodeNotHolder     = kv.CodeNotHolder
	CodeLeaseExpired  = kv.CodeLeaseExpired
	CodeLockHeld      = kv.CodeLockHeld
	CodeCompareFailed = kv.CodeCompareFailed
	CodeNotInteger    = kv.CodeNotInteger
	CodeTooLarge      = kv.CodeTooLarge
	CodeBadRequest    = kv.CodeBadRequest
	CodeUnknownMethod = kv.CodeUnknownMethod
	CodeUnavailable   = kv.CodeUnavailable
	CodeNotLeader     = kv.CodeNotLeader
	CodeLimitExceeded = kv.CodeLimitExceeded
	CodeInternal      = kv.CodeInternal
)

// Sentinels for errors.Is; each matches every refusal with its code.
var (
	ErrStaleToken    = kv.ErrStaleToken    // is returned when a write's token is below the key's fence
	ErrNotHolder     = kv.ErrNotHolder     // is returned when the named lock is not held by the token
	ErrLeaseExpired  = kv.ErrLeaseExpired  // is returned when the token's lease has run out
	ErrLockHeld      = kv.ErrLockHeld      // is returned when an acquire cannot be granted now
	ErrCompareFailed = kv.ErrCompareFailed // is returned when a cas finds another revision
	ErrNotInteger    = kv.ErrNotInteger    // is returned when incr finds a non-integer or overflows
	ErrTooLarge      = kv.ErrTooLarge      // is returned when a key or value is over its limit
	ErrBadRequest    = kv.ErrBadRequest    // is returned when arguments are missing or out of range
	ErrUnavailable   = kv.ErrUnavailable   // is returned when the DB is closed or failed
	ErrLimitExceeded = kv.ErrLimitExceeded // is returned when a limit such as MaxWaiters is reached
)

// ErrLocked is returned by Open when another process has the data dir open.
var ErrLocked = kv.ErrLocked

// ErrSchema is returned by Open when the data file has another schema version.
var ErrSchema = kv.ErrSchema

func errorf(code Code, format string, args ...any) *Error { return kv.Errorf(code, format, args...) }
