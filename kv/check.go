package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// DamagedError reports a damaged data file: what Open or Check found wrong.
type DamagedError struct {
	Path     string
	Problems []string // the first few problems found, for people
	More     int      // problems found beyond those
}

func (e *DamagedError) Error() string {
	what := strings.Join(e.Problems, "; ")
	if e.More > 0 {
		what += fmt.Sprintf(" (and %d more)", e.More)
	}
	return fmt.Sprintf("kv: data file %s is damaged: %s; restore it from a backup", e.Path, what)
}

// Is makes errors.Is(err, ErrDamaged) true.
func (e *DamagedError) Is(target error) bool { return target == ErrDamaged }

// maxProblems is how many problems a DamagedError lists.
const maxProblems = 10

// problems collects what is wrong with a file, up to maxProblems.
type problems struct {
	list []string
	more int
}

func (p *problems) addf(format string, args ...any) {
	if len(p.list) < maxProblems {
		p.list = append(p.list, fmt.Sprintf(format, args...))
	} else {
		p.more++
	}
}

func (p *problems) count() int { return len(p.list) + p.more }

func (p *problems) err(path string) error {
	if len(p.list) == 0 {
		return nil
	}
	return &DamagedError{Path: path, Problems: p.list, More: p.more}
}

// Report is what Check read from a sound data file.
type Report struct {
	Schema     int      // the file's schema version: SchemaVersion, or an older one Open upgrades
	Applied    uint64   // the last write-ahead log record the file reflects (wal_applied)
	Revision   Revision // the store's revision
	LastToken  Token    // the last token issued
	LiveKeys   uint64   // live keys, as counted by the file's counter
	Keys       int      // key records, live or deleted (a deleted key keeps its fence)
	Tombstones int      // of those, deleted keys' records
	Locks      int      // lock records
	Pages      int      // pages in use (the file's high-water mark)
	PageSize   int
}

// checkLockTimeout is how long Check waits for the file lock.
const checkLockTimeout = 100 * time.Millisecond

// Check verifies the data file at path without changing it: it opens it
// read-only, walks every page reachable from its newest meta page (each
// page in the file, of a valid type, referenced once, its elements and keys
// within it and in order), runs bbolt's own consistency check, and checks
// the schema version, the buckets, the counters and every key record. A
// file of an older schema version that Open upgrades is checked as that
// version laid it out (and left as it is). It returns ErrLocked while
// another process has the file open for writing (a running server),
// ErrSchema for a schema version Open refuses, a *DamagedError
// (errors.Is ErrDamaged) listing what is wrong, or another error when the
// file cannot be read at all (missing, unreadable). A panic in bbolt on a
// damaged page is returned as damage too.
//
// If then is not nil and the file is sound, Check calls it with the report
// while it still holds the file's (shared) lock, so that no server starts
// on the file meanwhile; its error is Check's.
func Check(path string, then func(Report) error) (rep Report, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return rep, fmt.Errorf("kv: %w", err)
	}
	if fi.Size() == 0 {
		return rep, &DamagedError{Path: path, Problems: []string{"the file is empty"}}
	}
	db, err := openReadOnly(path, checkLockTimeout)
	if err != nil {
		return rep, err
	}
	defer db.Close()
	m, p, err := walkFile(path, db.Info().PageSize)
	if err != nil {
		return rep, fmt.Errorf("kv: reading %s: %w", path, err)
	}
	if err := p.err(path); err != nil {
		return rep, err
	}
	rep.Pages, rep.PageSize = int(m.pgid), db.Info().PageSize
	err = safely(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			for err := range tx.Check() {
				p.addf("%v", err)
			}
			if err := p.err(path); err != nil {
				return err
			}
			return checkSchema(tx, &rep, &p)
		})
	})
	if err == nil {
		err = p.err(path)
	}
	if err == nil && then != nil {
		err = then(rep)
	}
	return rep, err
}

// checkSchema checks the buckets, the meta counters and the records.
func checkSchema(tx *bolt.Tx, rep *Report, p *problems) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		p.addf("no %q bucket", bucketMeta)
		return nil
	}
	switch v := meta.Get(metaSchema); {
	case len(v) == 8 && binary.BigEndian.Uint64(v) == SchemaVersion:
		rep.Schema = SchemaVersion
	case len(v) == 8 && binary.BigEndian.Uint64(v) == 1:
		rep.Schema = 1
	default:
		return fmt.Errorf("%w: file has %x, this build reads %d (and upgrades 1)", ErrSchema, v, SchemaVersion)
	}
	buckets := [][]byte{bucketMeta, bucketKeys, bucketTombs, bucketLocks}
	if rep.Schema == 1 {
		buckets = [][]byte{bucketMeta, bucketKeys, bucketLocks}
	}
	for _, c := range []struct {
		name []byte
		dst  *uint64
	}{
		{metaRevision, (*uint64)(&rep.Revision)},
		{metaLastToken, (*uint64)(&rep.LastToken)},
		{metaLiveKeys, &rep.LiveKeys},
		{metaApplied, &rep.Applied},
	} {
		v := meta.Get(c.name)
		switch {
		case v == nil: // not written yet: 0
		case len(v) != 8:
			p.addf("meta counter %s: %d bytes, not 8", c.name, len(v))
		default:
			*c.dst = binary.BigEndian.Uint64(v)
		}
	}
	_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		if !slices.ContainsFunc(buckets, func(b []byte) bool { return bytes.Equal(b, name) }) && !bytes.Equal(name, bucketHistory) {
			p.addf("unexpected bucket %q", name)
		}
		return nil
	})
	for _, name := range buckets[1:] {
		if tx.Bucket(name) == nil {
			p.addf("no %q bucket", name)
		}
	}
	for _, name := range buckets {
		if b := tx.Bucket(name); b != nil {
			_ = b.ForEachBucket(func(k []byte) error {
				p.addf("bucket %s holds a bucket %q", name, k)
				return nil
			})
		}
	}
	var live uint64
	if b := tx.Bucket(bucketKeys); b != nil {
		_ = b.ForEach(func(k, v []byte) error {
			rep.Keys++
			switch {
			case v == nil:
			case len(v) < recHeader:
				p.addf("key %.64q: a record of %d bytes, under %d", k, len(v), recHeader)
			case v[0]&^flagLive != 0:
				p.addf("key %.64q: unknown flags %#x", k, v[0])
			case v[0]&flagLive == 0 && rep.Schema != 1:
				p.addf("key %.64q: a deleted key's record in %q, not %q", k, bucketKeys, bucketTombs)
			case v[0]&flagLive == 0:
				rep.Tombstones++ // schema 1: Open moves it to tombstones
			default:
				live++
				if rev := binary.BigEndian.Uint64(v[9:17]); rev > uint64(rep.Revision) {
					p.addf("key %.64q: revision %d, above the store's %d", k, rev, rep.Revision)
				}
			}
			return nil
		})
	}
	if b := tx.Bucket(bucketTombs); b != nil && rep.Schema != 1 {
		keys := tx.Bucket(bucketKeys)
		_ = b.ForEach(func(k, v []byte) error {
			rep.Keys++
			rep.Tombstones++
			switch {
			case v == nil: // a nested bucket, reported above
			case len(v) != tombLen:
				p.addf("tombstone %.64q: %d bytes, not %d", k, len(v), tombLen)
			case keys != nil && keys.Get(k) != nil:
				p.addf("key %.64q: both live and deleted", k)
			}
			return nil
		})
	}
	if live != rep.LiveKeys {
		p.addf("%d live keys, but the counter says %d", live, rep.LiveKeys)
	}
	if b := tx.Bucket(bucketLocks); b != nil {
		rep.Locks = b.Stats().KeyN
	}
	return nil
}

// openReadOnly opens the file read-only (a shared lock), mapping a
// writer's lock to ErrLocked and a bad meta page to a *DamagedError.
func openReadOnly(path string, timeout time.Duration) (db *bolt.DB, err error) {
	err = safely(path, func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: timeout})
		return err
	})
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("%w: %s", ErrLocked, path)
	case errors.Is(err, ErrDamaged):
		return nil, err
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, &DamagedError{Path: path, Problems: []string{"no valid meta page: " + err.Error()}}
	}
	return nil, fmt.Errorf("kv: open %s: %w", path, err)
}

// safely runs fn, turning a panic in it (bbolt's, on a damaged page) into
// a *DamagedError. Memory faults on the file's mapping are panics too while
// it runs.
func safely(path string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = &DamagedError{Path: path, Problems: []string{fmt.Sprint(r)}}
		}
	}()
	return fn()
}

// precheck walks the pages of an existing data file before Open hands it
// to bbolt for writing. bbolt rebuilds its free list at open by walking
// every page (the file keeps none: NoFreelistSync) in a goroutine of its
// own, where a damaged page is a panic no caller can recover. A new or
// empty file is left to bbolt.
func precheck(path string, timeout time.Duration) error {
	fi, err := os.Stat(path)
	if err != nil || fi.Size() == 0 {
		return nil // bbolt creates it, or says why it cannot
	}
	db, err := openReadOnly(path, timeout)
	if err != nil {
		return err
	}
	defer db.Close()
	_, p, err := walkFile(path, db.Info().PageSize)
	if err != nil {
		return fmt.Errorf("kv: reading %s: %w", path, err)
	}
	return p.err(path)
}

// The bbolt file format, as far as the walk reads it (bbolt's
// internal/common; numbers in the machine's byte order).
const (
	pageHeaderSize = 16 // id u64, flags u16, count u16, overflow u32
	elemSize       = 16 // branch: pos u32, ksize u32, pgid u64; leaf: flags u32, pos u32, ksize u32, vsize u32
	bucketHeader   = 16 // root pgid u64, sequence u64

	branchPage   = 0x01
	leafPage     = 0x02
	freelistPage = 0x10
	bucketLeaf   = 0x01

	boltMagic   = 0xED0CDAED
	boltVersion = 2
	noFreelist  = ^uint64(0)
	maxDepth    = 64 // a bbolt tree splits pages in two or more: 2^64 pages
	maxNesting  = 8  // buckets in buckets
)

var ne = binary.NativeEndian

// boltMeta is the part of a meta page the walk uses.
type boltMeta struct {
	root, freelist, pgid, txid uint64
}

// walker reads a bbolt file's pages with ReadAt, never through a memory
// map, and checks everything bbolt's own page walk relies on.
type walker struct {
	f        io.ReaderAt
	size     int64
	pageSize int
	hwm      uint64
	seen     map[uint64]bool
	p        problems
}

// walkFile walks the file's newest valid meta page and every page it
// reaches. err is for a file that cannot be read; what is wrong with it is
// in the problems.
func walkFile(path string, pageSize int) (boltMeta, problems, error) {
	f, err := os.Open(path)
	if err != nil {
		return boltMeta{}, problems{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return boltMeta{}, problems{}, err
	}
	w := &walker{f: f, size: fi.Size(), pageSize: pageSize, seen: map[uint64]bool{}}
	m, ok := w.meta()
	if !ok {
		return m, w.p, nil
	}
	w.hwm = m.pgid
	if int64(m.pgid) > w.size/int64(pageSize) || m.pgid < 2 {
		w.p.addf("the meta page's high-water mark (%d pages) does not fit the file (%d bytes of %d-byte pages)", m.pgid, w.size, pageSize)
		return m, w.p, nil
	}
	if m.freelist != noFreelist {
		w.freelist(m.freelist)
	}
	w.bucket(m.root, nil, "the root bucket", 0)
	return m, w.p, nil
}

// meta returns the newest valid meta page, as bbolt picks it.
func (w *walker) meta() (boltMeta, bool) {
	var best boltMeta
	found := false
	for id := range uint64(2) {
		b := make([]byte, pageHeaderSize+64)
		if _, err := w.f.ReadAt(b, int64(id)*int64(w.pageSize)); err != nil {
			continue
		}
		m := b[pageHeaderSize:]
		h := fnv.New64a()
		h.Write(m[:56])
		if ne.Uint32(m[0:]) != boltMagic || ne.Uint32(m[4:]) != boltVersion || ne.Uint64(m[56:]) != h.Sum64() {
			continue
		}
		cand := boltMeta{root: ne.Uint64(m[16:]), freelist: ne.Uint64(m[32:]), pgid: ne.Uint64(m[40:]), txid: ne.Uint64(m[48:])}
		if !found || cand.txid > best.txid {
			best, found = cand, true
		}
	}
	if !found {
		w.p.addf("no valid meta page")
	}
	return best, found
}

// page reads page id (and its overflow pages) after checking that it is
// in the file, referenced once, and names itself. It returns nil after
// noting a problem.
func (w *walker) page(id uint64, what string) []byte {
	if id < 2 || id >= w.hwm {
		w.p.addf("%s: page %d is out of range (2 to %d)", what, id, w.hwm-1)
		return nil
	}
	if w.seen[id] {
		w.p.addf("%s: page %d is referenced twice", what, id)
		return nil
	}
	w.seen[id] = true
	buf := make([]byte, w.pageSize)
	if _, err := w.f.ReadAt(buf, int64(id)*int64(w.pageSize)); err != nil {
		w.p.addf("%s: page %d: %v", what, id, err)
		return nil
	}
	if got := ne.Uint64(buf); got != id {
		w.p.addf("%s: page %d names itself page %d", what, id, got)
		return nil
	}
	over := uint64(ne.Uint32(buf[12:]))
	if over > 0 {
		if over >= w.hwm-id {
			w.p.addf("%s: page %d claims %d overflow pages, past the last page %d", what, id, over, w.hwm-1)
			return nil
		}
		for i := id + 1; i <= id+over; i++ {
			if w.seen[i] {
				w.p.addf("%s: page %d's overflow page %d is referenced twice", what, id, i)
				return nil
			}
			w.seen[i] = true
		}
		buf = make([]byte, int(1+over)*w.pageSize)
		if _, err := w.f.ReadAt(buf, int64(id)*int64(w.pageSize)); err != nil {
			w.p.addf("%s: page %d: %v", what, id, err)
			return nil
		}
	}
	return buf
}

func (w *walker) freelist(id uint64) {
	buf := w.page(id, "the free list")
	if buf == nil {
		return
	}
	if flags := ne.Uint16(buf[8:]); flags != freelistPage {
		w.p.addf("the free list: page %d has type %#x", id, flags)
		return
	}
	start, count := pageHeaderSize, uint64(ne.Uint16(buf[10:]))
	if count == 0xFFFF {
		count = ne.Uint64(buf[pageHeaderSize:])
		start += 8
	}
	if count > uint64(len(buf)-start)/8 {
		w.p.addf("the free list: page %d claims %d ids, more than it holds", id, count)
		return
	}
	for i := range count {
		if fid := ne.Uint64(buf[start+int(i)*8:]); fid < 2 || fid >= w.hwm {
			w.p.addf("the free list: page %d lists page %d, out of range", id, fid)
			return
		}
	}
}

// bucket walks a bucket's tree from its root page, or its inline page.
func (w *walker) bucket(root uint64, inline []byte, what string, nesting int) {
	if nesting > maxNesting {
		w.p.addf("%s: buckets nested over %d deep", what, maxNesting)
		return
	}
	if root == 0 {
		if len(inline) < pageHeaderSize {
			w.p.addf("%s: an inline bucket of %d bytes", what, len(inline))
			return
		}
		if flags := ne.Uint16(inline[8:]); flags != leafPage {
			w.p.addf("%s: inline page of type %#x, not a leaf", what, flags)
			return
		}
		w.elements(inline, leafPage, "inline page", what, nil, nil, 0, nesting)
		return
	}
	w.tree(root, what, nil, nil, 0, nesting)
}

// tree walks the subtree at page id, whose keys must be >= min (if not
// nil) and < max (if not nil), and returns its largest key.
func (w *walker) tree(id uint64, what string, min, max []byte, depth, nesting int) []byte {
	if depth > maxDepth {
		w.p.addf("%s: the tree is over %d levels deep at page %d", what, maxDepth, id)
		return nil
	}
	buf := w.page(id, what)
	if buf == nil {
		return nil
	}
	flags := ne.Uint16(buf[8:])
	if flags != branchPage && flags != leafPage {
		w.p.addf("%s: page %d has type %#x, not a branch or leaf page", what, id, flags)
		return nil
	}
	return w.elements(buf, flags, fmt.Sprintf("page %d", id), what, min, max, depth, nesting)
}

// elements checks the elements of a branch or leaf page (buf) and walks
// what they point to.
func (w *walker) elements(buf []byte, flags uint16, name, what string, min, max []byte, depth, nesting int) []byte {
	count := int(ne.Uint16(buf[10:]))
	if pageHeaderSize+count*elemSize > len(buf) {
		w.p.addf("%s: %s claims %d elements, more than it holds", what, name, count)
		return nil
	}
	if flags == branchPage && count == 0 {
		w.p.addf("%s: %s is an empty branch page", what, name)
		return nil
	}
	// Keys and values lie within the page; check them all before
	// following any.
	type elem struct {
		key, value []byte
		child      uint64
		bucket     bool
	}
	elems := make([]elem, count)
	for i := range count {
		at := pageHeaderSize + i*elemSize
		e := buf[at : at+elemSize]
		var pos, ksize, vsize uint64
		if flags == branchPage {
			pos, ksize = uint64(ne.Uint32(e[0:])), uint64(ne.Uint32(e[4:]))
			elems[i].child = ne.Uint64(e[8:])
		} else {
			elems[i].bucket = ne.Uint32(e[0:])&bucketLeaf != 0
			pos, ksize, vsize = uint64(ne.Uint32(e[4:])), uint64(ne.Uint32(e[8:])), uint64(ne.Uint32(e[12:]))
		}
		start := uint64(at) + pos
		if start+ksize+vsize > uint64(len(buf)) {
			w.p.addf("%s: %s element %d lies past the page's end", what, name, i)
			return nil
		}
		elems[i].key = buf[start : start+ksize]
		elems[i].value = buf[start+ksize : start+ksize+vsize]
	}
	// Key order, as bbolt's check has it: each key above the one before
	// (the first at least min), and all below max.
	runningMin := min
	for i := range elems {
		k := elems[i].key
		if i == 0 && runningMin != nil && bytes.Compare(runningMin, k) > 0 || i > 0 && bytes.Compare(runningMin, k) >= 0 {
			w.p.addf("%s: %s key %d is out of order", what, name, i)
			return nil
		}
		if max != nil && bytes.Compare(k, max) >= 0 {
			w.p.addf("%s: %s key %d is not below its parent's next key", what, name, i)
			return nil
		}
		if flags == leafPage {
			runningMin = k
			continue
		}
		next := max
		if i+1 < len(elems) {
			next = elems[i+1].key
		}
		before := w.p.count()
		runningMin = w.tree(elems[i].child, what, k, next, depth+1, nesting)
		if w.p.count() > before {
			return nil // the subtree is damaged: its keys say nothing
		}
	}
	if flags == leafPage {
		for _, e := range elems {
			if !e.bucket {
				continue
			}
			sub := fmt.Sprintf("bucket %.64q", e.key)
			if len(e.value) < bucketHeader {
				w.p.addf("%s: %s has a header of %d bytes", what, sub, len(e.value))
				continue
			}
			root := ne.Uint64(e.value)
			if root == 0 && len(e.value) < bucketHeader+pageHeaderSize {
				w.p.addf("%s: inline %s has %d bytes", what, sub, len(e.value))
				continue
			}
			w.bucket(root, bytes.Clone(e.value[bucketHeader:]), sub, nesting+1)
		}
	}
	if len(elems) == 0 {
		return nil
	}
	if flags == leafPage {
		return elems[len(elems)-1].key
	}
	return runningMin
}
