// Package diskfault injects disk faults for tests: failpoints, in the
// manner of etcd's gofail, at the writes and fsyncs of fencekv's
// write-ahead log (package wal), of a cluster node's raft log (the same
// wal records, under their own names) and before a single node's data file
// checkpoint.
//
// A failpoint is a named place in the code that calls Hit:
//
//	wal.write, wal.sync          the single node's write-ahead log (Append, Sync)
//	raftlog.write, raftlog.sync  a cluster node's raft log segments
//	data.checkpoint              before a single node commits its data file
//
// # Why a package of hooks, and why a build tag
//
// The faults have to reach real processes (the suites check invariants of
// `fencekv serve` under kill -9, partitions and, here, failing disks), so
// in-process injection (a func field a test sets) is not enough; and a
// fault layer that is part of every build is a way to break production by
// environment variable. So, as with gofail, the hooks exist only in a test
// build: with -tags failpoints, Enabled is true and Hit reads its rules
// from the environment; in the default build Enabled is the constant false,
// Hit is an empty function, and the calls, written as
//
//	if diskfault.Enabled {
//		if err := diskfault.Hit("wal.sync"); err != nil { ... }
//	}
//
// compile away: `go build -gcflags=-S ./wal` shows no call to Hit in the
// default build (and one per hook with the tag), and BenchmarkAppend in
// package wal measures the hot path either way. The hooks wrap
// the project's own file writes; bbolt owns its *os.File, so the data file
// is reached by a hook before a checkpoint commits, and for the real thing
// the tests put the data dir on a small tmpfs (ENOSPC from the kernel).
//
// # Rules
//
// FENCEKV_FAILPOINTS, read once at start, holds rules separated by ';':
//
//	point=action[@N[+]]
//
// action is eio or enospc (Hit returns that errno, and the caller does not
// do the write or the fsync), or stall:DURATION (Hit sleeps, then the
// caller goes on: a disk that hangs, then comes back). @N fires on the Nth
// hit only (counted from when the rule was read), @N+ on the Nth and every
// later one; without it, every hit. For example
//
//	FENCEKV_FAILPOINTS='wal.sync=eio@5'           the 5th sync fails, and only it
//	FENCEKV_FAILPOINTS='raftlog.sync=stall:3s@10' the 10th sync of the raft log hangs 3s
//
// FENCEKV_FAILPOINTS_FILE names a file of rules in the same syntax, read
// again whenever it changes (its size or modification time), so a test can
// arm a fault in a running process: on the node that became the leader,
// say. Its rules replace the environment's, with fresh counts.
//
// Each fault fired is logged to stderr ("diskfault: wal.sync hit 5:
// injected EIO"), and so is each later hit of a rule that fired: a test
// reads there whether a node went on to sync again after a failed fsync.
// A malformed rule makes the process exit at start (or, from the file,
// is logged and ignored), rather than run a test without its fault.
package diskfault
