package kv

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// state is what a reader sees of keys k0..k9, lock L and the revision.
func state(t *testing.T, tx *Tx) string {
	t.Helper()
	var b bytes.Buffer
	for i := range 10 {
		e := tx.Get(fmt.Appendf(nil, "k%d", i))
		if e.Found {
			fmt.Fprintf(&b, "k%d=%s ", i, e.Value)
		}
	}
	items, _ := tx.Scan([]byte("k"), nil, 100, 1<<20)
	b.WriteString("| ")
	for _, e := range items {
		fmt.Fprintf(&b, "%s=%s ", e.Key, e.Value)
	}
	fmt.Fprintf(&b, "| L=%s rev=%d keys=%d", tx.Lock("L"), tx.Revision(), tx.Keys())
	return b.String()
}

// within fails the test if fn does not return within a minute: Publish
// and Checkpoint used to wait for every open reader, and a test of that
// should fail, not hang.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not return while readers were open", what)
	}
}

// TestReaderKeepsItsState: a reader sees the state published when it
// began, in every Get, Scan, Lock and counter, for its whole life:
// through later Publishes and a Checkpoint, which no longer wait for it.
func TestReaderKeepsItsState(t *testing.T) {
	s := openStore(t)
	w, err := s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	// A large file first, so that the commits below, with readers open,
	// fit bbolt's memory map (growing it waits for open bbolt readers).
	for i := range 16 {
		w.Put(fmt.Appendf(nil, "fill/%d", i), make([]byte, 64<<10), Write{})
	}
	put := func(v string, del int) {
		for i := range 10 {
			if i == del {
				w.Delete(fmt.Appendf(nil, "k%d", i), Write{Token: 1})
			} else {
				w.Put(fmt.Appendf(nil, "k%d", i), []byte(v), Write{Token: 1})
			}
		}
		w.PutLock("L", []byte(v))
	}
	put("0", -1)
	s.Publish()
	within(t, "Checkpoint", func() { err = s.Checkpoint(Marks{}) })
	if err != nil {
		t.Fatal(err)
	}
	const (
		s0 = "k0=0 k1=0 k2=0 k3=0 k4=0 k5=0 k6=0 k7=0 k8=0 k9=0 | k0=0 k1=0 k2=0 k3=0 k4=0 k5=0 k6=0 k7=0 k8=0 k9=0 | L=0 rev=26 keys=26"
		s1 = "k0=1 k1=1 k2=1 k3=1 k4=1 k6=1 k7=1 k8=1 k9=1 | k0=1 k1=1 k2=1 k3=1 k4=1 k6=1 k7=1 k8=1 k9=1 | L=1 rev=36 keys=25"
		s2 = "k0=2 k1=2 k2=2 k3=2 k4=2 k5=2 k6=2 k7=2 k8=2 k9=2 | k0=2 k1=2 k2=2 k3=2 k4=2 k5=2 k6=2 k7=2 k8=2 k9=2 | L=2 rev=46 keys=26"
	)
	begin := func() *Tx {
		tx, err := s.Begin(false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tx.Rollback)
		return tx
	}
	want := func(what string, tx *Tx, st string) {
		t.Helper()
		if got := state(t, tx); got != st {
			t.Fatalf("%s sees\n\t%s\nwant\n\t%s", what, got, st)
		}
	}

	r0 := begin()
	want("a reader of the checkpoint", r0, s0)
	if w, err = s.Writer(); err != nil {
		t.Fatal(err)
	}
	put("1", 5)
	want("a reader before Publish", r0, s0)
	want("a reader begun before Publish", begin(), s0)
	within(t, "Publish", s.Publish)
	r1 := begin()
	want("a reader begun after Publish", r1, s1)
	want("a reader begun before it", r0, s0)

	put("2", -1)
	want("a reader, with a batch unpublished", r1, s1)
	within(t, "Publish", s.Publish)
	within(t, "Checkpoint", func() { err = s.Checkpoint(Marks{Applied: 2}) })
	if err != nil {
		t.Fatal(err)
	}
	// The file is now the third state; r0 and r1 read older bbolt
	// transactions with their generation over them.
	want("a reader begun on the checkpoint before", r0, s0)
	want("a reader begun on the first publish", r1, s1)
	want("a reader begun after the checkpoint", begin(), s2)
	r0.Rollback()
	r1.Rollback()
	if w, err = s.Writer(); err != nil {
		t.Fatal(err)
	}
	put("3", -1)
	s.Publish()
	r3 := begin()
	if w, err = s.Writer(); err != nil {
		t.Fatal(err)
	}
	put("4", 0)
	s.Publish()
	if got := r3.Get([]byte("k0")); string(got.Value) != "3" {
		t.Fatalf("k0 = %q; want 3", got.Value)
	}
}

// versions is the number of versions the overlay keeps of key.
func versions(s *Store, key string) int {
	c := s.ov.cur.g.keys.find(key)
	if c == nil {
		return 0
	}
	n := 0
	for v := c.head.Load(); v != nil; v = v.prev.Load() {
		n++
	}
	return n
}

// TestVersionsUnlinked: the overlay keeps a key's older versions only
// while a reader may read them.
func TestVersionsUnlinked(t *testing.T) {
	s := openStore(t)
	w, err := s.Writer()
	if err != nil {
		t.Fatal(err)
	}
	publish := func(n int) {
		for i := range n {
			w.Put([]byte("hot"), strconv.AppendInt(nil, int64(i), 10), Write{})
			s.Publish()
		}
	}
	publish(100)
	if n := versions(s, "hot"); n > 2 {
		t.Fatalf("with no readers, %d versions of a key published 100 times; want at most 2", n)
	}
	r, err := s.Begin(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Rollback) // before Close, which waits for it
	pinned := string(r.Get([]byte("hot")).Value)
	publish(50)
	if n := versions(s, "hot"); n < 51 {
		t.Fatalf("with a reader open, %d versions; want the 50 new and the reader's", n)
	}
	if got := string(r.Get([]byte("hot")).Value); got != pinned {
		t.Fatalf("the open reader sees %q; want %q", got, pinned)
	}
	r.Rollback()
	publish(1)
	if n := versions(s, "hot"); n > 2 {
		t.Fatalf("after the reader ended, %d versions; want at most 2", n)
	}
	if len(s.ov.old) > 1 {
		t.Fatalf("%d replaced views kept with no reader open", len(s.ov.old))
	}
}

// TestReadersSeeOneBatch runs readers against a writer that publishes and
// checkpoints batches, each of which sets keys k0..k7 and lock L to the
// batch's number and puts (even batches) or deletes (odd ones) key x.
// Every reader must see one batch in full, whatever it reads, and no
// batch older than the last published when it began, nor one not yet
// being published when it ended.
func TestReadersSeeOneBatch(t *testing.T) {
	s := openStore(t)
	const (
		batches = 300
		keys    = 8
		readers = 3
	)
	var published, publishing atomic.Int64
	var done atomic.Bool
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range readers {
		wg.Go(func() {
			for !done.Load() {
				lo := published.Load()
				tx, err := s.Begin(false)
				if err != nil {
					t.Error(err)
					return
				}
				var b int64
				if e := tx.Get([]byte("k0")); e.Found {
					b, _ = strconv.ParseInt(string(e.Value), 10, 64)
				}
				want := func(what string, got []byte, found bool) {
					if v := strconv.FormatInt(b, 10); b == 0 && found || b > 0 && (!found || string(got) != v) {
						t.Errorf("batch %d: %s = %q (found %v)", b, what, got, found)
					}
				}
				runtime.Gosched()
				for i := range keys {
					e := tx.Get(fmt.Appendf(nil, "k%d", i))
					want(fmt.Sprintf("get k%d", i), e.Value, e.Found)
				}
				items, _ := tx.Scan(nil, nil, 100, 1<<20)
				runtime.Gosched()
				if wantN := keys + int(1-b%2); b > 0 && len(items) != wantN {
					t.Errorf("batch %d: scan returned %d items; want %d", b, len(items), wantN)
				}
				for _, e := range items {
					want("scan "+string(e.Key), e.Value, true)
				}
				lock := tx.Lock("L")
				want("lock L", lock, lock != nil)
				if x := tx.Get([]byte("x")); x.Found != (b > 0 && b%2 == 0) {
					t.Errorf("batch %d: x found %v", b, x.Found)
				}
				if rev := tx.Revision(); rev != Revision(b*(keys+1)) {
					t.Errorf("batch %d: revision %d; want %d", b, rev, b*(keys+1))
				}
				tx.Rollback()
				if hi := publishing.Load(); b < lo || b > hi {
					t.Errorf("a reader saw batch %d; published when it began: %d, being published when it ended: %d", b, lo, hi)
				}
				reads.Add(1)
			}
		})
	}
	w, err := s.Writer()
	for b := int64(1); b <= batches && err == nil; b++ {
		v := strconv.AppendInt(nil, b, 10)
		for i := range keys {
			w.Put(fmt.Appendf(nil, "k%d", i), v, Write{})
		}
		w.PutLock("L", v)
		if b%2 == 0 {
			w.Put([]byte("x"), v, Write{})
		} else {
			w.Delete([]byte("x"), Write{})
		}
		publishing.Store(b)
		s.Publish()
		published.Store(b)
		if b%8 == 0 {
			if err = s.Checkpoint(Marks{Applied: uint64(b)}); err == nil {
				w, err = s.Writer()
			}
		}
	}
	done.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if reads.Load() == 0 {
		t.Fatal("no reads ran")
	}
	t.Logf("%d reads", reads.Load())
}

// TestReadersAfterCommit checks the idle bbolt read transactions kept
// between reads: a read after a commit (Update's, or a Checkpoint's) sees
// the file the commit wrote, not the one an idle reader began on, also
// when that reader was in use while the commit ran.
func TestReadersAfterCommit(t *testing.T) {
	s := openStore(t)
	for i := range 3 {
		v := strconv.Itoa(i)
		open, err := s.Begin(false)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			update(t, s, func(tx *Tx) { tx.Put([]byte("k"), []byte(v), Write{}) })
		}()
		time.Sleep(10 * time.Millisecond) // the commit may wait for open, if it grows the file
		open.Get([]byte("k"))
		open.Rollback()
		open.Rollback() // a second Rollback must not end another reader's transaction
		<-done
		if got := string(get(t, s, "k").Value); got != v {
			t.Fatalf("after Update %d: k = %q", i, got)
		}
		w, err := s.Writer()
		if err != nil {
			t.Fatal(err)
		}
		w.Put([]byte("c"), []byte(v), Write{})
		s.Publish()
		if err := s.Checkpoint(Marks{}); err != nil {
			t.Fatal(err)
		}
		if got := string(get(t, s, "c").Value); got != v {
			t.Fatalf("after Checkpoint %d: c = %q", i, got)
		}
	}
}

// TestNamesConcurrent adds names, growing the table many times, while
// readers look up names added before they looked: each is found, with
// the chain it was added with, and a name never added is not.
func TestNamesConcurrent(t *testing.T) {
	var ns names
	const total = 5000
	var added atomic.Int64 // how many names are in, as they go in
	done := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				k := int(added.Load())
				for i := 0; i < k; i += 37 {
					name := fmt.Sprintf("k%d", i)
					c := ns.find(name)
					if c == nil || c.name != name || c.first.seq != uint64(i) {
						t.Errorf("find(%q) = %v", name, c)
						return
					}
				}
				if ns.find("never") != nil {
					t.Errorf("found a name never added")
					return
				}
			}
		}()
	}
	for i := 0; i < total; i++ {
		name := fmt.Sprintf("k%d", i)
		if ns.find(name) != nil {
			t.Fatalf("%q found before it was added", name)
		}
		ns.create(name, uint64(i), nil)
		added.Store(int64(i + 1))
	}
	close(done)
	wg.Wait()
	if got := namesLen(&ns); got != total {
		t.Fatalf("%d chains; want %d", got, total)
	}
}
