package fencekv

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/state"
)

// Options configure a DB. Use DefaultOptions and change what you need; a
// nil *Options to Open means the defaults.
type Options struct {
	Clock  Clock        // nil: the real clock
	Logger *slog.Logger // nil: discard

	// NoSync skips fsync of the log and the data file. It breaks G6; for
	// tests only.
	NoSync bool

	MaxKeySize   int           // bytes; also the limit for lock names and holders
	MaxValueSize int           // bytes
	MinTTL       time.Duration // shortest lease
	MaxTTL       time.Duration // longest lease
	MaxLockDelay time.Duration
	MaxWait      time.Duration // longest wait of a blocking acquire
	MaxWaiters   int           // callers queued for locks, store-wide
	MaxScan      int           // most items one Scan or Locks returns
	MaxScanBytes int           // a Scan or Locks page stops after about this many bytes
	MaxBatch     int           // most commands in one transaction
	MaxRefusals  int           // refused fenced writes the refusal log keeps
	MaxTxnOps    int           // most ops (and most compares) in one txn
	WatchHistory int           // events kept for watchers to resume from (the history window)
	// WatchHistoryBytes bounds the keys and values of the history window:
	// the oldest events go once the rest hold this much. At most 256 MiB
	// (a replay of the whole window fits a watcher's default buffer).
	WatchHistoryBytes int
	MaxWatchers       int // watchers at once, store-wide

	// CheckpointEvery and CheckpointBytes say how often the data file is
	// brought up to date with the write-ahead log (and the log emptied):
	// after this much time with writes, or this many bytes of log.
	CheckpointEvery time.Duration
	CheckpointBytes int64

	// Observer, if set, is told of every group commit and checkpoint (for
	// metrics).
	Observer Observer
}

// Observer is told what the commit path does. The batch leader calls it,
// between the commit and the next batch: it must return quickly.
type Observer interface {
	// Committed reports a group commit: the commands it applied and the
	// time its log record took to write and sync.
	Committed(commands int, sync time.Duration)
	// Checkpointed reports a checkpoint of the log into the data file.
	Checkpointed(d time.Duration)
}

// DefaultOptions returns the defaults documented in README.md.
func DefaultOptions() Options {
	return Options{
		MaxKeySize:   4 << 10,
		MaxValueSize: 1 << 20,
		MinTTL:       100 * time.Millisecond,
		MaxTTL:       time.Hour,
		MaxLockDelay: time.Hour,
		MaxWait:      time.Hour,
		MaxWaiters:   100_000,
		MaxScan:      10_000,
		MaxScanBytes: 2 << 20,
		MaxBatch:     1024,
		MaxRefusals:  10_000,
		MaxTxnOps:    128,
		WatchHistory: 10_000,

		WatchHistoryBytes: 64 << 20,
		MaxWatchers:       4096,

		CheckpointEvery: 200 * time.Millisecond,
		CheckpointBytes: 16 << 20,
	}
}

// Validate reports the first option out of its range. Open calls it, and
// so does every other driver of the state machine (cluster.Open), so that
// a limit the storage cannot keep is refused at start, not in the middle
// of a batch.
func (o *Options) Validate() error {
	switch {
	case o.MaxKeySize <= 0, o.MaxValueSize <= 0, o.MaxScan <= 0, o.MaxScanBytes <= 0, o.MaxBatch <= 0, o.MaxRefusals <= 0, o.MaxTxnOps <= 0, o.WatchHistory <= 0,
		o.WatchHistoryBytes <= 0, o.MaxWatchers <= 0:
		return errors.New("fencekv: size limits must be positive")
	case o.MaxKeySize > kv.MaxKeySize:
		// A key or lock name the storage cannot hold would fail in the
		// middle of a batch, not be refused before it.
		return fmt.Errorf("fencekv: MaxKeySize %d is over the storage's limit of %d bytes", o.MaxKeySize, kv.MaxKeySize)
	case o.MaxValueSize > kv.MaxValueSize-o.MaxKeySize:
		return fmt.Errorf("fencekv: MaxValueSize %d is over the storage's limit of %d bytes", o.MaxValueSize, kv.MaxValueSize-o.MaxKeySize)
	case o.MaxTxnOps > state.MaxCommandBytes || int64(o.MaxValueSize)+2*int64(o.MaxTxnOps)*int64(o.MaxKeySize) > state.MaxCommandBytes:
		// A transaction's ops and compares, in one log record with the
		// rest of its batch, must fit a record (wal.MaxRecord).
		return fmt.Errorf("fencekv: MaxValueSize %d plus MaxTxnOps %d keys of MaxKeySize %d, for ops and for compares, is over the limit of %d bytes for one command", o.MaxValueSize, o.MaxTxnOps, o.MaxKeySize, state.MaxCommandBytes)
	case o.MinTTL <= 0 || o.MaxTTL < o.MinTTL:
		return fmt.Errorf("fencekv: bad TTL range %v..%v", o.MinTTL, o.MaxTTL)
	case o.CheckpointEvery <= 0 || o.CheckpointBytes <= 0:
		return errors.New("fencekv: CheckpointEvery and CheckpointBytes must be positive")
	case o.MaxLockDelay < 0 || o.MaxWait < 0 || o.MaxWaiters < 0:
		return errors.New("fencekv: MaxLockDelay, MaxWait and MaxWaiters must not be negative")
	}
	return nil
}
