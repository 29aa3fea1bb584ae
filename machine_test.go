package fencekv

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
)

// The state machine's contract, and the engine's behaviour when something
// in a batch panics or fails: the batch fails, nothing of it is visible,
// later calls answer at once, and Close returns.

func openMachine(t *testing.T) *Machine {
	t.Helper()
	m, err := OpenMachine(filepath.Join(t.TempDir(), DataFile), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func mustApply(t *testing.T, m *Machine, c Command) Result {
	t.Helper()
	r, err := m.Apply(&c)
	if err != nil {
		t.Fatalf("Apply(%v): machine failed: %v", c.Op, err)
	}
	return r
}

func readKey(t *testing.T, m *Machine, key string) kv.Entry {
	t.Helper()
	var e kv.Entry
	if err := m.view(0, func(tx *kv.Tx, _ time.Duration) error {
		e = tx.Get([]byte(key))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestMachinePublish: applied commands are invisible to readers until
// Publish, which also sets Applied; a checkpointed machine reopens at its
// applied index and term.
func TestMachinePublish(t *testing.T) {
	path := filepath.Join(t.TempDir(), DataFile)
	m, err := OpenMachine(path, true)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, m, Command{Op: OpRearm, Term: 4})
	if r := mustApply(t, m, Command{Op: OpPut, Key: []byte("k"), Value: []byte("v"), Write: kv.Write{Token: 3}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if e := readKey(t, m, "k"); e.Found {
		t.Fatalf("before Publish, readers see %+v", e)
	}
	m.Publish(7)
	if e := readKey(t, m, "k"); !e.Found || e.Fence != 3 {
		t.Fatalf("after Publish, k = %+v; want found with fence 3", e)
	}
	if m.Applied() != 7 || m.Term() != 4 {
		t.Fatalf("Applied, Term = %d, %d; want 7, 4", m.Applied(), m.Term())
	}
	if err := m.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m, err = OpenMachine(path, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Applied() != 7 || m.Term() != 4 {
		t.Fatalf("reopened: Applied, Term = %d, %d; want 7, 4", m.Applied(), m.Term())
	}
}

// TestMachineExpireOlderTerm: an expiry proposed under a term older than
// the last rearm changes nothing, however late its time; one from the
// current term expires the lease.
func TestMachineExpireOlderTerm(t *testing.T) {
	m := openMachine(t)
	mustApply(t, m, Command{Op: OpRearm, Term: 1})
	g := mustApply(t, m, Command{Op: OpAcquire, Term: 1, Lease: lease.Request{Name: "L", TTL: time.Second}})
	if g.Err != nil {
		t.Fatal(g.Err)
	}
	mustApply(t, m, Command{Op: OpRearm, Term: 2, Now: 10 * time.Millisecond}) // a new leader
	old := mustApply(t, m, Command{Op: OpExpire, Term: 1, Now: time.Hour, Lease: lease.Request{Name: "L"}})
	if !old.Noop || old.Freed {
		t.Fatalf("expire from term 1 after rearm in term 2 = %+v; want a no-op", old)
	}
	if r := mustApply(t, m, Command{Op: OpRenew, Term: 2, Now: 500 * time.Millisecond, Lease: lease.Request{Name: "L"}, Token: g.Grant.Token}); r.Err != nil {
		t.Fatalf("renew after the stale expiry: %v; want the lease still held", r.Err)
	}
	cur := mustApply(t, m, Command{Op: OpExpire, Term: 2, Now: time.Hour, Lease: lease.Request{Name: "L"}})
	if !cur.Freed {
		t.Fatalf("expire from the current term = %+v; want the lock freed", cur)
	}
}

// TestMachineSnapshotRestore: a snapshot carries the whole state and its
// index; restoring it into another machine gives the same reads and token
// sequence, and a truncated snapshot is refused with the state kept.
func TestMachineSnapshotRestore(t *testing.T) {
	a := openMachine(t)
	for i := range 50 {
		mustApply(t, a, Command{Op: OpPut, Key: []byte("k" + strconv.Itoa(i)), Value: []byte("v"), Write: kv.Write{Token: Token(i)}})
	}
	g := mustApply(t, a, Command{Op: OpAcquire, Lease: lease.Request{Name: "L", TTL: time.Minute}})
	a.Publish(99)
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	snap.Close()
	if snap.Index != 99 {
		t.Fatalf("snapshot index %d; want 99", snap.Index)
	}

	b := openMachine(t)
	mustApply(t, b, Command{Op: OpPut, Key: []byte("only-in-b"), Value: []byte("x")})
	b.Publish(1)
	if err := b.Restore(bytes.NewReader(buf.Bytes()[:buf.Len()/2])); err == nil {
		t.Fatal("Restore of half a snapshot succeeded; want an error")
	}
	if e := readKey(t, b, "only-in-b"); !e.Found {
		t.Fatal("a refused Restore lost the machine's state")
	}
	if err := b.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if b.Applied() != 99 {
		t.Fatalf("restored Applied = %d; want 99", b.Applied())
	}
	if e := readKey(t, b, "k49"); !e.Found || e.Fence != 49 {
		t.Fatalf("restored k49 = %+v; want found, fence 49", e)
	}
	if e := readKey(t, b, "only-in-b"); e.Found {
		t.Fatal("Restore kept a key the snapshot does not have")
	}
	// The lease came along, indexed: its expiry is due at its deadline,
	// and the next token is above the snapshot's.
	if at, ok := b.leases.Arm(); !ok || at != time.Minute {
		t.Fatalf("restored lease index next = %v, %v; want 1m", at, ok)
	}
	if r := mustApply(t, b, Command{Op: OpAcquire, Lease: lease.Request{Name: "M", TTL: time.Minute}}); r.Grant.Token <= g.Grant.Token {
		t.Fatalf("token after restore %d; want above %d", r.Grant.Token, g.Grant.Token)
	}
}

// TestMachineFailure: a command that panics fails the machine: the open
// batch is discarded (what was published stays), and every later Apply
// returns the failure.
func TestMachineFailure(t *testing.T) {
	m := openMachine(t)
	mustApply(t, m, Command{Op: OpPut, Key: []byte("old"), Value: []byte("v")})
	m.Publish(1)
	mustApply(t, m, Command{Op: OpPut, Key: []byte("half"), Value: []byte("v")})
	m.hook = func(c *Command) {
		if string(c.Key) == "boom" {
			panic("injected")
		}
	}
	if _, err := m.Apply(&Command{Op: OpPut, Key: []byte("boom"), Value: []byte("v")}); !errors.Is(err, errPanic) {
		t.Fatalf("Apply of a panicking command: err = %v; want a panic error", err)
	}
	if _, err := m.Apply(&Command{Op: OpPut, Key: []byte("later"), Value: []byte("v")}); err == nil {
		t.Fatal("Apply after a failure succeeded")
	}
	m.Publish(3)
	if e := readKey(t, m, "half"); e.Found {
		t.Fatal("a command of the failed batch is visible")
	}
	if e := readKey(t, m, "old"); !e.Found {
		t.Fatal("a published command was lost with the failed batch")
	}
	if err := m.Checkpoint(); err == nil {
		t.Fatal("Checkpoint of a failed machine succeeded")
	}
}

// promptly fails the test if fn does not return within a generous bound.
func promptly(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return", what)
	}
}

func TestPanicInApplyFailsBatchNotEngine(t *testing.T) {
	opts := DefaultOptions()
	opts.NoSync = true
	db, err := Open(t.TempDir(), &opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := db.Put(ctx, []byte("before"), []byte("v"), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	db.m.hook = func(c *Command) { // set between batches: no leader runs
		if string(c.Key) == "boom" {
			panic("injected in apply")
		}
	}
	_, err = db.Put(ctx, []byte("boom"), []byte("v"), WriteOptions{})
	if !errors.Is(err, ErrInternal) {
		t.Fatalf("Put that panicked: err = %v; want internal", err)
	}
	promptly(t, "Put after the panic", func() {
		_, err = db.Put(ctx, []byte("after"), []byte("v"), WriteOptions{})
	})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Put after the panic: err = %v; want unavailable", err)
	}
	promptly(t, "Acquire after the panic", func() {
		_, err = db.Acquire(ctx, "L", time.Second, nil)
	})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Acquire after the panic: err = %v; want unavailable", err)
	}
	// Reads still serve what was acknowledged.
	if e, err := db.Get(ctx, []byte("before")); err != nil || !e.Found {
		t.Fatalf("Get after the panic = %+v, %v; want the acknowledged key", e, err)
	}
	promptly(t, "Close", func() { db.Close() })
}

func TestPanicInCommitPathFailsBatchNotEngine(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := db.Put(ctx, []byte("before"), []byte("v"), WriteOptions{Token: 1}); err != nil {
		t.Fatal(err)
	}
	db.beforeSync = func() error { panic("injected before the log sync") }
	// Two callers in one batch: both fail, neither is visible.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = db.Put(ctx, []byte("in-batch-"+strconv.Itoa(i)), []byte("v"), WriteOptions{})
		})
	}
	promptly(t, "the panicking batch", wg.Wait)
	for i, err := range errs {
		if !errors.Is(err, ErrInternal) && !errors.Is(err, ErrUnavailable) {
			t.Errorf("caller %d: err = %v; want internal (or unavailable, if its batch came after)", i, err)
		}
	}
	if !errors.Is(errs[0], ErrInternal) && !errors.Is(errs[1], ErrInternal) {
		t.Errorf("no caller was told internal: %v", errs)
	}
	for i := range errs {
		if e, _ := db.Get(ctx, []byte("in-batch-"+strconv.Itoa(i))); e.Found {
			t.Errorf("in-batch-%d is visible after its batch failed", i)
		}
	}
	promptly(t, "Put after the panic", func() {
		_, err = db.Put(ctx, []byte("after"), []byte("v"), WriteOptions{})
	})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Put after the panic: err = %v; want unavailable", err)
	}
	promptly(t, "Close", func() { db.Close() })

	// A restart recovers: the acknowledged write is there, the failed
	// batch is not.
	db, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if e, err := db.Get(ctx, []byte("before")); err != nil || !e.Found || e.Fence != 1 {
		t.Fatalf("after restart, before = %+v, %v; want found with fence 1", e, err)
	}
	if _, err := db.Put(ctx, []byte("after"), []byte("v"), WriteOptions{}); err != nil {
		t.Fatalf("Put after restart: %v", err)
	}
}

// holdLeader makes the next batch's leader wait before its log sync until
// the returned release is called, and returns once it waits.
func holdLeader(t *testing.T, db *DB, start func()) (release func()) {
	t.Helper()
	entered := make(chan struct{})
	ch := make(chan struct{})
	db.beforeSync = func() error {
		db.beforeSync = nil
		close(entered)
		<-ch
		return nil
	}
	start()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the batch never reached the log")
	}
	return sync.OnceFunc(func() { close(ch) })
}

func waitPending(t *testing.T, db *DB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		db.qmu.Lock()
		got := len(db.pending)
		db.qmu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d commands pending; want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestContextEndsWhileQueued: a caller whose context ends before a batch
// takes its command gets the context's error, and nothing is applied.
func TestContextEndsWhileQueued(t *testing.T) {
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	bg := context.Background()
	first := make(chan error, 1)
	release := holdLeader(t, db, func() {
		go func() {
			_, err := db.Put(bg, []byte("first"), []byte("v"), WriteOptions{})
			first <- err
		}()
	})
	defer release()
	ctx, cancel := context.WithCancel(bg)
	queued := make(chan error, 1)
	go func() {
		_, err := db.Put(ctx, []byte("queued"), []byte("v"), WriteOptions{})
		queued <- err
	}()
	waitPending(t, db, 1)
	cancel()
	select {
	case err := <-queued:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("queued Put: err = %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a queued caller whose context ended did not return")
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if e, _ := db.Get(bg, []byte("queued")); e.Found {
		t.Fatal("the withdrawn command was applied")
	}
	// A context already ended: nothing is submitted.
	if _, err := db.Put(ctx, []byte("late"), []byte("v"), WriteOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with an ended context: %v", err)
	}
}

// TestCloseAnswersQueued: Close answers every caller queued behind a
// batch in progress.
func TestCloseAnswersQueued(t *testing.T) {
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	results := make(chan error, 5)
	release := holdLeader(t, db, func() {
		go func() {
			_, err := db.Put(bg, []byte("first"), []byte("v"), WriteOptions{})
			results <- err
		}()
	})
	for i := range 4 {
		go func() {
			_, err := db.Put(bg, []byte("q"+strconv.Itoa(i)), []byte("v"), WriteOptions{})
			results <- err
		}()
	}
	waitPending(t, db, 4)
	closed := make(chan error, 1)
	go func() { closed <- db.Close() }()
	release()
	for range 5 {
		select {
		case err := <-results:
			if err != nil {
				t.Errorf("a caller queued before Close: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close left a queued caller unanswered")
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// TestRearmIsLogged: re-arming the leases at Open is a command in the
// write-ahead log, like any other (and what a replica would replay).
func TestRearmIsLogged(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Open checkpointed the replay and started the log over: the first
	// record is the rearm.
	data, err := os.ReadFile(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 16 {
		t.Fatalf("log is %d bytes; want a record", len(data))
	}
	n := binary.BigEndian.Uint32(data)
	cmds, err := DecodeBatch(data[16 : 16+n])
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 1 || cmds[0].Op != OpRearm {
		t.Fatalf("first log record = %+v; want one rearm", cmds)
	}
}

// TestOnlyTheEngineWrites: the storage, lease and log packages are
// imported by the engine alone (and their own tests), so nothing else can
// reach their raw writers (G5: one write path). The one exception is
// cluster's use of wal for raft's own log (cluster/logstore.go): a file of
// its own, in the record format, never the engine's log; the entries it
// holds reach the store only through the Machine.
func TestOnlyTheEngineWrites(t *testing.T) {
	inner := map[string]bool{"kv": true, "lease": true, "wal": true}
	allowed := map[string]map[string]bool{
		".":       {"kv": true, "lease": true, "wal": true},
		"lease":   {"kv": true},
		"cluster": {"wal": true},
	}
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		if strings.HasPrefix(path, "bench/peers/") {
			return nil // a module of its own
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			name, ok := strings.CutPrefix(p, "github.com/fencekv/fencekv/")
			if !ok || !inner[name] || name == dir {
				continue
			}
			if !allowed[dir][name] {
				t.Errorf("%s imports %s: only the engine may", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
