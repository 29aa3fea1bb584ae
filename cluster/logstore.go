package cluster

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencekv/fencekv/wal"
	"github.com/hashicorp/raft"
)

// logStore is raft's log on the project's write-ahead log (package wal):
// segment files of checksummed records numbered by raft index, appended
// and made durable with one fdatasync per StoreLogs. raft-boltdb commits a
// bbolt transaction per batch instead (page writes and two fdatasyncs), and
// a raft round waits for the leader's log write and then a follower's: with
// fsyncs off, fenced puts ran 2.2x as fast at 64 clients and 3.5x at one.
// raft-boltdb stays the stable store (term and vote, rarely written).
//
// The log is a directory of segments named by the index of their first
// entry (%020d.seg). Entries are appended to the newest segment; a new one
// is started once it is over segmentSize. raft deletes the log's oldest
// entries after a snapshot (whole segments below the cut are removed; the
// rest stay until their segment goes, and come back as the first entries
// after a restart, which raft deletes again) and, on a follower whose log
// diverged from a new leader's, its newest entries (later segments are
// removed, then the segment holding the cut is truncated there and
// synced). After a crash, a torn last record of the newest segment is
// cut off at open (it was never synced, so never acknowledged); damage
// anywhere else fails Open with wal.ErrCorrupt.
type logStore struct {
	dir    string
	noSync bool

	wmu sync.Mutex // serializes the changes: StoreLogs and DeleteRange

	mu     sync.RWMutex // guards what follows; readers hold it while they read a record
	segs   []*segment   // by first index
	first  uint64       // 0 when empty
	locs   []entryLoc   // locs[i] is where entry first+i is
	failed error        // a failed write or sync: the state of the files is unknown
	closed bool
	buf    []byte

	busy busyClock // when the running append and sync began (stall.go)
}

type segment struct {
	segmentFile
	log *wal.Log
}

type entryLoc struct {
	seg *segment
	off int64
	n   int // payload length
}

// syncSegment makes a segment's appended records durable; raft counts an
// entry stored (and a follower acknowledges it) once StoreLogs returns, so
// the sync comes first (a test watches it).
var syncSegment = (*wal.Log).Sync

// segmentSize is the size past which StoreLogs starts a new segment (tests
// make it small).
var segmentSize int64 = 64 << 20

const segSuffix = ".seg"

var (
	_ raft.LogStore          = (*logStore)(nil)
	_ raft.MonotonicLogStore = (*logStore)(nil)
)

// IsMonotonic tells raft that entries are stored without gaps: after it
// installs a snapshot, or restores one, it deletes the whole log (where
// with raft-boltdb it left a gap before the next entry).
func (s *logStore) IsMonotonic() bool { return true }

// openLogStore opens (or creates) the log in dir.
func openLogStore(dir string, noSync bool) (*logStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: raft log: %w", err)
	}
	files, err := segmentFiles(dir)
	if err != nil {
		return nil, err
	}
	s := &logStore{dir: dir, noSync: noSync}
	for i, f := range files {
		l, recs, tail, err := wal.Open(f.path, f.first-1)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("cluster: raft log: %w", err)
		}
		l.SetFaultPoints("raftlog")
		seg := &segment{segmentFile: f, log: l}
		s.segs = append(s.segs, seg)
		if err := checkSegment(f, recs, tail, i == len(files)-1, s.last()); err != nil {
			s.Close()
			return nil, err
		}
		if tail.Torn {
			// The newest segment's last write was torn (checkSegment
			// allows it nowhere else). Cut it off now: were the segment
			// full, the next entry would start a new one, leaving the torn
			// record in a segment that newer ones follow, which the next
			// start would refuse as damage.
			if err := l.Truncate(tail.Offset); err != nil {
				s.Close()
				return nil, fmt.Errorf("cluster: raft log: cutting the torn last write of %s: %w", f.path, err)
			}
		}
		if len(recs) > 0 && s.first == 0 {
			s.first = f.first
		}
		for _, r := range recs {
			s.locs = append(s.locs, entryLoc{seg: seg, off: r.Offset, n: len(r.Payload)})
		}
	}
	return s, nil
}

// checkSegment checks what wal read from segment f against the segments
// before it, which end at entry last (0 if none holds any): only the
// newest segment may end in a torn record or be empty, and each continues
// the one before.
func checkSegment(f segmentFile, recs []wal.Record, tail wal.Tail, newest bool, last uint64) error {
	path, first := f.path, f.first
	switch {
	case tail.Torn && !newest:
		return fmt.Errorf("cluster: raft log: %s ends in a damaged record (%s), and newer segments follow: "+
			"this is not a torn last write; restore the node's data dir from a backup: %w",
			path, tail.Reason, wal.ErrCorrupt)
	case len(recs) == 0 && !newest:
		return fmt.Errorf("cluster: raft log: segment %s is empty and newer segments follow: %w", path, wal.ErrCorrupt)
	case len(recs) > 0 && last != 0 && first != last+1:
		return fmt.Errorf("cluster: raft log: segment %s starts at entry %d, but the one before ends at %d: %w",
			path, first, last, wal.ErrCorrupt)
	}
	return nil
}

// LogReport is what CheckLog found in a cluster node's raft log.
type LogReport struct {
	Dir      string `json:"dir"`
	OK       bool   `json:"ok"`
	Segments int    `json:"segments"`
	Entries  uint64 `json:"entries"`
	First    uint64 `json:"first,omitempty"`
	Last     uint64 `json:"last,omitempty"`
	Torn     bool   `json:"torn"` // the newest segment ends in a torn record, which the next start drops
	Error    string `json:"error,omitempty"`
}

// CheckLog reads the raft log of the cluster node whose data dir is
// dataDir, changing nothing (fencekv check): every segment's records and
// checksums, and that the segments follow one another. It returns nil if
// the dir has no raft log (a single node's, or a node's from before the
// log left raft.db).
func CheckLog(dataDir string) *LogReport {
	dir := filepath.Join(dataDir, raftLogDir)
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	r := &LogReport{Dir: dir}
	files, err := segmentFiles(dir)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Segments = len(files)
	for i, f := range files {
		recs, tail, err := wal.Read(f.path, f.first-1)
		if err == nil {
			err = checkSegment(f, recs, tail, i == len(files)-1, r.Last)
		}
		if err != nil {
			r.Error = err.Error()
			return r
		}
		if len(recs) > 0 {
			if r.First == 0 {
				r.First = f.first
			}
			r.Last = recs[len(recs)-1].LSN
			r.Entries += uint64(len(recs))
		}
		r.Torn = tail.Torn
	}
	r.OK = true
	return r
}

// segmentFile is a segment's file: its path, and the index of its first
// entry, which names it.
type segmentFile struct {
	path  string
	first uint64
}

// segmentFiles lists the segment files in dir, oldest first.
func segmentFiles(dir string) ([]segmentFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cluster: raft log: %w", err)
	}
	var files []segmentFile
	for _, e := range entries {
		num, ok := strings.CutSuffix(e.Name(), segSuffix)
		first, err := strconv.ParseUint(num, 10, 64)
		if !ok || err != nil || first == 0 || len(num) != 20 {
			continue
		}
		files = append(files, segmentFile{path: filepath.Join(dir, e.Name()), first: first})
	}
	slices.SortFunc(files, func(a, b segmentFile) int { return cmp.Compare(a.first, b.first) })
	return files, nil
}

func segmentPath(dir string, first uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%020d%s", first, segSuffix))
}

// last is the last entry's index, or 0 if the log is empty. Called with
// mu held.
func (s *logStore) last() uint64 {
	if len(s.locs) == 0 {
		return 0
	}
	return s.first + uint64(len(s.locs)) - 1
}

// FirstIndex is the first entry's index, or 0 if the log is empty.
func (s *logStore) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.first, nil
}

// LastIndex is the last entry's index, or 0 if the log is empty.
func (s *logStore) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.last(), nil
}

// GetLog reads entry index into out.
func (s *logStore) GetLog(index uint64, out *raft.Log) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if index < s.first || index-s.first >= uint64(len(s.locs)) {
		return raft.ErrLogNotFound
	}
	loc := s.locs[index-s.first]
	lsn, payload, err := loc.seg.log.ReadAt(loc.off, loc.n)
	if err != nil {
		return fmt.Errorf("cluster: raft log entry %d: %w", index, err)
	}
	if lsn != index {
		return fmt.Errorf("cluster: raft log: entry %d read back as %d: %w", index, lsn, wal.ErrCorrupt)
	}
	return decodeEntry(index, payload, out)
}

// StoreLog appends one entry.
func (s *logStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs appends entries, which must follow the last one (or, in an
// empty log, start anywhere: after a snapshot is installed), and syncs
// them once.
func (s *logStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	if err := s.usable(); err != nil {
		s.mu.Unlock()
		return err
	}
	next := s.last() + 1
	if len(s.locs) == 0 {
		next = logs[0].Index
	}
	for i, l := range logs {
		if l.Index != next+uint64(i) {
			s.mu.Unlock()
			return fmt.Errorf("cluster: raft log: storing entry %d where entry %d goes", l.Index, next+uint64(i))
		}
	}
	seg, err := s.segmentFor(next)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	// Appends go beyond what readers look at (last): they need not wait
	// for the writes, nor for the sync below.
	s.mu.Unlock()
	// Encoded into one buffer, then cut into payloads (the buffer may move
	// while it grows); wal writes them in one write.
	ends := make([]int, len(logs))
	s.buf = s.buf[:0]
	for i, l := range logs {
		s.buf = encodeEntry(s.buf, l)
		ends[i] = len(s.buf)
	}
	payloads := make([][]byte, len(logs))
	locs := make([]entryLoc, len(logs))
	off, start := seg.log.Size(), 0
	for i, end := range ends {
		payloads[i] = s.buf[start:end]
		locs[i] = entryLoc{seg: seg, off: off, n: end - start}
		off += wal.RecordSize(end - start)
		start = end
	}
	s.busy.start()
	defer s.busy.done()
	if err := seg.log.Append(next, payloads...); err != nil {
		return s.fail(err) // the records may be torn: no more appends
	}
	if !s.noSync {
		if err := syncSegment(seg.log); err != nil {
			return s.fail(err)
		}
	}
	s.mu.Lock()
	if len(s.locs) == 0 {
		s.first = next
	}
	s.locs = append(s.locs, locs...)
	s.mu.Unlock()
	return nil
}

// Failed is why the log takes no more entries (a write or sync failed, and
// the state of its files is unknown until a restart reads them), or nil.
func (s *logStore) Failed() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.failed
}

// usable is why the log takes no change, or nil. Called with mu held.
func (s *logStore) usable() error {
	if s.closed {
		return errors.New("cluster: raft log closed")
	}
	return s.failed
}

// fail stops the store after a failed write or sync: what the files hold
// is then unknown, so nothing more is written (a restart reads them back).
func (s *logStore) fail(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failLocked(err)
}

// segmentFor returns the segment entry next goes in: the newest, unless
// there is none or it is full, when it starts one. Called with mu held.
func (s *logStore) segmentFor(next uint64) (*segment, error) {
	if n := len(s.segs); n > 0 {
		seg := s.segs[n-1]
		switch {
		case seg.log.Size() == 0 && seg.first != next:
			// Empty and named for other entries (the log is empty, and
			// these start elsewhere): replace it.
			if err := s.removeFrom(n - 1); err != nil {
				return nil, err
			}
		case seg.log.Size() < segmentSize:
			return seg, nil
		}
	}
	path := segmentPath(s.dir, next)
	l, recs, _, err := wal.Open(path, next-1)
	if err == nil && len(recs) > 0 {
		l.Close()
		err = fmt.Errorf("segment %s exists", path)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: raft log: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		l.Close()
		return nil, err
	}
	l.SetFaultPoints("raftlog")
	seg := &segment{segmentFile{path: path, first: next}, l}
	s.segs = append(s.segs, seg)
	return seg, nil
}

// DeleteRange deletes entries min to max, inclusive: the oldest ones (after
// a snapshot), the newest ones (a follower's diverged entries), or all.
func (s *logStore) DeleteRange(lo, hi uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	last := s.last()
	if last == 0 || lo > last || hi < s.first || lo > hi {
		return nil
	}
	lo, hi = max(lo, s.first), min(hi, last)
	switch {
	case lo == s.first && hi == last:
		return s.dropAll()
	case lo == s.first:
		s.locs = s.locs[hi-s.first+1:]
		s.first = hi + 1
		// Remove the segments now wholly below first.
		var gone bool
		for len(s.segs) > 1 && s.segs[1].first <= s.first {
			if err := s.removeOldest(); err != nil {
				return err
			}
			gone = true
		}
		if gone {
			return syncDir(s.dir)
		}
		return nil
	case hi == last:
		return s.truncate(lo)
	}
	return fmt.Errorf("cluster: raft log: deleting entries %d-%d from the middle of %d-%d", lo, hi, s.first, last)
}

// truncate deletes entries from lo on. The later segments go first,
// newest first, each removal made durable before the next: a crash midway
// leaves the log a prefix of what it was, without gaps (with some of the
// entries from lo on still there, which raft deletes again). Called with
// mu held.
func (s *logStore) truncate(lo uint64) error {
	loc := s.locs[lo-s.first]
	k := slices.Index(s.segs, loc.seg)
	if err := s.removeFrom(k + 1); err != nil {
		return err
	}
	if err := loc.seg.log.Truncate(loc.off); err != nil {
		return s.failLocked(err)
	}
	s.locs = s.locs[:lo-s.first]
	return nil
}

// dropAll deletes every entry: raft does so once it has installed or
// restored a snapshot. The newest segment goes first, as in truncate, so a
// crash midway leaves a prefix of the log: entries the snapshot covers,
// which the node drops when it starts again (dropCovered), or that run on
// into it. Called with mu held.
func (s *logStore) dropAll() error {
	if err := s.removeFrom(0); err != nil {
		return err
	}
	s.locs, s.first = nil, 0
	return nil
}

// removeFrom removes segments k on, newest first, syncing the directory
// after each removal so that no older one is gone while a newer one is
// still there. Called with mu held.
func (s *logStore) removeFrom(k int) error {
	for len(s.segs) > k {
		if err := s.removeSegment(s.segs[len(s.segs)-1]); err != nil {
			return err
		}
		s.segs = s.segs[:len(s.segs)-1]
		if err := syncDir(s.dir); err != nil {
			return s.failLocked(err)
		}
	}
	return nil
}

// removeOldest removes the oldest segment (compaction: a crash midway
// leaves the newer ones, still without gaps). Called with mu held.
func (s *logStore) removeOldest() error {
	if err := s.removeSegment(s.segs[0]); err != nil {
		return err
	}
	s.segs = s.segs[1:]
	return nil
}

// removeSegmentFile removes a segment's file (tests stop it midway, as a
// crash would).
var removeSegmentFile = os.Remove

func (s *logStore) removeSegment(seg *segment) error {
	seg.log.Close()
	if err := removeSegmentFile(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return s.failLocked(err)
	}
	return nil
}

func (s *logStore) failLocked(err error) error {
	if s.failed == nil {
		s.failed = fmt.Errorf("cluster: raft log failed; restart the node: %w", err)
	}
	return s.failed
}

// Close closes the segment files.
func (s *logStore) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, seg := range s.segs {
		errs = append(errs, seg.log.Close())
	}
	s.segs, s.closed = nil, true
	return errors.Join(errs...)
}

// syncDir makes the creation and removal of segments in dir durable.
func syncDir(dir string) error {
	if err := wal.SyncDir(dir); err != nil {
		return fmt.Errorf("cluster: raft log: sync %s: %w", dir, err)
	}
	return nil
}

// An entry's payload: term, type, appended-at (Unix nanoseconds, 0 for
// none), then data and extensions, each after its uint32 length.
const entryFixed = 8 + 1 + 8 + 4 + 4

func encodeEntry(b []byte, l *raft.Log) []byte {
	b = binary.BigEndian.AppendUint64(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = binary.BigEndian.AppendUint32(b, uint32(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(l.Extensions)))
	return append(b, l.Extensions...)
}

func decodeEntry(index uint64, b []byte, out *raft.Log) error {
	bad := fmt.Errorf("cluster: raft log entry %d is malformed: %w", index, wal.ErrCorrupt)
	if len(b) < entryFixed {
		return bad
	}
	*out = raft.Log{Index: index, Term: binary.BigEndian.Uint64(b), Type: raft.LogType(b[8])}
	if at := int64(binary.BigEndian.Uint64(b[9:])); at != 0 {
		out.AppendedAt = time.Unix(0, at)
	}
	b = b[17:]
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-8) {
		return bad
	}
	if n > 0 {
		out.Data = b[4 : 4+n]
	}
	b = b[4+n:]
	m := binary.BigEndian.Uint32(b)
	if uint64(m) != uint64(len(b)-4) {
		return bad
	}
	if m > 0 {
		out.Extensions = b[4:]
	}
	return nil
}

// moveLog moves the raft log a node kept in raft.db (before raftLogDir
// existed) into dir, once: it copies the entries into a new log beside dir,
// renames that to dir, and only then deletes them from raft.db. A crash
// midway leaves the entries in raft.db, and the next start moves them
// again.
func moveLog(old raft.LogStore, dir string, noSync bool, log *slog.Logger) error {
	tmp := dir + ".moving"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("cluster: raft log: %w", err)
	}
	first, err := old.FirstIndex()
	if err != nil {
		return fmt.Errorf("cluster: raft log in %s: %w", raftFile, err)
	}
	last, err := old.LastIndex()
	if err != nil {
		return fmt.Errorf("cluster: raft log in %s: %w", raftFile, err)
	}
	if last == 0 {
		return nil
	}
	if files, err := segmentFiles(dir); err == nil && len(files) > 0 {
		// Moved already; the old copy was not yet deleted.
		return old.DeleteRange(first, last)
	}
	// raft-boltdb's log may have a gap: raft restored a snapshot (a
	// cluster seeded from a backup) and left the entries before it. Only
	// the run after the last gap is the log; the snapshot covers the rest.
	from := last
	for from > first {
		var l raft.Log
		if err := old.GetLog(from-1, &l); errors.Is(err, raft.ErrLogNotFound) {
			break
		} else if err != nil {
			return fmt.Errorf("cluster: moving raft's log out of %s: entry %d: %w", raftFile, from-1, err)
		}
		from--
	}
	s, err := openLogStore(tmp, noSync)
	if err != nil {
		return err
	}
	const batch = 256
	logs := make([]*raft.Log, 0, batch)
	for i := from; i <= last; i++ {
		l := new(raft.Log)
		if err := old.GetLog(i, l); err != nil {
			s.Close()
			return fmt.Errorf("cluster: moving raft's log out of %s: entry %d: %w", raftFile, i, err)
		}
		if logs = append(logs, l); len(logs) == batch || i == last {
			if err := s.StoreLogs(logs); err != nil {
				s.Close()
				return err
			}
			logs = logs[:0]
		}
	}
	if err := s.Close(); err != nil {
		return fmt.Errorf("cluster: raft log: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil { // absent, or without segments
		return fmt.Errorf("cluster: raft log: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("cluster: raft log: %w", err)
	}
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := old.DeleteRange(first, last); err != nil {
		return fmt.Errorf("cluster: raft log: deleting the moved entries from %s: %w", raftFile, err)
	}
	log.Info("moved raft's log out of "+raftFile, "entries", last-from+1, "dir", dir)
	return nil
}
