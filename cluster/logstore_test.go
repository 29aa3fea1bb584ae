package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wal"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// smallSegments makes segments roll over every few entries.
func smallSegments(t *testing.T) {
	old := segmentSize
	segmentSize = 600
	t.Cleanup(func() { segmentSize = old })
}

func testEntry(rng *rand.Rand, index, term uint64) *raft.Log {
	l := &raft.Log{Index: index, Term: term, Type: raft.LogType(rng.IntN(4))}
	if n := rng.IntN(120); n > 0 {
		l.Data = fmt.Appendf(nil, "%d/%d/%s", index, term, bytes.Repeat([]byte{'x'}, n))
	}
	if rng.IntN(3) == 0 {
		l.Extensions = fmt.Appendf(nil, "ext%d", index)
	}
	if rng.IntN(2) == 0 {
		l.AppendedAt = time.Unix(0, rng.Int64N(1<<62))
	}
	return l
}

func sameEntry(a, b *raft.Log) bool {
	return a.Index == b.Index && a.Term == b.Term && a.Type == b.Type && bytes.Equal(a.Data, b.Data) &&
		bytes.Equal(a.Extensions, b.Extensions) && a.AppendedAt.Equal(b.AppendedAt)
}

// logModel is what the store must hold: entries first..last, and the
// newest content ever stored at each index (entries deleted from the front
// may come back after a reopen, as they were).
type logModel struct {
	first, last uint64
	newest      map[uint64]*raft.Log
}

func (m *logModel) check(t *testing.T, s *logStore, when string) {
	t.Helper()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != m.first || last != m.last {
		t.Fatalf("%s: store holds %d-%d, want %d-%d", when, first, last, m.first, m.last)
	}
	for i := m.first; m.first != 0 && i <= m.last; i++ {
		var got raft.Log
		if err := s.GetLog(i, &got); err != nil {
			t.Fatalf("%s: get %d: %v", when, i, err)
		}
		if !sameEntry(&got, m.newest[i]) {
			t.Fatalf("%s: entry %d = %+v, want %+v", when, i, got, *m.newest[i])
		}
	}
	var l raft.Log
	for _, i := range []uint64{m.first - 1, m.last + 1, m.last + 100} {
		if i == 0 || m.first != 0 && i >= m.first && i <= m.last {
			continue
		}
		if err := s.GetLog(i, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("%s: get %d outside %d-%d: %v, want ErrLogNotFound", when, i, m.first, m.last, err)
		}
	}
}

// TestLogStoreModel runs random appends, deletions from the front and the
// back (as raft makes them: compaction, a follower's diverged entries, a
// snapshot installed over everything) and reopens against a model, with
// segments small enough that every operation crosses several.
func TestLogStoreModel(t *testing.T) {
	smallSegments(t)
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			dir := t.TempDir()
			s, err := openLogStore(dir, true)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { s.Close() }()
			m := &logModel{newest: map[uint64]*raft.Log{}}
			term := uint64(1)
			for step := range 300 {
				when := fmt.Sprintf("step %d", step)
				switch op := rng.IntN(10); {
				case op < 6: // append a batch
					next := m.last + 1
					if m.first == 0 && rng.IntN(3) == 0 {
						next = m.last + 1 + uint64(rng.IntN(50)) // after a snapshot
					}
					var batch []*raft.Log
					for i := range 1 + rng.IntN(12) {
						batch = append(batch, testEntry(rng, next+uint64(i), term))
					}
					if err := s.StoreLogs(batch); err != nil {
						t.Fatalf("%s: store: %v", when, err)
					}
					for _, l := range batch {
						m.newest[l.Index] = l
					}
					if m.first == 0 {
						m.first = next
					}
					m.last = batch[len(batch)-1].Index
				case op == 6 && m.first != 0: // compaction
					hi := m.first + uint64(rng.IntN(int(m.last-m.first+1)))
					if err := s.DeleteRange(m.first, hi); err != nil {
						t.Fatalf("%s: delete %d-%d: %v", when, m.first, hi, err)
					}
					if hi == m.last {
						m.first, m.last = 0, 0
					} else {
						m.first = hi + 1
					}
				case op == 7 && m.first != 0 && m.last > m.first: // a diverged suffix
					lo := m.first + 1 + uint64(rng.IntN(int(m.last-m.first)))
					if err := s.DeleteRange(lo, m.last); err != nil {
						t.Fatalf("%s: delete %d-%d: %v", when, lo, m.last, err)
					}
					m.last = lo - 1
					term++ // a new leader's entries follow
				case op == 8: // reopen
					if err := s.Close(); err != nil {
						t.Fatal(err)
					}
					if s, err = openLogStore(dir, true); err != nil {
						t.Fatalf("%s: reopen: %v", when, err)
					}
					// Entries deleted from the front of a segment still
					// there come back, as they were.
					if first, _ := s.FirstIndex(); first != 0 && first < m.first {
						m.first = first
					}
				case op == 9 && m.first != 0 && m.last > m.first: // a middle range is refused
					if err := s.DeleteRange(m.first+1, m.last-1); err == nil && m.last-m.first >= 2 {
						t.Fatalf("%s: deleting a middle range succeeded", when)
					}
				}
				m.check(t, s, when)
			}
		})
	}
}

// TestLogStoreSegments: compaction removes the segments wholly below the
// new first entry, truncation those above the cut, and a reopen finds the
// rest.
func TestLogStoreSegments(t *testing.T) {
	smallSegments(t)
	dir := t.TempDir()
	s, err := openLogStore(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := uint64(1); i <= 200; i += 4 {
		if err := s.StoreLogs([]*raft.Log{testEntry(rng, i, 1), testEntry(rng, i+1, 1), testEntry(rng, i+2, 1), testEntry(rng, i+3, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	files := func() int {
		names, err := segmentFiles(dir)
		if err != nil {
			t.Fatal(err)
		}
		return len(names)
	}
	before := files()
	if before < 10 {
		t.Fatalf("%d segments for 200 entries; want many", before)
	}
	if err := s.DeleteRange(1, 150); err != nil {
		t.Fatal(err)
	}
	afterCompaction := files()
	if afterCompaction >= before/2 {
		t.Fatalf("compaction to 151 left %d of %d segments", afterCompaction, before)
	}
	if err := s.DeleteRange(170, 200); err != nil {
		t.Fatal(err)
	}
	if n := files(); n >= afterCompaction {
		t.Fatalf("truncation at 170 left %d of %d segments", n, afterCompaction)
	}
	s.Close()
	s, err = openLogStore(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first > 151 || first < 140 || last != 169 {
		t.Fatalf("reopened: %d-%d; want about 151-169", first, last)
	}
	if err := s.StoreLogs([]*raft.Log{testEntry(rng, 170, 2)}); err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	if err := s.GetLog(170, &l); err != nil || l.Term != 2 {
		t.Fatalf("entry 170 after the truncation: %+v, %v", l, err)
	}
}

// TestLogStoreCrash: a torn last record (the one write a crash can cut) is
// dropped and the log goes on from the entry before it; damage anywhere
// else stops Open with wal.ErrCorrupt, and a record damaged after Open is
// refused when read.
func TestLogStoreCrash(t *testing.T) {
	smallSegments(t)
	build := func(t *testing.T) (string, []segmentFile) {
		dir := t.TempDir()
		s, err := openLogStore(dir, false)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(3, 4))
		for i := uint64(1); i <= 60; i++ {
			if err := s.StoreLogs([]*raft.Log{testEntry(rng, i, 1)}); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		files, _ := segmentFiles(dir)
		if len(files) < 3 {
			t.Fatalf("%d segments", len(files))
		}
		return dir, files
	}
	// lastRecord returns the offset of the last record of a segment.
	lastRecord := func(t *testing.T, f segmentFile) int64 {
		recs, _, err := wal.Read(f.path, f.first-1)
		if err != nil || len(recs) == 0 {
			t.Fatalf("%s: %d records, %v", f.path, len(recs), err)
		}
		return recs[len(recs)-1].Offset
	}
	header := wal.RecordSize(0)

	t.Run("torn last record", func(t *testing.T) {
		dir, files := build(t)
		newest := files[len(files)-1]
		if err := os.Truncate(newest.path, lastRecord(t, newest)+header+3); err != nil {
			t.Fatal(err)
		}
		s, err := openLogStore(dir, false)
		if err != nil {
			t.Fatalf("open after a torn last write: %v", err)
		}
		defer s.Close()
		if last, _ := s.LastIndex(); last != 59 {
			t.Fatalf("last = %d after the torn entry 60; want 59", last)
		}
		if err := s.StoreLogs([]*raft.Log{{Index: 60, Term: 2, Data: []byte("again")}}); err != nil {
			t.Fatal(err)
		}
		var l raft.Log
		if err := s.GetLog(60, &l); err != nil || string(l.Data) != "again" {
			t.Fatalf("entry 60 = %+v, %v", l, err)
		}
	})
	t.Run("torn last record of a full segment", func(t *testing.T) {
		// A batch whose first entry filled the segment and whose second
		// was torn: the next entry starts a new segment, and the torn
		// bytes must not be left behind in the one before it (the next
		// start refused the log: a damaged record with newer segments
		// after it).
		dir, files := build(t)
		s, err := openLogStore(dir, false)
		if err != nil {
			t.Fatal(err)
		}
		big := &raft.Log{Index: 61, Term: 1, Data: bytes.Repeat([]byte("b"), int(segmentSize))}
		if err := s.StoreLogs([]*raft.Log{big, {Index: 62, Term: 1, Data: []byte("torn")}}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		newest := files[len(files)-1]
		if err := os.Truncate(newest.path, lastRecord(t, newest)+header+3); err != nil {
			t.Fatal(err)
		}
		for i, want := range []uint64{61, 62} {
			s, err := openLogStore(dir, false)
			if err != nil {
				t.Fatalf("open %d after the torn entry 62: %v", i+1, err)
			}
			if last, _ := s.LastIndex(); last != want {
				t.Fatalf("open %d: last = %d; want %d", i+1, last, want)
			}
			if i == 0 {
				if err := s.StoreLogs([]*raft.Log{{Index: 62, Term: 2, Data: []byte("again")}}); err != nil {
					t.Fatal(err)
				}
			}
			s.Close()
		}
	})
	t.Run("damaged record of an older segment", func(t *testing.T) {
		dir, files := build(t)
		flip(t, files[0].path, lastRecord(t, files[0])+header+2)
		wantCorrupt(t, dir, "a damaged record in the oldest segment")
	})
	t.Run("damaged record before the last", func(t *testing.T) {
		dir, files := build(t)
		flip(t, files[len(files)-1].path, header+2) // the newest segment's first record, with more after it
		wantCorrupt(t, dir, "a damaged record inside the newest segment")
	})
	t.Run("missing segment", func(t *testing.T) {
		dir, files := build(t)
		if err := os.Remove(files[1].path); err != nil {
			t.Fatal(err)
		}
		wantCorrupt(t, dir, "a segment missing")
	})
	t.Run("damaged after open", func(t *testing.T) {
		dir, files := build(t)
		s, err := openLogStore(dir, false)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		flip(t, files[0].path, header+2)
		var l raft.Log
		if err := s.GetLog(1, &l); !errors.Is(err, wal.ErrCorrupt) {
			t.Fatalf("get of a record damaged since open: %v, want ErrCorrupt", err)
		}
	})
}

// TestLogStoreRemovalCrash: deleting a suffix of the log (a follower's
// diverged entries) or all of it (after a snapshot is installed) removes
// several segments; a crash before any one of the removals (here, the
// removal fails and the files are reopened as they are) must leave a log
// that opens: a prefix of what it held, without gaps, which the deletion
// then finishes. Removing the oldest segment first would leave a gap
// (ErrCorrupt on open: a node that does not start).
func TestLogStoreRemovalCrash(t *testing.T) {
	smallSegments(t)
	const n = 60
	build := func(t *testing.T) (string, []*raft.Log) {
		dir := t.TempDir()
		s, err := openLogStore(dir, false)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		rng := rand.New(rand.NewPCG(5, 6))
		var entries []*raft.Log
		for i := uint64(1); i <= n; i++ {
			e := testEntry(rng, i, 1)
			entries = append(entries, e)
			if err := s.StoreLogs([]*raft.Log{e}); err != nil {
				t.Fatal(err)
			}
		}
		return dir, entries
	}
	for _, tc := range []struct {
		name   string
		lo, hi uint64
	}{
		{"suffix", 10, n}, // from the second segment on
		{"all", 1, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, entries := build(t)
			segs, _ := segmentFiles(dir)
			if len(segs) < 4 {
				t.Fatalf("%d segments; want several to remove", len(segs))
			}
			for crashAt := 0; ; crashAt++ {
				crashDir := t.TempDir()
				fencekvtest.CopyFiles(t, dir, crashDir)
				removed := 0
				removeSegmentFile = func(path string) error {
					if removed == crashAt {
						return errors.New("crashed")
					}
					removed++
					return os.Remove(path)
				}
				s, err := openLogStore(crashDir, false)
				if err != nil {
					t.Fatal(err)
				}
				delErr := s.DeleteRange(tc.lo, tc.hi)
				s.Close()
				removeSegmentFile = os.Remove
				if delErr == nil && removed < crashAt {
					break // every removal done before the crash point
				}
				s, err = openLogStore(crashDir, false)
				if err != nil {
					t.Fatalf("crash before removal %d: reopen: %v", crashAt+1, err)
				}
				first, _ := s.FirstIndex()
				last, _ := s.LastIndex()
				if delErr != nil && (first != 1 || last < tc.lo-1) {
					t.Fatalf("crash before removal %d: log %d-%d; want a prefix 1-x with x >= %d", crashAt+1, first, last, tc.lo-1)
				}
				for i := first; i <= last && i > 0; i++ {
					var l raft.Log
					if err := s.GetLog(i, &l); err != nil || !sameEntry(&l, entries[i-1]) {
						t.Fatalf("crash before removal %d: entry %d = %+v, %v", crashAt+1, i, l, err)
					}
				}
				// Raft deletes again and goes on.
				if err := s.DeleteRange(tc.lo, tc.hi); err != nil {
					t.Fatal(err)
				}
				next := &raft.Log{Index: tc.lo, Term: 2, Data: []byte("new")}
				if err := s.StoreLogs([]*raft.Log{next}); err != nil {
					t.Fatalf("crash before removal %d: storing %d after the deletion: %v", crashAt+1, tc.lo, err)
				}
				s.Close()
				if crashAt > len(segs) {
					t.Fatalf("%d removals for %d segments", crashAt, len(segs))
				}
			}
		})
	}
}

// TestLogStoreSyncsBeforeReturning: StoreLogs returns only after one sync
// that covers every entry it was given (a follower acknowledges entries,
// and a leader counts its own, once StoreLogs returns); without sync on,
// none.
func TestLogStoreSyncsBeforeReturning(t *testing.T) {
	for _, noSync := range []bool{false, true} {
		s, err := openLogStore(t.TempDir(), noSync)
		if err != nil {
			t.Fatal(err)
		}
		var synced []int64 // the segment's size at each sync
		old := syncSegment
		syncSegment = func(l *wal.Log) error {
			synced = append(synced, l.Size())
			return old(l)
		}
		err = s.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Data: []byte("a")}, {Index: 2, Term: 1}, {Index: 3, Term: 1, Data: []byte("c")}})
		syncSegment = old
		if err != nil {
			t.Fatal(err)
		}
		size := s.segs[len(s.segs)-1].log.Size()
		switch {
		case noSync && len(synced) != 0:
			t.Errorf("noSync: %d syncs", len(synced))
		case !noSync && (len(synced) != 1 || synced[0] != size):
			t.Errorf("syncs at sizes %v; want one, at %d (all three entries)", synced, size)
		}
		s.Close()
	}
}

// TestLogStoreWriteFails: once a write fails, the log takes nothing more
// (Failed says why, and the node reports itself not ready); what was
// synced before is there after a restart.
func TestLogStoreWriteFails(t *testing.T) {
	dir := t.TempDir()
	s, err := openLogStore(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 3; i++ {
		if err := s.StoreLogs([]*raft.Log{{Index: i, Term: 1, Data: []byte("ok")}}); err != nil {
			t.Fatal(err)
		}
	}
	s.segs[0].log.Close() // the next write fails, as on a failing disk
	if err := s.StoreLogs([]*raft.Log{{Index: 4, Term: 1}}); err == nil {
		t.Fatal("a write to a closed file succeeded")
	}
	if s.Failed() == nil {
		t.Fatal("Failed is nil after a failed write")
	}
	if err := s.StoreLogs([]*raft.Log{{Index: 4, Term: 1}}); err == nil || !strings.Contains(err.Error(), "restart the node") {
		t.Fatalf("a write after the failure: %v, want the failure", err)
	}
	if err := s.DeleteRange(3, 3); err == nil {
		t.Fatal("a deletion after the failure succeeded")
	}
	s.Close()
	s, err = openLogStore(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if last, _ := s.LastIndex(); last != 3 || s.Failed() != nil {
		t.Fatalf("after a restart: last %d, failed %v; want 3, nil", last, s.Failed())
	}
}

// wantCorrupt: opening the log in dir fails with wal.ErrCorrupt.
func wantCorrupt(t *testing.T, dir, what string) {
	t.Helper()
	s, err := openLogStore(dir, false)
	if s != nil {
		s.Close()
	}
	if !errors.Is(err, wal.ErrCorrupt) {
		t.Fatalf("open with %s: %v, want ErrCorrupt", what, err)
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestLogStoreConcurrentReads: raft's replication reads entries while its
// leader loop appends and compacts (run with -race).
func TestLogStoreConcurrentReads(t *testing.T) {
	smallSegments(t)
	s, err := openLogStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 9))
			for {
				select {
				case <-stop:
					return
				default:
				}
				first, _ := s.FirstIndex()
				last, _ := s.LastIndex()
				if first == 0 {
					continue
				}
				i := first + uint64(rng.IntN(int(last-first+1)))
				var l raft.Log
				err := s.GetLog(i, &l)
				if err != nil && !errors.Is(err, raft.ErrLogNotFound) {
					t.Errorf("get %d: %v", i, err)
					return
				}
				if err == nil && (l.Index != i || string(l.Data) != fmt.Sprint(i)) {
					t.Errorf("get %d = %d %q", i, l.Index, l.Data)
					return
				}
			}
		})
	}
	for i := uint64(1); i <= 3000; i++ {
		if err := s.StoreLogs([]*raft.Log{{Index: i, Term: 1, Data: []byte(fmt.Sprint(i))}}); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			if err := s.DeleteRange(1, i-50); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
}

// TestMoveLog: a node whose raft log is in raft.db (an older fencekv) gets
// it moved into the log directory, entry for entry, and raft.db keeps only
// the term and vote; a move cut short is redone.
func TestMoveLog(t *testing.T) {
	dir := t.TempDir()
	bolt := oldStore(t, dir)
	rng := rand.New(rand.NewPCG(5, 6))
	var want []*raft.Log
	for i := uint64(40); i < 640; i++ {
		want = append(want, testEntry(rng, i, 3))
	}
	if err := bolt.StoreLogs(want); err != nil {
		t.Fatal(err)
	}
	if err := bolt.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(dir, raftLogDir)
	// A move cut short: its copy beside the log dir is dropped and redone.
	if err := os.MkdirAll(logDir+".moving", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := moveLog(bolt, logDir, true, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(logDir + ".moving"); !os.IsNotExist(err) {
		t.Fatalf("the move's copy is still there: %v", err)
	}
	if last, _ := bolt.LastIndex(); last != 0 {
		t.Fatalf("raft.db still holds entries up to %d", last)
	}
	if term, _ := bolt.GetUint64([]byte("CurrentTerm")); term != 3 {
		t.Fatalf("raft.db's term = %d, want 3", term)
	}
	s, err := openLogStore(logDir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := &logModel{first: 40, last: 639, newest: map[uint64]*raft.Log{}}
	for _, l := range want {
		m.newest[l.Index] = l
	}
	m.check(t, s, "moved")
	// Moved, but raft.db's copy not yet deleted (a crash in between):
	// the next start only deletes it.
	if err := bolt.StoreLogs(want[:5]); err != nil {
		t.Fatal(err)
	}
	if err := moveLog(bolt, logDir, true, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if last, _ := bolt.LastIndex(); last != 0 {
		t.Fatalf("raft.db still holds entries up to %d", last)
	}
	m.check(t, s, "after the second start")
}

// oldStore opens raft.db in dir as nodes kept it before raft-log: raft's
// log, term and vote in raft-boltdb.
func oldStore(t *testing.T, dir string) *raftboltdb.BoltStore {
	t.Helper()
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, raftFile), NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	return bolt
}

// TestMoveLogAfterGap: raft-boltdb's log has a gap where raft restored a
// snapshot (entries before it were left behind); only the run after the
// gap is moved.
func TestMoveLogAfterGap(t *testing.T) {
	dir := t.TempDir()
	bolt := oldStore(t, dir)
	rng := rand.New(rand.NewPCG(8, 9))
	var before, after []*raft.Log
	for i := uint64(1); i <= 4; i++ {
		before = append(before, testEntry(rng, i, 1))
	}
	for i := uint64(6); i <= 30; i++ { // 5 is the restored snapshot's index
		after = append(after, testEntry(rng, i, 2))
	}
	if err := bolt.StoreLogs(append(before, after...)); err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(dir, raftLogDir)
	if err := moveLog(bolt, logDir, true, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	s, err := openLogStore(logDir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := &logModel{first: 6, last: 30, newest: map[uint64]*raft.Log{}}
	for _, l := range after {
		m.newest[l.Index] = l
	}
	m.check(t, s, "moved")
	if last, _ := bolt.LastIndex(); last != 0 {
		t.Fatalf("raft.db still holds entries up to %d", last)
	}
}
