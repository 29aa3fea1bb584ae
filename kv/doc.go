// Package kv is fencekv's storage engine: it owns the bbolt file and its
// layout, and implements the fenced operations on a read-write transaction.
//
// The file holds four buckets:
//
//	meta        schema version, store-wide revision, last issued token, live
//	            key count, and the state machine's marks: wal_applied (the
//	            last log index the file reflects) and term (of the last lease
//	            re-arm)
//	keys        live key -> record: flags (1 byte, always live), fence (8),
//	            revision (8), value
//	tombstones  deleted key -> fence (8), revision of the delete (8)
//	locks       lock name -> lease record (opaque here; encoded by package
//	            lease)
//
// Every number is stored as 8-byte big-endian, so bbolt's byte order is
// numeric order. A deleted key keeps its fence, so that it outlives the
// delete (G2), in the tombstones bucket: a key is in keys or in tombstones,
// never both, and a scan walks only the live keys. Schema version 1 kept
// deleted keys in keys with the live flag cleared; Open moves them (see
// Upgrade).
//
// The package has no goroutines and no clocks. A Tx is used by one goroutine
// at a time; the caller decides when it commits.
package kv
