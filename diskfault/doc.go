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
//
// # Power loss
//
// A process killed with SIGKILL loses nothing it wrote: the page cache
// outlives it, so kill -9 never shows a write lost for want of an fsync.
// A power cut does. In a build with failpoints, FENCEKV_POWERLOSS_DIR
// (PowerLossEnv) names a dir where the process records what a power cut
// would leave, and PowerCut, run after the kill, rebuilds the data dir
// from it. Every file of the data dir that the logs and bbolt write:
//
//   - a log (the write-ahead log; a raft log segment; package wal's
//     Open, Append, Sync and Truncate call the hooks): at Open, a copy of
//     the file (the shadow: what is on the disk); at each Append, the
//     span written, in the journal; after each fdatasync that returned,
//     those spans copied from the file into the shadow. The shadow is
//     exactly the bytes the syncs made durable. It keeps the bytes of
//     records from before a checkpoint's Reset, which a new record
//     overwrites in place; a "synced length" per file would not: after a
//     Reset the log's synced length is smaller than the durable bytes, and
//     after Open it says nothing of the old bytes past the next append.
//   - a bbolt file (the data file; a cluster node's state file: package
//     kv calls the hook after each commit returns, and at Open): a
//     consistent copy (a read transaction's WriteTo), written to a
//     temporary name and renamed, so a kill midway leaves the last one.
//     bbolt writes the file only in a commit, and a commit returns after
//     its fsyncs, so the copy is what the disk holds until the next.
//
// PowerCut gives each log its shadow plus, per Mode, none of the writes
// made after its last sync (Clean), the first half of them whole
// (Partial), or all of them, the last one cut in the middle of its last
// record (Torn: cut short at the file's end, or, over older bytes, a bad
// checksum); each bbolt file gets its last copy. Open counts as durable
// whatever the file holds, so every start on the dir must follow a
// PowerCut (or be the first).
//
// The recorder writes its journal and copies without an fsync of its
// own: the tests kill the process and keep the machine, so its page cache
// is as good as a disk; each hook has written its record before the call
// it follows returns (before a write is acknowledged). One that cannot
// record makes the process exit (status 3): a test must not pass on a
// rebuild that does not match what the process did.
//
// Not modelled: raft.db (raft-boltdb's bbolt, term and vote, synced per
// commit; it bypasses package kv) and raft's snapshots (written, synced
// and renamed by raft), which keep what the kill left; a bbolt commit
// torn midway; directory entries (a file created or removed counts as
// durable at once; the code syncs the dirs it changes); and an fsync
// that returns without syncing (the recorder trusts it).
package diskfault
