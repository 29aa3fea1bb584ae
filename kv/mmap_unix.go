//go:build unix

package kv

// initialMmapSize is how much of the file bbolt maps at first: on Unix
// systems it costs address space, not memory or disk, so 1 GiB spares the
// remaps of a growing file.
const initialMmapSize = 1 << 30
