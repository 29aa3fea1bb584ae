package kv

import "errors"

// ErrLocked is returned by Open when another process holds the file.
var ErrLocked = errors.New("kv: data file is locked by another process")

// ErrSchema is returned by Open when the file was written by another schema
// version of fencekv.
var ErrSchema = errors.New("kv: unsupported schema version")

// ErrDamaged is matched (errors.Is) by the *DamagedError that Open and
// Check return for a data file that is not a sound bbolt file of this
// schema.
var ErrDamaged = errors.New("kv: data file is damaged")
