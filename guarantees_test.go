package fencekv_test

// Tests of guarantees G1–G4, G7 and G8 (fencekv.go) on one embedded engine,
// driven by a fake clock. Restarts are in restart_test.go, the model-based
// property test in property_test.go.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/lease"
)

// openDB opens an engine on a fake clock in dir (a new temp dir if empty),
// without fsync, and closes it at cleanup. tune, if set, edits the options.
func openDB(t *testing.T, dir string, clock *fencekvtest.Clock, tune func(*fencekv.Options)) *fencekv.DB {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	o := fencekv.DefaultOptions()
	o.Clock = clock
	o.NoSync = true
	if tune != nil {
		tune(&o)
	}
	db, err := fencekv.Open(dir, &o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// newDB is openDB on a new temp dir and a new fake clock.
func newDB(t *testing.T) (*fencekv.DB, *fencekvtest.Clock) {
	t.Helper()
	clock := fencekvtest.NewClock()
	return openDB(t, "", clock, nil), clock
}

// wantErr fails unless err is a refusal with code; code "" wants nil. It
// returns the refusal for checking its facts.
func wantErr(t *testing.T, err error, code fencekv.Code) *fencekv.Error {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Fatalf("err = %v; want nil", err)
		}
		return nil
	}
	var e *fencekv.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("err = %v; want %s", err, code)
	}
	if !errors.Is(err, &fencekv.Error{Code: code}) {
		t.Fatalf("errors.Is(%v, %s) = false", err, code)
	}
	return e
}

func acquire(t *testing.T, db *fencekv.DB, name string, ttl time.Duration, o *fencekv.AcquireOptions) fencekv.Lease {
	t.Helper()
	l, err := db.Acquire(context.Background(), name, ttl, o)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	return l
}

func put(t *testing.T, db *fencekv.DB, key, value string, w fencekv.WriteOptions) fencekv.WriteResult {
	t.Helper()
	r, err := db.Put(context.Background(), []byte(key), []byte(value), w)
	if err != nil {
		t.Fatalf("Put(%q, token %d): %v", key, w.Token, err)
	}
	return r
}

func getKey(t *testing.T, db *fencekv.DB, key string) fencekv.Entry {
	t.Helper()
	e, err := db.Get(context.Background(), []byte(key))
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return e
}

func lockInfo(t *testing.T, db *fencekv.DB, name string) fencekv.LockInfo {
	t.Helper()
	in, err := db.LockInfo(context.Background(), name)
	if err != nil {
		t.Fatalf("LockInfo(%q): %v", name, err)
	}
	return in
}

func status(t *testing.T, db *fencekv.DB) fencekv.Status {
	t.Helper()
	s, err := db.Status(context.Background())
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	return s
}

// eventually polls cond until it holds, failing after a few seconds. It is
// for state another goroutine changes (a waiter queued, a timer armed),
// never a stand-in for the fake clock.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	fencekvtest.Eventually(t, 5*time.Second, what, cond)
}

// snapshot is the observable state of some keys and locks plus the store's
// counters, for checking that a refusal changed nothing.
func snapshot(t *testing.T, db *fencekv.DB, keys, locks []string) string {
	t.Helper()
	var b strings.Builder
	s := status(t, db)
	// Not s.Locks: a lease past its deadline counts until the expiry loop
	// applies its expiry, which happens at a moment of its own.
	fmt.Fprintf(&b, "last_token=%d revision=%d keys=%d waiters=%d\n", s.LastToken, s.Revision, s.Keys, s.Waiters)
	for _, k := range keys {
		e := getKey(t, db, k)
		fmt.Fprintf(&b, "key %q: found=%v value=%q fence=%d rev=%d\n", k, e.Found, e.Value, e.Fence, e.Revision)
	}
	for _, l := range locks {
		fmt.Fprintf(&b, "lock %q: %+v\n", l, lockInfo(t, db, l))
	}
	return b.String()
}

// writeOp runs one of the four fenced writes on key. cas uses the key's
// current revision, so only the fence can refuse it.
type writeOp struct {
	name string
	run  func(db *fencekv.DB, key string, w fencekv.WriteOptions) (fencekv.WriteResult, error)
}

var writeOps = []writeOp{
	{"put", func(db *fencekv.DB, key string, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
		return db.Put(context.Background(), []byte(key), []byte("1"), w)
	}},
	{"delete", func(db *fencekv.DB, key string, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
		_, r, err := db.Delete(context.Background(), []byte(key), w)
		return r, err
	}},
	{"cas", func(db *fencekv.DB, key string, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
		e, err := db.Get(context.Background(), []byte(key))
		if err != nil {
			return fencekv.WriteResult{}, err
		}
		return db.CAS(context.Background(), []byte(key), e.Revision, []byte("1"), w)
	}},
	{"incr", func(db *fencekv.DB, key string, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
		_, r, err := db.Incr(context.Background(), []byte(key), 1, w)
		return r, err
	}},
}

// TestG1TokensIncrease checks that grants of all locks draw from one
// strictly increasing sequence, whatever ends each lease.
func TestG1TokensIncrease(t *testing.T) {
	db, clock := newDB(t)
	ctx := context.Background()
	var last fencekv.Token
	next := func(l fencekv.Lease) {
		t.Helper()
		if l.Token != last+1 {
			t.Fatalf("token on %q = %d; want %d (one above the last)", l.Name, l.Token, last+1)
		}
		last = l.Token
	}
	for i := 0; i < 5; i++ {
		a := acquire(t, db, "a", time.Second, nil)
		next(a)
		b := acquire(t, db, "b", time.Second, nil)
		next(b)
		if err := db.Release(ctx, "a", a.Token); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second) // b expires
		// A refused acquire draws no token.
		c := acquire(t, db, "c", time.Hour, nil)
		next(c)
		_, err := db.Acquire(ctx, "c", time.Second, nil)
		wantErr(t, err, fencekv.CodeLockHeld)
		db.Release(ctx, "c", c.Token)
	}
	if s := status(t, db); s.LastToken != last {
		t.Fatalf("status last token = %d; want %d", s.LastToken, last)
	}
}

// TestG1ConcurrentHistory records every grant made to goroutines that
// queue for a few shared locks, and checks the history: no token issued
// twice, each lock's holders in increasing token order, and exactly as
// many tokens issued as grants made.
func TestG1ConcurrentHistory(t *testing.T) {
	db, _ := newDB(t)
	ctx := context.Background()
	const workers, rounds = 8, 25
	locks := []string{"x", "y", "z"}
	var (
		mu      sync.Mutex
		held    = map[string][]fencekv.Token{} // per lock, in the order holders saw their grants
		mine    = make([][]fencekv.Token, workers)
		wg      sync.WaitGroup
		errs    = make(chan error, workers)
		holders = map[string]int{}
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				name := locks[(w+r)%len(locks)]
				l, err := db.Acquire(ctx, name, time.Hour, &fencekv.AcquireOptions{Wait: time.Hour})
				if err != nil {
					errs <- fmt.Errorf("worker %d acquire %s: %w", w, name, err)
					return
				}
				mu.Lock()
				holders[name]++
				if holders[name] != 1 {
					errs <- fmt.Errorf("%d holders of %s at once", holders[name], name)
				}
				held[name] = append(held[name], l.Token)
				mine[w] = append(mine[w], l.Token)
				holders[name]--
				mu.Unlock()
				if _, err := db.Put(ctx, []byte("k/"+name), []byte("v"), fencekv.WriteOptions{Token: l.Token, Lock: name}); err != nil {
					errs <- fmt.Errorf("worker %d held put under %s/%d: %w", w, name, l.Token, err)
					return
				}
				if err := db.Release(ctx, name, l.Token); err != nil {
					errs <- fmt.Errorf("worker %d release %s/%d: %w", w, name, l.Token, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	seen := map[fencekv.Token]bool{}
	var all []fencekv.Token
	for name, toks := range held {
		if !slices.IsSorted(toks) {
			t.Errorf("grants of %s out of order: %v", name, toks)
		}
		for _, tok := range toks {
			if seen[tok] {
				t.Errorf("token %d issued twice", tok)
			}
			seen[tok] = true
			all = append(all, tok)
		}
	}
	for w, toks := range mine {
		if !slices.IsSorted(toks) || len(toks) != rounds {
			t.Errorf("worker %d got tokens %v; want %d increasing", w, toks, rounds)
		}
	}
	s := status(t, db)
	if want := fencekv.Token(workers * rounds); s.LastToken != want || fencekv.Token(len(all)) != want || slices.Max(all) != want {
		t.Errorf("last token %d, %d grants, max %d; want all %d", s.LastToken, len(all), slices.Max(all), want)
	}
	for _, name := range locks {
		if e := getKey(t, db, "k/"+name); e.Fence != slices.Max(held[name]) {
			t.Errorf("fence of k/%s = %d; want the last holder's %d", name, e.Fence, slices.Max(held[name]))
		}
	}
}

// TestG2FenceRule is the fence rule for every write through the engine: a
// token below the fence is refused with the fence, an equal one accepted
// unless strict, a higher one accepted and becomes the fence.
func TestG2FenceRule(t *testing.T) {
	const fence = 10
	tests := []struct {
		name   string
		token  fencekv.Token
		strict bool
		ok     bool
	}{
		{"below", fence - 1, false, false},
		{"equal", fence, false, true},
		{"above", fence + 1, false, true},
		{"below strict", fence - 1, true, false},
		{"equal strict", fence, true, false},
		{"above strict", fence + 1, true, true},
		{"none", 0, false, false},
	}
	for _, op := range writeOps {
		for _, tt := range tests {
			t.Run(op.name+"/"+tt.name, func(t *testing.T) {
				db, _ := newDB(t)
				put(t, db, "k", "5", fencekv.WriteOptions{Token: fence})
				before := snapshot(t, db, []string{"k"}, nil)
				res, err := op.run(db, "k", fencekv.WriteOptions{Token: tt.token, Strict: tt.strict})
				if !tt.ok {
					if e := wantErr(t, err, fencekv.CodeStaleToken); e.Fence != fence {
						t.Errorf("stale_token fence = %d; want %d", e.Fence, fence)
					}
					if after := snapshot(t, db, []string{"k"}, nil); after != before {
						t.Errorf("a refused write changed the store:\nbefore %s\nafter  %s", before, after)
					}
					return
				}
				wantErr(t, err, "")
				if res.Fence != tt.token || res.Revision != 2 {
					t.Errorf("result = %+v; want fence %d, revision 2", res, tt.token)
				}
				if e := getKey(t, db, "k"); e.Fence != tt.token {
					t.Errorf("stored fence = %d; want %d", e.Fence, tt.token)
				}
			})
		}
	}
}

// TestG2ConcurrentHistory has goroutines write one key concurrently with
// random tokens, records every outcome, and checks the history: in
// revision order the accepted tokens never decrease, every refusal names a
// fence above its token that some earlier write set, and the final fence is
// the highest accepted token.
func TestG2ConcurrentHistory(t *testing.T) {
	db, _ := newDB(t)
	ctx := context.Background()
	const workers, writes = 8, 40
	type event struct {
		token fencekv.Token
		rev   fencekv.Revision // accepted: the write's revision
		fence fencekv.Token    // refused: the fence it named
	}
	var mu sync.Mutex
	var accepted, refused []event
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < writes; i++ {
				tok := fencekv.Token(1 + (w*writes+i*7)%50)
				res, err := db.Put(ctx, []byte("shared"), []byte(fmt.Sprint(tok)), fencekv.WriteOptions{Token: tok})
				var fe *fencekv.Error
				mu.Lock()
				switch {
				case err == nil:
					accepted = append(accepted, event{token: tok, rev: res.Revision})
				case errors.As(err, &fe) && fe.Code == fencekv.CodeStaleToken:
					refused = append(refused, event{token: tok, fence: fe.Fence})
				default:
					t.Errorf("put with token %d: %v", tok, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(accepted, func(a, b event) int { return int(a.rev) - int(b.rev) })
	seen := map[fencekv.Token]bool{}
	for i, e := range accepted {
		if i > 0 && e.token < accepted[i-1].token {
			t.Fatalf("accepted token %d at revision %d after token %d at revision %d", e.token, e.rev, accepted[i-1].token, accepted[i-1].rev)
		}
		seen[e.token] = true
	}
	for _, e := range refused {
		if e.fence <= e.token || !seen[e.fence] {
			t.Fatalf("refusal of token %d named fence %d; want a higher fence some accepted write set", e.token, e.fence)
		}
	}
	if len(accepted)+len(refused) != workers*writes {
		t.Fatalf("%d outcomes; want %d", len(accepted)+len(refused), workers*writes)
	}
	last := accepted[len(accepted)-1]
	if e := getKey(t, db, "shared"); e.Fence != last.token || e.Revision != last.rev || string(e.Value) != fmt.Sprint(last.token) {
		t.Fatalf("final entry = %+v; want the last accepted write (token %d, revision %d)", e, last.token, last.rev)
	}
}

// TestG2FenceSurvivesDelete checks that a deleted key keeps rejecting
// stale tokens, for every write, and that Get still reports its fence.
func TestG2FenceSurvivesDelete(t *testing.T) {
	for _, op := range writeOps {
		t.Run(op.name, func(t *testing.T) {
			db, _ := newDB(t)
			ctx := context.Background()
			put(t, db, "k", "v", fencekv.WriteOptions{Token: 8})
			deleted, res, err := db.Delete(ctx, []byte("k"), fencekv.WriteOptions{Token: 8})
			if err != nil || !deleted || res.Fence != 8 {
				t.Fatalf("delete = %v, %+v, %v; want deleted with fence 8", deleted, res, err)
			}
			if e := getKey(t, db, "k"); e.Found || e.Fence != 8 || e.Revision != 0 {
				t.Fatalf("get after delete = %+v; want not found, fence 8, revision 0", e)
			}
			for _, tok := range []fencekv.Token{0, 7} {
				_, err := op.run(db, "k", fencekv.WriteOptions{Token: tok})
				if e := wantErr(t, err, fencekv.CodeStaleToken); e.Fence != 8 {
					t.Errorf("token %d: fence in refusal = %d; want 8", tok, e.Fence)
				}
			}
			if _, err := op.run(db, "k", fencekv.WriteOptions{Token: 8}); err != nil {
				t.Errorf("write with the fence's own token after delete: %v", err)
			}
		})
	}
}

// TestG2DeleteMissing: a tokenless delete of a missing key is accepted and
// advances only the store's revision; one with a token also raises the
// fence.
func TestG2DeleteMissing(t *testing.T) {
	db, _ := newDB(t)
	ctx := context.Background()
	deleted, res, err := db.Delete(ctx, []byte("ghost"), fencekv.WriteOptions{})
	if err != nil || deleted || res != (fencekv.WriteResult{Revision: 1}) {
		t.Fatalf("tokenless delete of a missing key = %v, %+v, %v; want not deleted, fence 0, revision 1", deleted, res, err)
	}
	if s := status(t, db); s.Revision != 1 || s.Keys != 0 {
		t.Fatalf("status after a tokenless delete of a missing key = revision %d, keys %d; want 1, 0", s.Revision, s.Keys)
	}
	if e := getKey(t, db, "ghost"); e.Found || e.Fence != 0 || e.Revision != 0 {
		t.Fatalf("get = %+v; want missing, fence 0, revision 0", e)
	}
	deleted, res, err = db.Delete(ctx, []byte("ghost"), fencekv.WriteOptions{Token: 12})
	if err != nil || deleted || res.Fence != 12 || res.Revision != 2 {
		t.Fatalf("delete with token of a missing key = %v, %+v, %v; want not deleted, fence 12, revision 2", deleted, res, err)
	}
	if e := getKey(t, db, "ghost"); e.Found || e.Fence != 12 {
		t.Fatalf("get = %+v; want not found with fence 12", e)
	}
	_, err = db.Put(ctx, []byte("ghost"), []byte("x"), fencekv.WriteOptions{Token: 11})
	wantErr(t, err, fencekv.CodeStaleToken)
	if s := status(t, db); s.Revision != 2 || s.Keys != 0 {
		t.Fatalf("status = revision %d, keys %d; want 2, 0", s.Revision, s.Keys)
	}
}

// TestG3Unfenced: writes without a token work on keys no fenced write ever
// touched, and are refused once a fenced write has.
func TestG3Unfenced(t *testing.T) {
	for _, op := range writeOps {
		t.Run(op.name, func(t *testing.T) {
			db, _ := newDB(t)
			put(t, db, "k", "1", fencekv.WriteOptions{})
			for i := 0; i < 3; i++ {
				res, err := op.run(db, "k", fencekv.WriteOptions{})
				if err != nil {
					t.Fatalf("unfenced %s #%d: %v", op.name, i, err)
				}
				if res.Fence != 0 {
					t.Fatalf("unfenced %s set fence %d", op.name, res.Fence)
				}
			}
			put(t, db, "k", "1", fencekv.WriteOptions{Token: 1})
			_, err := op.run(db, "k", fencekv.WriteOptions{})
			if e := wantErr(t, err, fencekv.CodeStaleToken); e.Fence != 1 {
				t.Fatalf("fence in refusal = %d; want 1", e.Fence)
			}
		})
	}
}

// TestG2StrictNeedsToken: strict without a token is bad_request, for every
// write, and changes nothing.
func TestG2StrictNeedsToken(t *testing.T) {
	for _, op := range writeOps {
		t.Run(op.name, func(t *testing.T) {
			db, _ := newDB(t)
			put(t, db, "k", "1", fencekv.WriteOptions{})
			before := snapshot(t, db, []string{"k"}, nil)
			_, err := op.run(db, "k", fencekv.WriteOptions{Strict: true})
			wantErr(t, err, fencekv.CodeBadRequest)
			if after := snapshot(t, db, []string{"k"}, nil); after != before {
				t.Fatalf("refused write changed the store:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

func TestCASAndIncr(t *testing.T) {
	db, _ := newDB(t)
	ctx := context.Background()
	res, err := db.CAS(ctx, []byte("c"), 0, []byte("a"), fencekv.WriteOptions{})
	if err != nil || res.Revision != 1 {
		t.Fatalf("cas rev 0 on absent key = %+v, %v; want revision 1", res, err)
	}
	_, err = db.CAS(ctx, []byte("c"), 0, []byte("b"), fencekv.WriteOptions{})
	if e := wantErr(t, err, fencekv.CodeCompareFailed); e.Revision != 1 {
		t.Fatalf("compare_failed revision = %d; want 1", e.Revision)
	}
	_, err = db.CAS(ctx, []byte("c"), 7, []byte("b"), fencekv.WriteOptions{})
	if e := wantErr(t, err, fencekv.CodeCompareFailed); e.Revision != 1 {
		t.Fatalf("compare_failed revision = %d; want 1", e.Revision)
	}
	if _, err := db.CAS(ctx, []byte("c"), 1, []byte("b"), fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}

	n, res, err := db.Incr(ctx, []byte("n"), 41, fencekv.WriteOptions{})
	if err != nil || n != 41 || res.Revision != 3 {
		t.Fatalf("incr of a missing key = %d, %+v, %v; want 41 at revision 3", n, res, err)
	}
	n, _, err = db.Incr(ctx, []byte("n"), 1, fencekv.WriteOptions{})
	if err != nil || n != 42 {
		t.Fatalf("incr = %d, %v; want 42", n, err)
	}
	if e := getKey(t, db, "n"); string(e.Value) != "42" {
		t.Fatalf("stored counter = %q; want decimal text 42", e.Value)
	}
	_, _, err = db.Incr(ctx, []byte("c"), 1, fencekv.WriteOptions{})
	wantErr(t, err, fencekv.CodeNotInteger)
	put(t, db, "big", "9223372036854775807", fencekv.WriteOptions{})
	_, _, err = db.Incr(ctx, []byte("big"), 1, fencekv.WriteOptions{})
	wantErr(t, err, fencekv.CodeNotInteger)
	if e := getKey(t, db, "big"); string(e.Value) != "9223372036854775807" {
		t.Fatalf("overflowing incr changed the value to %q", e.Value)
	}
}

func TestScan(t *testing.T) {
	db, _ := newDB(t)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		put(t, db, fmt.Sprintf("s/%02d", i), strings.Repeat("v", 100), fencekv.WriteOptions{})
	}
	put(t, db, "t", "x", fencekv.WriteOptions{})
	db.Delete(ctx, []byte("s/03"), fencekv.WriteOptions{})
	// Page through s/ three at a time with last key + "\x00".
	var got []string
	start := []byte(nil)
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("paging does not end")
		}
		items, more, err := db.Scan(ctx, fencekv.ScanOptions{Prefix: []byte("s/"), Start: start, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range items {
			got = append(got, string(e.Key))
		}
		if !more {
			break
		}
		start = append(bytes.Clone(items[len(items)-1].Key), 0)
	}
	want := "s/00 s/01 s/02 s/04 s/05 s/06 s/07 s/08 s/09"
	if strings.Join(got, " ") != want {
		t.Fatalf("paged scan = %v; want %s", got, want)
	}

	// MaxScanBytes cuts a page short and says so.
	small := openDB(t, "", fencekvtest.NewClock(), func(o *fencekv.Options) { o.MaxScanBytes = 250 })
	for i := 0; i < 5; i++ {
		put(t, small, fmt.Sprintf("s/%d", i), strings.Repeat("v", 100), fencekv.WriteOptions{})
	}
	items, more, err := small.Scan(ctx, fencekv.ScanOptions{})
	if err != nil || len(items) != 2 || !more {
		t.Fatalf("scan over MaxScanBytes = %d items, more %v, %v; want 2 items and more", len(items), more, err)
	}
}

// TestG4HeldWrites: a write naming a lock is accepted only while that lock
// is held by exactly the write's token.
func TestG4HeldWrites(t *testing.T) {
	type setup struct {
		name string
		// prepare returns the token the write carries and the lock name.
		prepare func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) (fencekv.Token, string)
		code    fencekv.Code
		fact    func(l fencekv.Token) fencekv.Token // the refusal's Token fact, given the write's token
	}
	tests := []setup{
		{"held by the token", func(t *testing.T, db *fencekv.DB, _ *fencekvtest.Clock) (fencekv.Token, string) {
			return acquire(t, db, "L", time.Second, nil).Token, "L"
		}, "", nil},
		{"renewed", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) (fencekv.Token, string) {
			l := acquire(t, db, "L", time.Second, nil)
			clock.Advance(900 * time.Millisecond)
			if _, err := db.Renew(context.Background(), "L", l.Token); err != nil {
				t.Fatal(err)
			}
			clock.Advance(900 * time.Millisecond)
			return l.Token, "L"
		}, "", nil},
		{"expired, nobody took it", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) (fencekv.Token, string) {
			l := acquire(t, db, "L", time.Second, nil)
			clock.Advance(time.Second)
			return l.Token, "L"
		}, fencekv.CodeLeaseExpired, func(l fencekv.Token) fencekv.Token { return l }},
		{"expired long ago", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) (fencekv.Token, string) {
			l := acquire(t, db, "L", time.Second, nil)
			clock.Advance(time.Second)
			eventually(t, "the expiry to be applied", func() bool { return status(t, db).Locks == 0 })
			clock.Advance(lease.Retention / 2)
			return l.Token, "L"
		}, fencekv.CodeLeaseExpired, func(l fencekv.Token) fencekv.Token { return l }},
		{"expired past the record's retention", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) (fencekv.Token, string) {
			l := acquire(t, db, "L", time.Second, nil)
			clock.Advance(time.Second)
			eventually(t, "the expiry to be applied", func() bool { return status(t, db).Locks == 0 })
			clock.Advance(lease.Retention)
			eventually(t, "the record to be forgotten", func() bool {
				in, err := db.LockInfo(context.Background(), "L")
				return err == nil && in.Token == 0
			})
			return l.Token, "L"
		}, fencekv.CodeNotHolder, func(fencekv.Token) fencekv.Token { return 0 }},
		{"never acquired", func(t *testing.T, db *fencekv.DB, _ *fencekvtest.Clock) (fencekv.Token, string) {
			return 1, "L"
		}, fencekv.CodeNotHolder, func(fencekv.Token) fencekv.Token { return 0 }},
		{"released", func(t *testing.T, db *fencekv.DB, _ *fencekvtest.Clock) (fencekv.Token, string) {
			l := acquire(t, db, "L", time.Second, nil)
			db.Release(context.Background(), "L", l.Token)
			return l.Token, "L"
		}, fencekv.CodeNotHolder, func(fencekv.Token) fencekv.Token { return 0 }},
		{"held by a later token", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) (fencekv.Token, string) {
			l := acquire(t, db, "L", time.Second, nil)
			clock.Advance(time.Second)
			acquire(t, db, "L", time.Second, nil)
			return l.Token, "L"
		}, fencekv.CodeNotHolder, func(l fencekv.Token) fencekv.Token { return l + 1 }},
		{"token from another lock", func(t *testing.T, db *fencekv.DB, _ *fencekvtest.Clock) (fencekv.Token, string) {
			acquire(t, db, "L", time.Second, nil)
			return acquire(t, db, "M", time.Second, nil).Token, "L"
		}, fencekv.CodeNotHolder, func(fencekv.Token) fencekv.Token { return 1 }},
		{"a higher made-up token", func(t *testing.T, db *fencekv.DB, _ *fencekvtest.Clock) (fencekv.Token, string) {
			return acquire(t, db, "L", time.Second, nil).Token + 100, "L"
		}, fencekv.CodeNotHolder, func(fencekv.Token) fencekv.Token { return 1 }},
	}
	for _, op := range writeOps {
		for _, tt := range tests {
			t.Run(op.name+"/"+tt.name, func(t *testing.T) {
				db, clock := newDB(t)
				tok, lock := tt.prepare(t, db, clock)
				before := snapshot(t, db, []string{"k"}, []string{lock})
				res, err := op.run(db, "k", fencekv.WriteOptions{Token: tok, Lock: lock})
				if tt.code == "" {
					wantErr(t, err, "")
					if res.Fence != tok {
						t.Fatalf("fence after held write = %d; want %d", res.Fence, tok)
					}
					return
				}
				e := wantErr(t, err, tt.code)
				if want := tt.fact(tok); e.Token != want {
					t.Errorf("refusal token = %d; want %d", e.Token, want)
				}
				if after := snapshot(t, db, []string{"k"}, []string{lock}); after != before {
					t.Errorf("refused write changed the store:\nbefore %s\nafter  %s", before, after)
				}
			})
		}
	}
}

// TestRefusalOrder: bad_request/too_large, then the lock check, then
// stale_token, then compare_failed/not_integer.
func TestRefusalOrder(t *testing.T) {
	ctx := context.Background()
	big := make([]byte, fencekv.DefaultOptions().MaxValueSize+1)
	tests := []struct {
		name  string
		write func(db *fencekv.DB, holder fencekv.Token) error
		code  fencekv.Code
	}{
		{"empty key before lock check", func(db *fencekv.DB, _ fencekv.Token) error {
			_, err := db.Put(ctx, nil, []byte("v"), fencekv.WriteOptions{Token: 1, Lock: "free"})
			return err
		}, fencekv.CodeBadRequest},
		{"too large before lock check", func(db *fencekv.DB, _ fencekv.Token) error {
			_, err := db.Put(ctx, []byte("k"), big, fencekv.WriteOptions{Token: 1, Lock: "free"})
			return err
		}, fencekv.CodeTooLarge},
		{"strict without token before fence", func(db *fencekv.DB, _ fencekv.Token) error {
			_, err := db.Put(ctx, []byte("fenced"), []byte("v"), fencekv.WriteOptions{Strict: true})
			return err
		}, fencekv.CodeBadRequest},
		{"lock without token", func(db *fencekv.DB, _ fencekv.Token) error {
			_, err := db.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{Lock: "L"})
			return err
		}, fencekv.CodeBadRequest},
		{"not_holder before stale_token", func(db *fencekv.DB, _ fencekv.Token) error {
			_, err := db.Put(ctx, []byte("fenced"), []byte("v"), fencekv.WriteOptions{Token: 1, Lock: "free"})
			return err
		}, fencekv.CodeNotHolder},
		{"stale_token after a passed lock check", func(db *fencekv.DB, holder fencekv.Token) error {
			_, err := db.Put(ctx, []byte("fenced"), []byte("v"), fencekv.WriteOptions{Token: holder, Lock: "L"})
			return err
		}, fencekv.CodeStaleToken},
		{"not_holder before compare_failed", func(db *fencekv.DB, _ fencekv.Token) error {
			_, err := db.CAS(ctx, []byte("k"), 99, []byte("v"), fencekv.WriteOptions{Token: 1, Lock: "free"})
			return err
		}, fencekv.CodeNotHolder},
		{"stale_token before compare_failed", func(db *fencekv.DB, holder fencekv.Token) error {
			_, err := db.CAS(ctx, []byte("fenced"), 99, []byte("v"), fencekv.WriteOptions{Token: holder, Lock: "L"})
			return err
		}, fencekv.CodeStaleToken},
		{"compare_failed last", func(db *fencekv.DB, holder fencekv.Token) error {
			_, err := db.CAS(ctx, []byte("k"), 99, []byte("v"), fencekv.WriteOptions{Token: holder, Lock: "L"})
			return err
		}, fencekv.CodeCompareFailed},
		{"not_holder before not_integer", func(db *fencekv.DB, _ fencekv.Token) error {
			_, _, err := db.Incr(ctx, []byte("k"), 1, fencekv.WriteOptions{Token: 1, Lock: "free"})
			return err
		}, fencekv.CodeNotHolder},
		{"stale_token before not_integer", func(db *fencekv.DB, holder fencekv.Token) error {
			_, _, err := db.Incr(ctx, []byte("fenced"), 1, fencekv.WriteOptions{Token: holder, Lock: "L"})
			return err
		}, fencekv.CodeStaleToken},
		{"not_integer last", func(db *fencekv.DB, holder fencekv.Token) error {
			_, _, err := db.Incr(ctx, []byte("k"), 1, fencekv.WriteOptions{Token: holder, Lock: "L"})
			return err
		}, fencekv.CodeNotInteger},
		{"lease_expired before stale_token", func(db *fencekv.DB, _ fencekv.Token) error {
			_, err := db.Put(ctx, []byte("fenced"), []byte("v"), fencekv.WriteOptions{Token: 1, Lock: "gone"})
			return err
		}, fencekv.CodeLeaseExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, clock := newDB(t)
			gone := acquire(t, db, "gone", time.Second, nil) // token 1
			clock.Advance(time.Second)
			l := acquire(t, db, "L", time.Hour, nil)                          // token 2
			put(t, db, "k", "not a number", fencekv.WriteOptions{})           // unfenced, not an integer
			put(t, db, "fenced", "also not", fencekv.WriteOptions{Token: 50}) // fenced above every grant
			if gone.Token != 1 || l.Token != 2 {
				t.Fatalf("setup tokens = %d, %d; want 1, 2", gone.Token, l.Token)
			}
			before := snapshot(t, db, []string{"k", "fenced"}, []string{"L", "gone"})
			wantErr(t, tt.write(db, l.Token), tt.code)
			if after := snapshot(t, db, []string{"k", "fenced"}, []string{"L", "gone"}); after != before {
				t.Errorf("refused write changed the store:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// TestBadInput: malformed or oversized arguments are typed refusals that
// change nothing.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	lim := fencekv.DefaultOptions()
	bigKey := bytes.Repeat([]byte("k"), lim.MaxKeySize+1)
	bigValue := make([]byte, lim.MaxValueSize+1)
	bigName := strings.Repeat("n", lim.MaxKeySize+1)
	ok := []byte("k")
	tests := []struct {
		name string
		call func(db *fencekv.DB) error
		code fencekv.Code
	}{
		{"put empty key", func(db *fencekv.DB) error {
			_, err := db.Put(ctx, nil, []byte("v"), fencekv.WriteOptions{})
			return err
		}, fencekv.CodeBadRequest},
		{"put key too large", func(db *fencekv.DB) error {
			_, err := db.Put(ctx, bigKey, []byte("v"), fencekv.WriteOptions{})
			return err
		}, fencekv.CodeTooLarge},
		{"put value too large", func(db *fencekv.DB) error {
			_, err := db.Put(ctx, ok, bigValue, fencekv.WriteOptions{})
			return err
		}, fencekv.CodeTooLarge},
		{"put lock name too large", func(db *fencekv.DB) error {
			_, err := db.Put(ctx, ok, []byte("v"), fencekv.WriteOptions{Token: 1, Lock: bigName})
			return err
		}, fencekv.CodeTooLarge},
		{"delete empty key", func(db *fencekv.DB) error {
			_, _, err := db.Delete(ctx, []byte{}, fencekv.WriteOptions{Token: 1})
			return err
		}, fencekv.CodeBadRequest},
		{"delete key too large", func(db *fencekv.DB) error {
			_, _, err := db.Delete(ctx, bigKey, fencekv.WriteOptions{Token: 1})
			return err
		}, fencekv.CodeTooLarge},
		{"cas value too large", func(db *fencekv.DB) error {
			_, err := db.CAS(ctx, ok, 0, bigValue, fencekv.WriteOptions{})
			return err
		}, fencekv.CodeTooLarge},
		{"incr empty key", func(db *fencekv.DB) error {
			_, _, err := db.Incr(ctx, nil, 1, fencekv.WriteOptions{})
			return err
		}, fencekv.CodeBadRequest},
		{"get empty key", func(db *fencekv.DB) error {
			_, err := db.Get(ctx, nil)
			return err
		}, fencekv.CodeBadRequest},
		{"get key too large", func(db *fencekv.DB) error {
			_, err := db.Get(ctx, bigKey)
			return err
		}, fencekv.CodeTooLarge},
		{"scan negative limit", func(db *fencekv.DB) error {
			_, _, err := db.Scan(ctx, fencekv.ScanOptions{Limit: -1})
			return err
		}, fencekv.CodeBadRequest},
		{"scan limit over max", func(db *fencekv.DB) error {
			_, _, err := db.Scan(ctx, fencekv.ScanOptions{Limit: lim.MaxScan + 1})
			return err
		}, fencekv.CodeBadRequest},
		{"acquire empty name", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "", time.Second, nil)
			return err
		}, fencekv.CodeBadRequest},
		{"acquire name too large", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, bigName, time.Second, nil)
			return err
		}, fencekv.CodeTooLarge},
		{"acquire ttl too short", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "L", lim.MinTTL-1, nil)
			return err
		}, fencekv.CodeBadRequest},
		{"acquire ttl zero", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "L", 0, nil)
			return err
		}, fencekv.CodeBadRequest},
		{"acquire ttl negative", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "L", -time.Second, nil)
			return err
		}, fencekv.CodeBadRequest},
		{"acquire ttl too long", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "L", lim.MaxTTL+1, nil)
			return err
		}, fencekv.CodeBadRequest},
		{"acquire negative wait", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: -1})
			return err
		}, fencekv.CodeBadRequest},
		{"acquire wait too long", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: lim.MaxWait + 1})
			return err
		}, fencekv.CodeBadRequest},
		{"acquire negative lock delay", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{LockDelay: -1})
			return err
		}, fencekv.CodeBadRequest},
		{"acquire lock delay too long", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{LockDelay: lim.MaxLockDelay + 1})
			return err
		}, fencekv.CodeBadRequest},
		{"acquire holder too large", func(db *fencekv.DB) error {
			_, err := db.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Holder: bigName})
			return err
		}, fencekv.CodeTooLarge},
		{"renew empty name", func(db *fencekv.DB) error {
			_, err := db.Renew(ctx, "", 1)
			return err
		}, fencekv.CodeBadRequest},
		{"release name too large", func(db *fencekv.DB) error {
			return db.Release(ctx, bigName, 1)
		}, fencekv.CodeTooLarge},
		{"lock info empty name", func(db *fencekv.DB) error {
			_, err := db.LockInfo(ctx, "")
			return err
		}, fencekv.CodeBadRequest},
		{"locks negative limit", func(db *fencekv.DB) error {
			_, _, err := db.Locks(ctx, "", "", -5)
			return err
		}, fencekv.CodeBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, _ := newDB(t)
			l := acquire(t, db, "L0", time.Second, nil)
			put(t, db, "k", "v", fencekv.WriteOptions{Token: l.Token})
			before := snapshot(t, db, []string{"k"}, []string{"L", "L0"})
			err := tt.call(db)
			wantErr(t, err, tt.code)
			switch tt.code {
			case fencekv.CodeBadRequest:
				if !errors.Is(err, fencekv.ErrBadRequest) {
					t.Errorf("errors.Is(err, ErrBadRequest) = false")
				}
			case fencekv.CodeTooLarge:
				if !errors.Is(err, fencekv.ErrTooLarge) {
					t.Errorf("errors.Is(err, ErrTooLarge) = false")
				}
			}
			if after := snapshot(t, db, []string{"k"}, []string{"L", "L0"}); after != before {
				t.Errorf("bad input changed the store:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// TestLimitsAccepted: the limits themselves are accepted.
func TestLimitsAccepted(t *testing.T) {
	db, _ := newDB(t)
	ctx := context.Background()
	lim := db.Limits()
	key := bytes.Repeat([]byte("k"), lim.MaxKeySize)
	if _, err := db.Put(ctx, key, make([]byte, lim.MaxValueSize), fencekv.WriteOptions{}); err != nil {
		t.Fatalf("put at the size limits: %v", err)
	}
	for _, ttl := range []time.Duration{lim.MinTTL, lim.MaxTTL} {
		name := fmt.Sprint("ttl-", ttl)
		l, err := db.Acquire(ctx, name, ttl, &fencekv.AcquireOptions{LockDelay: lim.MaxLockDelay, Holder: strings.Repeat("h", lim.MaxKeySize)})
		if err != nil || l.TTL != ttl {
			t.Fatalf("acquire with ttl %v = %+v, %v", ttl, l, err)
		}
	}
}

// TestG7RenewExtends: a renew gives the full TTL again from now.
func TestG7RenewExtends(t *testing.T) {
	db, clock := newDB(t)
	ctx := context.Background()
	l := acquire(t, db, "L", time.Second, &fencekv.AcquireOptions{Holder: "me"})
	if in := lockInfo(t, db, "L"); !in.Held || in.TTL != time.Second || in.Holder != "me" || in.Token != l.Token {
		t.Fatalf("info = %+v; want held by me with 1s", in)
	}
	for i := 0; i < 3; i++ {
		clock.Advance(800 * time.Millisecond)
		ttl, err := db.Renew(ctx, "L", l.Token)
		if err != nil || ttl != time.Second {
			t.Fatalf("renew #%d = %v, %v; want 1s", i, ttl, err)
		}
		if in := lockInfo(t, db, "L"); !in.Held || in.TTL != time.Second {
			t.Fatalf("info after renew = %+v; want held with 1s", in)
		}
	}
	clock.Advance(999 * time.Millisecond)
	put(t, db, "k", "v", fencekv.WriteOptions{Token: l.Token, Lock: "L"})
	clock.Advance(time.Millisecond)
	_, err := db.Renew(ctx, "L", l.Token)
	wantErr(t, err, fencekv.CodeLeaseExpired)
	if in := lockInfo(t, db, "L"); in.Held {
		t.Fatalf("info after the lease ran out = %+v; want not held", in)
	}
}

// TestG7StaleRenewRelease: renew and release with a token that does not
// hold the lock are refused and change nothing.
func TestG7StaleRenewRelease(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		prepare func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) fencekv.Token // returns the stale token
		code    fencekv.Code
	}{
		{"expired, nobody took it", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) fencekv.Token {
			l := acquire(t, db, "L", time.Second, nil)
			clock.Advance(2 * time.Second)
			return l.Token
		}, fencekv.CodeLeaseExpired},
		{"expired and taken", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) fencekv.Token {
			l := acquire(t, db, "L", time.Second, nil)
			clock.Advance(time.Second)
			acquire(t, db, "L", time.Second, nil)
			return l.Token
		}, fencekv.CodeNotHolder},
		{"released", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) fencekv.Token {
			l := acquire(t, db, "L", time.Second, nil)
			db.Release(ctx, "L", l.Token)
			return l.Token
		}, fencekv.CodeNotHolder},
		{"released and taken", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) fencekv.Token {
			l := acquire(t, db, "L", time.Second, nil)
			db.Release(ctx, "L", l.Token)
			acquire(t, db, "L", time.Second, nil)
			return l.Token
		}, fencekv.CodeNotHolder},
		{"token never issued", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) fencekv.Token {
			acquire(t, db, "L", time.Second, nil)
			return 999
		}, fencekv.CodeNotHolder},
		{"free lock", func(t *testing.T, db *fencekv.DB, clock *fencekvtest.Clock) fencekv.Token {
			return 1
		}, fencekv.CodeNotHolder},
	}
	for _, tt := range tests {
		for _, call := range []string{"renew", "release"} {
			t.Run(tt.name+"/"+call, func(t *testing.T) {
				db, clock := newDB(t)
				tok := tt.prepare(t, db, clock)
				before := snapshot(t, db, nil, []string{"L"})
				var err error
				if call == "renew" {
					_, err = db.Renew(ctx, "L", tok)
				} else {
					err = db.Release(ctx, "L", tok)
				}
				wantErr(t, err, tt.code)
				if after := snapshot(t, db, nil, []string{"L"}); after != before {
					t.Errorf("refused %s changed the store:\nbefore %s\nafter  %s", call, before, after)
				}
			})
		}
	}
}

// TestG7LockDelay: after a lease expires nobody can acquire the lock until
// its lock-delay has passed; after a clean release there is no delay.
func TestG7LockDelay(t *testing.T) {
	ctx := context.Background()
	t.Run("after expiry", func(t *testing.T) {
		db, clock := newDB(t)
		l := acquire(t, db, "L", time.Second, &fencekv.AcquireOptions{LockDelay: 5 * time.Second, Holder: "old"})
		clock.Advance(time.Second)
		left := 5 * time.Second
		for _, step := range []time.Duration{0, 2 * time.Second, 2999 * time.Millisecond} {
			clock.Advance(step)
			left -= step
			_, err := db.Acquire(ctx, "L", time.Second, nil)
			if e := wantErr(t, err, fencekv.CodeLockHeld); e.RetryAfter != left {
				t.Fatalf("retry during lock-delay = %v; want %v", e.RetryAfter, left)
			}
			in := lockInfo(t, db, "L")
			if in.Held || in.Delay != left || in.Token != l.Token {
				t.Fatalf("info in delay = %+v; want not held, delay %v, token %d", in, left, l.Token)
			}
		}
		if s := status(t, db); s.LastToken != l.Token {
			t.Fatalf("acquires refused by the delay issued tokens: last %d, want %d", s.LastToken, l.Token)
		}
		clock.Advance(time.Millisecond) // exactly 5s after the deadline
		l2 := acquire(t, db, "L", time.Second, nil)
		if l2.Token != l.Token+1 {
			t.Fatalf("token after the delay = %d; want %d", l2.Token, l.Token+1)
		}
	})
	t.Run("retry after is exact", func(t *testing.T) {
		db, clock := newDB(t)
		acquire(t, db, "L", time.Second, &fencekv.AcquireOptions{LockDelay: 5 * time.Second})
		clock.Advance(3 * time.Second)
		_, err := db.Acquire(ctx, "L", time.Second, nil)
		if e := wantErr(t, err, fencekv.CodeLockHeld); e.RetryAfter != 3*time.Second {
			t.Fatalf("retry = %v; want 3s", e.RetryAfter)
		}
	})
	t.Run("no delay after release", func(t *testing.T) {
		db, _ := newDB(t)
		l := acquire(t, db, "L", time.Second, &fencekv.AcquireOptions{LockDelay: time.Hour})
		if err := db.Release(ctx, "L", l.Token); err != nil {
			t.Fatal(err)
		}
		if in := lockInfo(t, db, "L"); in.Held || in.Delay != 0 {
			t.Fatalf("info after release = %+v; want free, no delay", in)
		}
		acquire(t, db, "L", time.Second, nil)
	})
	t.Run("waiter gets the lock when the delay ends", func(t *testing.T) {
		db, clock := newDB(t)
		l := acquire(t, db, "L", time.Second, &fencekv.AcquireOptions{LockDelay: 2 * time.Second})
		eventually(t, "the expiry timer", func() bool { return clock.Timers() == 1 })
		got := make(chan error, 1)
		var l2 fencekv.Lease
		go func() {
			var err error
			l2, err = db.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: time.Hour})
			got <- err
		}()
		eventually(t, "the waiter to queue", func() bool { return lockInfo(t, db, "L").Waiters == 1 && clock.Timers() == 2 })
		clock.Advance(time.Second) // the lease expires; the delay begins
		eventually(t, "the expiry to be applied", func() bool { return status(t, db).Locks == 0 })
		select {
		case err := <-got:
			t.Fatalf("waiter answered during the lock-delay: %v", err)
		default:
		}
		eventually(t, "the delay timer", func() bool { return clock.Timers() == 2 })
		clock.Advance(2 * time.Second)
		select {
		case err := <-got:
			if err != nil || l2.Token != l.Token+1 {
				t.Fatalf("waiter = %+v, %v; want token %d", l2, err, l.Token+1)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter not granted after the delay")
		}
	})
}

// TestG7FIFO: callers queued for a lock get it in the order they queued.
func TestG7FIFO(t *testing.T) {
	db, _ := newDB(t)
	ctx := context.Background()
	holder := acquire(t, db, "L", time.Hour, nil)
	const n = 5
	type result struct {
		l   fencekv.Lease
		err error
	}
	results := make([]chan result, n)
	for i := range results {
		results[i] = make(chan result, 1)
		go func() {
			l, err := db.Acquire(ctx, "L", time.Hour, &fencekv.AcquireOptions{Wait: time.Hour, Holder: fmt.Sprint("w", i)})
			results[i] <- result{l, err}
		}()
		// The next one starts only once this one is in the queue.
		eventually(t, fmt.Sprintf("waiter %d to queue", i), func() bool { return lockInfo(t, db, "L").Waiters == i+1 })
	}
	if s := status(t, db); s.Waiters != n {
		t.Fatalf("status waiters = %d; want %d", s.Waiters, n)
	}
	prev := holder
	for i := 0; i < n; i++ {
		if err := db.Release(ctx, "L", prev.Token); err != nil {
			t.Fatal(err)
		}
		var r result
		select {
		case r = <-results[i]:
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d not granted after turn %d", i, i)
		}
		if r.err != nil || r.l.Token != prev.Token+1 {
			t.Fatalf("waiter %d = %+v, %v; want token %d", i, r.l, r.err, prev.Token+1)
		}
		for j := i + 1; j < n; j++ {
			select {
			case r := <-results[j]:
				t.Fatalf("waiter %d answered out of turn (after %d): %+v, %v", j, i, r.l, r.err)
			default:
			}
		}
		in := lockInfo(t, db, "L")
		if !in.Held || in.Token != r.l.Token || in.Holder != fmt.Sprint("w", i) || in.Waiters != n-i-1 {
			t.Fatalf("info after turn %d = %+v", i, in)
		}
		prev = r.l
	}
}

// TestG7ExpiryHandsOff: when a lease runs out, the expiry hands the lock
// to the head of the queue, and so on down the queue.
func TestG7ExpiryHandsOff(t *testing.T) {
	db, clock := newDB(t)
	ctx := context.Background()
	holder := acquire(t, db, "L", time.Second, nil)
	eventually(t, "the expiry timer", func() bool { return clock.Timers() == 1 })
	const n = 3
	got := make([]chan fencekv.Lease, n)
	for i := range got {
		got[i] = make(chan fencekv.Lease, 1)
		go func() {
			l, err := db.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: time.Hour})
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			got[i] <- l
		}()
		eventually(t, fmt.Sprintf("waiter %d to queue", i), func() bool {
			return lockInfo(t, db, "L").Waiters == i+1 && clock.Timers() == i+2
		})
	}
	want := holder.Token
	for i := 0; i < n; i++ {
		clock.Advance(time.Second)
		want++
		select {
		case l := <-got[i]:
			if l.Token != want {
				t.Fatalf("waiter %d got token %d; want %d", i, l.Token, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d not granted when the lease before it expired", i)
		}
	}
}

// TestG7WaiterCancelled: a waiter whose context ends leaves the queue, and
// the lock is not granted to it.
func TestG7WaiterCancelled(t *testing.T) {
	db, _ := newDB(t)
	holder := acquire(t, db, "L", time.Hour, nil)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := db.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: time.Hour})
		got <- err
	}()
	eventually(t, "the waiter to queue", func() bool { return lockInfo(t, db, "L").Waiters == 1 })
	cancel()
	select {
	case err := <-got:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter = %v; want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("cancelled waiter did not return")
	}
	if in := lockInfo(t, db, "L"); in.Waiters != 0 {
		t.Fatalf("waiters after cancel = %d; want 0", in.Waiters)
	}
	if err := db.Release(context.Background(), "L", holder.Token); err != nil {
		t.Fatal(err)
	}
	if in := lockInfo(t, db, "L"); in.Held {
		t.Fatalf("lock after release = %+v; want free (the cancelled waiter must not get it)", in)
	}
	if s := status(t, db); s.LastToken != holder.Token || s.Waiters != 0 {
		t.Fatalf("status = %+v; want last token %d, no waiters", s, holder.Token)
	}
}

// TestG7CancelRacesGrant cancels a waiter at the moment the lock is handed
// to it. Whichever wins, the lock must not stay held by a grant nobody
// has: either the waiter returns the lease, or it returns ctx's error and
// the grant it may have got was released.
func TestG7CancelRacesGrant(t *testing.T) {
	db, _ := newDB(t)
	for i := 0; i < 30; i++ {
		holder := acquire(t, db, "L", time.Hour, nil)
		ctx, cancel := context.WithCancel(context.Background())
		type result struct {
			l   fencekv.Lease
			err error
		}
		got := make(chan result, 1)
		go func() {
			l, err := db.Acquire(ctx, "L", time.Hour, &fencekv.AcquireOptions{Wait: time.Hour})
			got <- result{l, err}
		}()
		eventually(t, "the waiter to queue", func() bool { return lockInfo(t, db, "L").Waiters == 1 })
		go cancel()
		if err := db.Release(context.Background(), "L", holder.Token); err != nil {
			t.Fatal(err)
		}
		r := <-got
		switch {
		case r.err == nil:
			if in := lockInfo(t, db, "L"); !in.Held || in.Token != r.l.Token {
				t.Fatalf("round %d: waiter got %+v but the lock is %+v", i, r.l, in)
			}
			if err := db.Release(context.Background(), "L", r.l.Token); err != nil {
				t.Fatal(err)
			}
		case errors.Is(r.err, context.Canceled):
			if in := lockInfo(t, db, "L"); in.Held {
				t.Fatalf("round %d: cancelled waiter returned but the lock is held: %+v", i, in)
			}
		default:
			t.Fatalf("round %d: waiter = %v", i, r.err)
		}
	}
}

// TestG7WaitTimeout: a wait that runs out is lock_held with the holder and
// the time to wait.
func TestG7WaitTimeout(t *testing.T) {
	db, clock := newDB(t)
	holder := acquire(t, db, "L", time.Hour, &fencekv.AcquireOptions{Holder: "owner"})
	eventually(t, "the expiry timer", func() bool { return clock.Timers() == 1 })
	got := make(chan error, 1)
	go func() {
		_, err := db.Acquire(context.Background(), "L", time.Second, &fencekv.AcquireOptions{Wait: 2 * time.Second})
		got <- err
	}()
	eventually(t, "the waiter to queue", func() bool { return lockInfo(t, db, "L").Waiters == 1 && clock.Timers() == 2 })
	clock.Advance(time.Second)
	select {
	case err := <-got:
		t.Fatalf("waiter returned before its wait ran out: %v", err)
	default:
	}
	clock.Advance(time.Second)
	select {
	case err := <-got:
		e := wantErr(t, err, fencekv.CodeLockHeld)
		if e.Holder != "owner" || e.Token != holder.Token || e.RetryAfter != time.Hour-2*time.Second {
			t.Fatalf("lock_held facts = holder %q, token %d, retry %v; want owner, %d, %v", e.Holder, e.Token, e.RetryAfter, holder.Token, time.Hour-2*time.Second)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("waiter did not time out")
	}
	if in := lockInfo(t, db, "L"); in.Waiters != 0 || in.Token != holder.Token {
		t.Fatalf("info after timeout = %+v; want holder kept, no waiters", in)
	}
}

func TestMaxWaiters(t *testing.T) {
	clock := fencekvtest.NewClock()
	db := openDB(t, "", clock, func(o *fencekv.Options) { o.MaxWaiters = 1 })
	acquire(t, db, "L", time.Hour, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		db.Acquire(ctx, "L", time.Second, &fencekv.AcquireOptions{Wait: time.Hour})
	}()
	eventually(t, "the waiter to queue", func() bool { return lockInfo(t, db, "L").Waiters == 1 })
	_, err := db.Acquire(context.Background(), "M", time.Second, nil)
	wantErr(t, err, "")
	_, err = db.Acquire(context.Background(), "L", time.Second, &fencekv.AcquireOptions{Wait: time.Hour})
	if !errors.Is(err, fencekv.ErrLimitExceeded) {
		t.Fatalf("acquire over MaxWaiters = %v; want limit_exceeded", err)
	}
	cancel()
	<-done
}

// TestCloseFailsWaiters: Close answers queued waiters with unavailable, and
// every call after Close is unavailable.
func TestCloseFailsWaiters(t *testing.T) {
	clock := fencekvtest.NewClock()
	db := openDB(t, "", clock, nil)
	acquire(t, db, "L", time.Hour, nil)
	got := make(chan error, 1)
	go func() {
		_, err := db.Acquire(context.Background(), "L", time.Second, &fencekv.AcquireOptions{Wait: time.Hour})
		got <- err
	}()
	eventually(t, "the waiter to queue", func() bool { return lockInfo(t, db, "L").Waiters == 1 })
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("second Close = %v; want nil", err)
	}
	select {
	case err := <-got:
		wantErr(t, err, fencekv.CodeUnavailable)
	case <-time.After(5 * time.Second):
		t.Fatalf("waiter not answered by Close")
	}
	_, err := db.Put(context.Background(), []byte("k"), []byte("v"), fencekv.WriteOptions{})
	wantErr(t, err, fencekv.CodeUnavailable)
	_, err = db.Acquire(context.Background(), "M", time.Second, nil)
	wantErr(t, err, fencekv.CodeUnavailable)
}

// TestLocks lists held locks only.
func TestLocks(t *testing.T) {
	db, clock := newDB(t)
	ctx := context.Background()
	acquire(t, db, "a/1", time.Hour, nil)
	acquire(t, db, "a/2", time.Second, nil)
	acquire(t, db, "a/3", time.Hour, nil)
	acquire(t, db, "b/1", time.Hour, nil)
	clock.Advance(time.Second)
	locks, more, err := db.Locks(ctx, "a/", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range locks {
		names = append(names, l.Name)
	}
	if fmt.Sprint(names) != "[a/1 a/3]" || more {
		t.Fatalf("locks = %v, more %v; want [a/1 a/3]", names, more)
	}
	locks, more, err = db.Locks(ctx, "", "", 1)
	if err != nil || len(locks) != 1 || locks[0].Name != "a/1" || !more {
		t.Fatalf("locks limit 1 = %+v, %v, %v; want a/1 and more", locks, more, err)
	}
}
