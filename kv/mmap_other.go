//go:build !unix

package kv

// initialMmapSize is 0 (the file's size) where mapping past the end of
// the file would grow it (Windows).
const initialMmapSize = 0
