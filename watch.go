package fencekv

import "github.com/fencekv/fencekv/state"

// Watching: DB.Watch hands out the state machine's watchers.
type (
	// Event is one change: a key written or deleted, or (with
	// WatchOptions.Locks) a lock granted, released or expired.
	Event = state.Event
	// WatchOptions select a watcher's changes and where it starts.
	WatchOptions = state.WatchOptions
	// Watcher delivers the changes, in revision order, after they are
	// durable, never twice and never with a gap.
	Watcher = state.Watcher
)

// ErrWatchCancelled is a watcher's Err when it fell behind (its buffer
// filled) or the store closed.
var ErrWatchCancelled = state.ErrWatchCancelled
