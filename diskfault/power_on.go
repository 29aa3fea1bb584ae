//go:build failpoints

package diskfault

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// The power-loss recorder (see "Power loss" in the package doc): with
// FENCEKV_POWERLOSS_DIR set, the hooks below keep, in that dir, what a
// power cut would leave of each log and data file.

var (
	pmu    sync.Mutex
	recDir = os.Getenv(PowerLossEnv)
	jrnl   *os.File
	dirty  = map[string][]span{} // a log's writes since its last sync
)

// span is a write: n bytes at off.
type span struct{ off, n int64 }

// recording returns the journal, opening it on first use, or nil when
// nothing is recorded. Called with pmu held.
func recording() *os.File {
	if recDir == "" {
		return nil
	}
	if jrnl == nil {
		for _, d := range []string{recDir, filepath.Join(recDir, "logs"), filepath.Join(recDir, "data")} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				die(err)
			}
		}
		f, err := os.OpenFile(filepath.Join(recDir, journalFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			die(err)
		}
		jrnl = f
	}
	return jrnl
}

// die ends the process: a recorder that cannot record would let a test
// pass on a rebuild that does not match what the process did.
func die(err error) {
	fmt.Fprintf(os.Stderr, "diskfault: power-loss recorder: %v\n", err)
	os.Exit(3)
}

func line(j *os.File, format string, args ...any) {
	if _, err := fmt.Fprintf(j, format+"\n", args...); err != nil {
		die(err)
	}
}

func abs(path string) string {
	p, err := filepath.Abs(path)
	if err != nil {
		die(err)
	}
	return p
}

// LogOpened records that the log at path was opened holding data: what
// is on the disk (the process starts on a dir a power cut left, rebuilt
// by PowerCut, or on a new one).
func LogOpened(path string, data []byte) {
	if recDir == "" {
		return
	}
	pmu.Lock()
	defer pmu.Unlock()
	j := recording()
	if j == nil {
		return
	}
	path = abs(path)
	name := shadowName(path)
	if err := writeFile(filepath.Join(recDir, "logs", name), data); err != nil {
		die(err)
	}
	delete(dirty, path)
	line(j, "o %s %q", name, path)
}

// LogWrite records that n bytes are about to be written at off in the log
// at path (not durable until LogSynced).
func LogWrite(path string, off, n int64) {
	if recDir == "" {
		return
	}
	pmu.Lock()
	defer pmu.Unlock()
	j := recording()
	if j == nil {
		return
	}
	path = abs(path)
	dirty[path] = append(dirty[path], span{off, n})
	line(j, "w %d %d %q", off, n, path)
}

// LogSynced records that an fdatasync of f (the log at path) returned:
// the writes since the last one are durable. It copies them from f into
// the log's shadow.
func LogSynced(path string, f io.ReaderAt) { logSynced(path, f, -1) }

// LogTruncated records that the log at path was cut at off and synced.
func LogTruncated(path string, f io.ReaderAt, off int64) { logSynced(path, f, off) }

func logSynced(path string, f io.ReaderAt, cut int64) {
	if recDir == "" {
		return
	}
	pmu.Lock()
	defer pmu.Unlock()
	j := recording()
	if j == nil {
		return
	}
	path = abs(path)
	sh, err := os.OpenFile(filepath.Join(recDir, "logs", shadowName(path)), os.O_RDWR, 0)
	if err != nil {
		die(fmt.Errorf("%s synced, never opened: %w", path, err))
	}
	defer sh.Close()
	for _, s := range dirty[path] {
		n := s.n
		if cut >= 0 {
			n = min(n, cut-s.off)
		}
		if n <= 0 {
			continue
		}
		b := make([]byte, n)
		if _, err := f.ReadAt(b, s.off); err != nil {
			die(fmt.Errorf("read back %s at %d: %w", path, s.off, err))
		}
		if _, err := sh.WriteAt(b, s.off); err != nil {
			die(err)
		}
	}
	delete(dirty, path)
	if cut >= 0 {
		if err := sh.Truncate(cut); err != nil {
			die(err)
		}
		line(j, "t %d %q", cut, path)
		return
	}
	line(j, "s %q", path)
}

// DataCommitted records that a commit of the bbolt file at path returned
// (bbolt synced it): writeTo writes a consistent copy of the file as
// committed, the image a power cut leaves. Also called when the file is
// opened (what is on the disk then).
func DataCommitted(path string, writeTo func(io.Writer) error) {
	if recDir == "" {
		return
	}
	pmu.Lock()
	defer pmu.Unlock()
	j := recording()
	if j == nil {
		return
	}
	path = abs(path)
	name := shadowName(path)
	dst := filepath.Join(recDir, "data", name)
	f, err := os.Create(dst + ".tmp")
	if err != nil {
		die(err)
	}
	err = writeTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// The commit returned; a copy that fails is the recorder's
		// failure, not the store's.
		die(fmt.Errorf("copy %s: %w", path, err))
	}
	if err := os.Rename(dst+".tmp", dst); err != nil {
		die(err)
	}
	line(j, "d %s %q", name, path)
}

func writeFile(path string, data []byte) error {
	if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
