package wal

import (
	"path/filepath"
	"testing"
)

// BenchmarkAppend measures Append of one 128-byte record, the hot path the
// failpoints (package diskfault) sit on: run it with and without -tags
// failpoints to see that the default build pays nothing for them (its
// `if diskfault.Enabled` blocks are compiled out; `go build -gcflags=-S
// ./wal` shows no call to diskfault.Hit).
func BenchmarkAppend(b *testing.B) {
	l, _, _, err := Open(filepath.Join(b.TempDir(), "log"), 0)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	p := make([]byte, 128)
	b.SetBytes(int64(RecordSize(len(p))))
	for i := 0; b.Loop(); i++ {
		if i%4096 == 0 {
			l.Reset()
		}
		if err := l.Append(uint64(i+1), p); err != nil {
			b.Fatal(err)
		}
	}
}
