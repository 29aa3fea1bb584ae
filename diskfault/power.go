package diskfault

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// PowerLossEnv names the environment variable that turns the power-loss
// recorder on (in a build with -tags failpoints): the dir it records in.
const PowerLossEnv = "FENCEKV_POWERLOSS_DIR"

const journalFile = "journal"

// Mode is what a simulated power cut keeps of the writes no fsync covered.
type Mode string

const (
	// Clean keeps none of them: every log is what its syncs made durable.
	Clean Mode = "clean"
	// Partial keeps the first half (rounded up) of each log's unsynced
	// writes, whole: the disk wrote some of the dirty pages, in order.
	Partial Mode = "partial"
	// Torn keeps them all, but the last one only up to the middle of its
	// last record: that record is cut short (past the file's end) or,
	// where it overwrote older bytes, garbled (its checksum fails).
	Torn Mode = "torn"
)

// FileCut is what PowerCut did to one file.
type FileCut struct {
	Path     string
	Kind     string // "log" or "data"
	Size     int64  // its size as the killed process left it
	Durable  int64  // the length of what the syncs made durable (a log) or of the last committed image (data)
	Unsynced int    // a log's writes after its last sync
	Kept     int    // of those, how many the rebuilt file holds (the last one cut, if Torn)
	Torn     bool   // its last kept write was cut in half
}

func (f FileCut) String() string {
	if f.Kind == "data" {
		return fmt.Sprintf("%s: data file %d bytes -> last committed image, %d bytes", f.Path, f.Size, f.Durable)
	}
	s := fmt.Sprintf("%s: log %d bytes -> %d durable", f.Path, f.Size, f.Durable)
	if f.Unsynced > 0 {
		s += fmt.Sprintf(", %d of %d unsynced writes kept", f.Kept, f.Unsynced)
		if f.Torn {
			s += ", the last one torn"
		}
	}
	return s
}

// Cut is PowerCut's report.
type Cut struct {
	Mode  Mode
	Files []FileCut
}

// Torn is how many logs got a torn last write.
func (c Cut) Torn() int {
	n := 0
	for _, f := range c.Files {
		if f.Torn {
			n++
		}
	}
	return n
}

// Unsynced is how many unsynced writes the killed process left, in all.
func (c Cut) Unsynced() int {
	n := 0
	for _, f := range c.Files {
		n += f.Unsynced
	}
	return n
}

func (c Cut) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "power cut (%s):", c.Mode)
	for _, f := range c.Files {
		b.WriteString("\n  " + f.String())
	}
	return b.String()
}

// shadowName is the name, in the recorder's dir, of what it keeps of the
// file at path (an absolute path).
func shadowName(path string) string {
	h := fnv.New64a()
	h.Write([]byte(path))
	return fmt.Sprintf("%s-%016x", filepath.Base(path), h.Sum64())
}

type logRec struct {
	shadow  string
	pending [][2]int64 // off, n
}

// readJournal reads the recorder's journal: the logs (by path) with their
// shadows and unsynced writes, and the data files' last images.
func readJournal(recDir string) (map[string]*logRec, map[string]string, error) {
	f, err := os.Open(filepath.Join(recDir, journalFile))
	if err != nil {
		return nil, nil, fmt.Errorf("diskfault: power cut: %w (was %s set?)", err, PowerLossEnv)
	}
	defer f.Close()
	logs, data := map[string]*logRec{}, map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		q := strings.Index(text, ` "`)
		if q < 0 {
			continue // a line cut short by the kill
		}
		path, err := strconv.Unquote(text[q+1:])
		if err != nil {
			continue
		}
		fields := strings.Fields(text[:q])
		bad := fmt.Errorf("diskfault: power cut: %s line %d: %q", journalFile, n, text)
		switch {
		case len(fields) == 2 && fields[0] == "o":
			logs[path] = &logRec{shadow: fields[1]}
		case len(fields) == 2 && fields[0] == "d":
			data[path] = fields[1]
		case len(fields) == 3 && fields[0] == "w":
			off, err1 := strconv.ParseInt(fields[1], 10, 64)
			k, err2 := strconv.ParseInt(fields[2], 10, 64)
			l := logs[path]
			if err1 != nil || err2 != nil || l == nil {
				return nil, nil, bad
			}
			l.pending = append(l.pending, [2]int64{off, k})
		case len(fields) == 1 && fields[0] == "s", len(fields) == 2 && fields[0] == "t":
			if l := logs[path]; l != nil {
				l.pending = nil
			}
		default:
			return nil, nil, bad
		}
	}
	return logs, data, sc.Err()
}

// PowerCut rebuilds the files of dataDir, whose process was killed
// (SIGKILL: the page cache, and so the files, still hold every write), as
// a power cut would have left them, from what the recorder kept in recDir
// (FENCEKV_POWERLOSS_DIR of that process and of the ones before it on the
// same dir): each log becomes what its syncs made durable, with, per mode,
// some of its unsynced writes; each data file becomes its last committed
// image. Files the recorder never saw are left as they are, and so are the
// dir entries (a removed file stays removed). Call it only between a kill
// and the next start.
func PowerCut(dataDir, recDir string, mode Mode) (Cut, error) {
	cut := Cut{Mode: mode}
	switch mode {
	case Clean, Partial, Torn:
	default:
		return cut, fmt.Errorf("diskfault: power cut: no mode %q (clean, partial, torn)", mode)
	}
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return cut, err
	}
	logs, data, err := readJournal(recDir)
	if err != nil {
		return cut, err
	}
	under := func(path string) bool {
		rel, err := filepath.Rel(dataDir, path)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	var paths []string
	for p := range logs {
		paths = append(paths, p)
	}
	for p := range data {
		if logs[p] == nil {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, path := range paths {
		if !under(path) {
			continue
		}
		fi, err := os.Stat(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return cut, err
		}
		if l := logs[path]; l != nil {
			fc, err := cutLog(path, filepath.Join(recDir, "logs", l.shadow), l.pending, mode)
			if err != nil {
				return cut, err
			}
			fc.Size = fi.Size()
			cut.Files = append(cut.Files, fc)
			continue
		}
		img, err := os.ReadFile(filepath.Join(recDir, "data", data[path]))
		if err != nil {
			return cut, fmt.Errorf("diskfault: power cut: the image of %s: %w", path, err)
		}
		if err := os.WriteFile(path, img, fi.Mode()); err != nil {
			return cut, err
		}
		cut.Files = append(cut.Files, FileCut{Path: path, Kind: "data", Size: fi.Size(), Durable: int64(len(img))})
	}
	return cut, nil
}

// cutLog rewrites the log at path as its shadow (what its syncs made
// durable) with, per mode, some of its unsynced writes, read from the
// file as the killed process left it.
func cutLog(path, shadow string, pending [][2]int64, mode Mode) (FileCut, error) {
	fc := FileCut{Path: path, Kind: "log", Unsynced: len(pending)}
	durable, err := os.ReadFile(shadow)
	if err != nil {
		return fc, fmt.Errorf("diskfault: power cut: the shadow of %s: %w", path, err)
	}
	fc.Durable = int64(len(durable))
	left, err := os.ReadFile(path)
	if err != nil {
		return fc, err
	}
	switch mode {
	case Partial:
		fc.Kept = (len(pending) + 1) / 2
	case Torn:
		fc.Kept = len(pending)
	}
	out := durable
	for i, w := range pending[:fc.Kept] {
		off, n := w[0], w[1]
		if mode == Torn && i == fc.Kept-1 {
			n = tear(left, off, n)
			fc.Torn = true
		}
		end := min(off+n, int64(len(left)))
		if off >= end {
			continue // the kill came before the write
		}
		if int64(len(out)) < end {
			out = append(out, make([]byte, end-int64(len(out)))...)
		}
		copy(out[off:end], left[off:end])
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		return fc, err
	}
	return fc, nil
}

// tear returns how many of the n bytes written at off in data (the file
// as the killed process left it) a torn write keeps: up to the middle of
// the last record they hold. A write is one or more records of package
// wal, each a 16-byte header whose first 4 bytes are the payload's length
// (big-endian); if they do not parse, half the write.
func tear(data []byte, off, n int64) int64 {
	end := min(off+n, int64(len(data)))
	last, p := int64(-1), off
	for p+16 <= end {
		size := 16 + int64(binary.BigEndian.Uint32(data[p:]))
		if p+size > end {
			break
		}
		last, p = p, p+size
	}
	if last < 0 || p != end {
		return max(n/2, 1)
	}
	return last - off + (p-last)/2
}
