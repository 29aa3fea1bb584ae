package fencekv

import (
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

	"github.com/fencekv/fencekv/state"
)

// The engine's behaviour when something in a batch panics or fails: the
// batch fails, nothing of it is visible, later calls answer at once, and
// Close returns.

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
	db.m.SetApplyHook(func(c *state.Command) { // set between batches: no leader runs
		if string(c.Key) == "boom" {
			panic("injected in apply")
		}
	})
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
	cmds, err := state.DecodeBatch(data[16 : 16+n])
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 1 || cmds[0].Op != state.OpRearm {
		t.Fatalf("first log record = %+v; want one rearm", cmds)
	}
}

// TestOnlyTheEngineWrites: the storage, lease and log packages are
// imported by the state machine and the single-node engine alone (and
// their own tests), so nothing else can reach their raw writers (G5: one
// write path). The one exception is
// cluster's use of wal for raft's own log (cluster/logstore.go): a file of
// its own, in the record format, never the engine's log; the entries it
// holds reach the store only through the Machine.
func TestOnlyTheEngineWrites(t *testing.T) {
	inner := map[string]bool{"kv": true, "lease": true, "wal": true}
	allowed := map[string]map[string]bool{
		".":       {"kv": true, "lease": true, "wal": true},
		"state":   {"kv": true, "lease": true},
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
