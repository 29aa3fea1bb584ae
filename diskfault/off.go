//go:build !failpoints

package diskfault

import "io"

// Enabled reports whether this is a build with failpoints (-tags
// failpoints). It is a constant, so that `if diskfault.Enabled` blocks
// compile away in the default build.
const Enabled = false

// Hit is a failpoint; in the default build it does nothing.
func Hit(point string) error { return nil }

// LogOpened, LogWrite, LogSynced, LogTruncated and DataCommitted are the
// power-loss recorder's hooks; in the default build they do nothing.
func LogOpened(path string, data []byte)                       {}
func LogWrite(path string, off, n int64)                       {}
func LogSynced(path string, f io.ReaderAt)                     {}
func LogTruncated(path string, f io.ReaderAt, off int64)       {}
func DataCommitted(path string, writeTo func(io.Writer) error) {}
