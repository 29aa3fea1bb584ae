package fencekvtest

import (
	"os"
	"path/filepath"
	"testing"
)

// CopyFiles copies the regular files of dir from into dir to, as they are
// now: with the process that writes them still running, what a kill -9
// would leave on disk.
func CopyFiles(tb testing.TB, from, to string) {
	tb.Helper()
	ents, err := os.ReadDir(from)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
}
