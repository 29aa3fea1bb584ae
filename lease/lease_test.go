package lease

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/kv"
)

// checkHeap fails unless x is a valid min-heap whose positions and map
// agree.
func checkHeap(t *testing.T, x *index) {
	t.Helper()
	if len(x.items) != len(x.byKey) {
		t.Fatalf("heap has %d items, map %d", len(x.items), len(x.byKey))
	}
	for i, it := range x.items {
		if it.pos != i {
			t.Fatalf("item %q at %d says pos %d", it.name, i, it.pos)
		}
		if x.byKey[it.name] != it {
			t.Fatalf("map entry of %q is not the heap's item", it.name)
		}
		if i > 0 && x.items[(i-1)/2].at > it.at {
			t.Fatalf("heap order broken at %d: parent %v > child %v", i, x.items[(i-1)/2].at, it.at)
		}
	}
}

// TestIndexMatchesReference drives the deadline heap with random set and
// remove calls and compares next and due with a sorted reference.
func TestIndexMatchesReference(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, seed))
			x := newIndex()
			ref := map[string]time.Duration{}
			refMin := func() (time.Duration, bool) {
				if len(ref) == 0 {
					return 0, false
				}
				m := time.Duration(math.MaxInt64)
				for _, at := range ref {
					m = min(m, at)
				}
				return m, true
			}
			for step := 0; step < 500; step++ {
				name := fmt.Sprint("l", rng.IntN(40))
				switch rng.IntN(3) {
				case 0, 1:
					at := time.Duration(rng.IntN(100))
					ref[name] = at
					x.set(name, at)
				case 2:
					x.remove(name)
					delete(ref, name)
				}
				checkHeap(t, x)
				if x.Len() != len(ref) {
					t.Fatalf("step %d: Len = %d; want %d", step, x.Len(), len(ref))
				}
				gotAt, gotOK := x.next()
				wantAt, wantOK := refMin()
				if gotAt != wantAt || gotOK != wantOK {
					t.Fatalf("step %d: next = %v, %v; want %v, %v", step, gotAt, gotOK, wantAt, wantOK)
				}
				now := time.Duration(rng.IntN(110))
				var want []string
				for n, at := range ref {
					if at <= now {
						want = append(want, n)
					}
				}
				slices.Sort(want)
				got := x.due(now, math.MaxInt)
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Fatalf("step %d: due(%v) = %v; want %v", step, now, got, want)
				}
				// With a cap, due returns that many distinct due names.
				limit := 1 + rng.IntN(4)
				capped := x.due(now, limit)
				if len(capped) != min(limit, len(want)) {
					t.Fatalf("step %d: due(%v, %d) returned %d names; want %d", step, now, limit, len(capped), min(limit, len(want)))
				}
				seen := map[string]bool{}
				for _, n := range capped {
					if seen[n] || ref[n] > now {
						t.Fatalf("step %d: due(%v, %d) = %v: duplicate or not due %q", step, now, limit, capped, n)
					}
					seen[n] = true
				}
			}
		})
	}
}

func TestIndexEmpty(t *testing.T) {
	x := newIndex()
	if _, ok := x.next(); ok {
		t.Errorf("next on empty index reported a time")
	}
	if got := x.due(time.Hour, 10); len(got) != 0 {
		t.Errorf("due on empty index = %v", got)
	}
	x.remove("absent") // must not panic
}

func TestRecordRoundTrip(t *testing.T) {
	tests := []Record{
		{},
		{Token: 1, Holder: "worker-1", TTL: time.Second, Deadline: 5 * time.Second},
		{Token: math.MaxUint64, Holder: "ünïcödé \x00 bytes", TTL: time.Hour, LockDelay: time.Minute,
			Deadline: math.MaxInt64, Expired: true, DelayUntil: 3 * time.Hour},
		{Token: 7, Expired: true},
		{Token: 8, Holder: string(make([]byte, 4096))},
	}
	for i, r := range tests {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			got, err := unmarshal(r.marshal())
			if err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if got != r {
				t.Fatalf("round trip = %+v; want %+v", got, r)
			}
		})
	}
}

func TestRecordUnmarshalBad(t *testing.T) {
	good := (&Record{Token: 3, Holder: "h"}).marshal()
	wrongVersion := bytes.Clone(good)
	wrongVersion[0] = recordVersion + 1
	tests := map[string][]byte{
		"nil":           nil,
		"empty":         {},
		"version only":  {recordVersion},
		"short":         good[:2+5*8-1],
		"wrong version": wrongVersion,
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := unmarshal(b); err == nil {
				t.Fatalf("unmarshal(%x) = nil error; want an error", b)
			}
		})
	}
}

// testStore opens a kv store in a temp dir.
func testStore(t *testing.T) *kv.Store {
	t.Helper()
	s, err := kv.Open(filepath.Join(t.TempDir(), "kv.db"), kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// in runs fn in a committed read-write transaction.
func in(t *testing.T, s *kv.Store, fn func(tx *kv.Tx)) {
	t.Helper()
	if err := s.Update(func(tx *kv.Tx) error { fn(tx); return nil }); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, err error, code fence.Code) *fence.Error {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Fatalf("err = %v; want nil", err)
		}
		return nil
	}
	var e *fence.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("err = %v; want code %s", err, code)
	}
	return e
}

// rawRecord returns the stored bytes of a lock, to check that refusals
// change nothing.
func rawRecord(t *testing.T, s *kv.Store, name string) []byte {
	t.Helper()
	var b []byte
	_ = s.View(func(tx *kv.Tx) error { b = bytes.Clone(tx.Lock(name)); return nil })
	return b
}

func lastToken(t *testing.T, s *kv.Store) fence.Token {
	t.Helper()
	var tok fence.Token
	_ = s.View(func(tx *kv.Tx) error { tok = tx.LastToken(); return nil })
	return tok
}

func mustAcquire(t *testing.T, s *kv.Store, m *Manager, now time.Duration, req Request) Grant {
	t.Helper()
	var g Grant
	var err error
	in(t, s, func(tx *kv.Tx) { g, err = m.Acquire(tx, now, req) })
	if err != nil {
		t.Fatalf("Acquire(%q) at %v: %v", req.Name, now, err)
	}
	return g
}

func info(t *testing.T, s *kv.Store, m *Manager, now time.Duration, name string) Info {
	t.Helper()
	var in Info
	if err := s.View(func(tx *kv.Tx) error {
		var err error
		in, err = m.Info(tx, now, name)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return in
}

func TestAcquire(t *testing.T) {
	s, m := testStore(t), NewManager()
	g := mustAcquire(t, s, m, 0, Request{Name: "L", TTL: time.Second, Holder: "a"})
	if g.Token != 1 || g.TTL != time.Second {
		t.Fatalf("grant = %+v; want token 1, ttl 1s", g)
	}
	if got, want := info(t, s, m, 100*time.Millisecond, "L"), (Info{Name: "L", Held: true, Holder: "a", Token: 1, TTL: 900 * time.Millisecond}); got != want {
		t.Fatalf("info = %+v; want %+v", got, want)
	}
	if m.Held() != 1 {
		t.Fatalf("Held = %d; want 1", m.Held())
	}
	if at, ok := m.Arm(); !ok || at != time.Second {
		t.Fatalf("Next = %v, %v; want 1s", at, ok)
	}

	// Held: refused with the facts, and nothing changes.
	before := rawRecord(t, s, "L")
	var err error
	in(t, s, func(tx *kv.Tx) { _, err = m.Acquire(tx, 400*time.Millisecond, Request{Name: "L", TTL: time.Second}) })
	e := wantCode(t, err, fence.CodeLockHeld)
	if e.Holder != "a" || e.Token != 1 || e.RetryAfter != 600*time.Millisecond {
		t.Fatalf("lock_held facts = holder %q token %d retry %v; want a, 1, 600ms", e.Holder, e.Token, e.RetryAfter)
	}
	if !bytes.Equal(rawRecord(t, s, "L"), before) || lastToken(t, s) != 1 {
		t.Fatalf("a refused acquire changed the record or the token sequence")
	}

	// Another lock draws from the same sequence.
	if g := mustAcquire(t, s, m, 0, Request{Name: "M", TTL: time.Second}); g.Token != 2 {
		t.Fatalf("token on M = %d; want 2", g.Token)
	}
	// Past the deadline the lock is free even before Expire runs.
	if g := mustAcquire(t, s, m, time.Second, Request{Name: "L", TTL: time.Second, Holder: "b"}); g.Token != 3 {
		t.Fatalf("token on L after expiry = %d; want 3", g.Token)
	}
	if m.Held() != 2 {
		t.Fatalf("Held = %d; want 2 (the replaced lease was still counted)", m.Held())
	}
}

func TestCheck(t *testing.T) {
	s, m := testStore(t), NewManager()
	g := mustAcquire(t, s, m, 0, Request{Name: "L", TTL: time.Second})
	check := func(now time.Duration, name string, tok fence.Token) error {
		var err error
		_ = s.View(func(tx *kv.Tx) error { err = m.Check(tx, now, name, tok); return nil })
		return err
	}
	tests := []struct {
		name      string
		now       time.Duration
		lock      string
		token     fence.Token
		code      fence.Code
		factToken fence.Token
	}{
		{"holder", 0, "L", g.Token, "", 0},
		{"holder just before deadline", time.Second - 1, "L", g.Token, "", 0},
		{"other token while held", 0, "L", g.Token + 1, fence.CodeNotHolder, g.Token},
		{"older token while held", 0, "L", g.Token - 1, fence.CodeNotHolder, g.Token},
		{"no token", 0, "L", 0, fence.CodeNotHolder, g.Token},
		{"holder at deadline", time.Second, "L", g.Token, fence.CodeLeaseExpired, g.Token},
		{"other token after deadline", time.Second, "L", g.Token + 1, fence.CodeNotHolder, 0},
		{"never acquired", 0, "nope", 1, fence.CodeNotHolder, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := wantCode(t, check(tt.now, tt.lock, tt.token), tt.code)
			if e != nil && e.Token != tt.factToken {
				t.Errorf("refusal token = %d; want %d", e.Token, tt.factToken)
			}
		})
	}
}

func TestRenew(t *testing.T) {
	s, m := testStore(t), NewManager()
	g := mustAcquire(t, s, m, 0, Request{Name: "L", TTL: time.Second})
	var ttl time.Duration
	var err error
	in(t, s, func(tx *kv.Tx) { ttl, err = m.Renew(tx, 700*time.Millisecond, "L", g.Token) })
	wantCode(t, err, "")
	if ttl != time.Second {
		t.Fatalf("renew ttl = %v; want 1s", ttl)
	}
	if in := info(t, s, m, 1500*time.Millisecond, "L"); !in.Held || in.TTL != 200*time.Millisecond {
		t.Fatalf("after renew at 700ms, info at 1.5s = %+v; want held with 200ms left", in)
	}
	if at, _ := m.Arm(); at != 1700*time.Millisecond {
		t.Fatalf("Next = %v; want 1.7s", at)
	}

	before := rawRecord(t, s, "L")
	for _, tt := range []struct {
		name  string
		now   time.Duration
		token fence.Token
		code  fence.Code
	}{
		{"wrong token", time.Second, g.Token + 5, fence.CodeNotHolder},
		{"after expiry", 1700 * time.Millisecond, g.Token, fence.CodeLeaseExpired},
		{"other lock", time.Second, g.Token, fence.CodeNotHolder},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name := "L"
			if tt.name == "other lock" {
				name = "M"
			}
			in(t, s, func(tx *kv.Tx) { _, err = m.Renew(tx, tt.now, name, tt.token) })
			wantCode(t, err, tt.code)
			if !bytes.Equal(rawRecord(t, s, "L"), before) {
				t.Fatalf("a refused renew changed the record")
			}
		})
	}
}

func TestRelease(t *testing.T) {
	s, m := testStore(t), NewManager()
	g := mustAcquire(t, s, m, 0, Request{Name: "L", TTL: time.Second, LockDelay: 10 * time.Second})
	before := rawRecord(t, s, "L")
	var err error
	in(t, s, func(tx *kv.Tx) { err = m.Release(tx, 0, "L", g.Token+1) })
	wantCode(t, err, fence.CodeNotHolder)
	in(t, s, func(tx *kv.Tx) { err = m.Release(tx, time.Second, "L", g.Token) })
	wantCode(t, err, fence.CodeLeaseExpired)
	if !bytes.Equal(rawRecord(t, s, "L"), before) || m.Held() != 1 {
		t.Fatalf("a refused release changed something")
	}

	in(t, s, func(tx *kv.Tx) { err = m.Release(tx, 500*time.Millisecond, "L", g.Token) })
	wantCode(t, err, "")
	if m.Held() != 0 {
		t.Fatalf("Held after release = %d; want 0", m.Held())
	}
	if _, ok := m.Arm(); ok {
		t.Fatalf("a released lock is still in the deadline index")
	}
	if in := info(t, s, m, 500*time.Millisecond, "L"); in.Held || in.Delay != 0 {
		t.Fatalf("info after release = %+v; want free with no delay", in)
	}
	// No lock-delay after a clean release.
	if g2 := mustAcquire(t, s, m, 500*time.Millisecond, Request{Name: "L", TTL: time.Second}); g2.Token != g.Token+1 {
		t.Fatalf("token after release = %d; want %d", g2.Token, g.Token+1)
	}
	// Releasing twice is refused.
	in(t, s, func(tx *kv.Tx) { err = m.Release(tx, 500*time.Millisecond, "L", g.Token) })
	wantCode(t, err, fence.CodeNotHolder)
}

func TestExpire(t *testing.T) {
	s, m := testStore(t), NewManager()
	expire := func(now time.Duration, name string) bool {
		t.Helper()
		var freed bool
		var err error
		in(t, s, func(tx *kv.Tx) { freed, _, err = m.Expire(tx, now, name) })
		if err != nil {
			t.Fatalf("Expire(%q) at %v: %v", name, now, err)
		}
		return freed
	}

	t.Run("no delay", func(t *testing.T) {
		g := mustAcquire(t, s, m, 0, Request{Name: "A", TTL: time.Second})
		if expire(999*time.Millisecond, "A") {
			t.Fatalf("Expire before the deadline freed the lock")
		}
		if !expire(time.Second, "A") {
			t.Fatalf("Expire at the deadline did not free the lock")
		}
		if m.Held() != 0 {
			t.Fatalf("Held = %d; want 0", m.Held())
		}
		if expire(2*time.Second, "A") {
			t.Fatalf("a second Expire freed the lock again")
		}
		if at, ok := m.Arm(); !ok || at != time.Second+Retention {
			t.Fatalf("Next after expiry = %v, %v; want the end of the retention, %v", at, ok, time.Second+Retention)
		}
		// The record is kept, so the late holder hears lease_expired.
		var err error
		_ = s.View(func(tx *kv.Tx) error { err = m.Check(tx, 2*time.Second, "A", g.Token); return nil })
		wantCode(t, err, fence.CodeLeaseExpired)
		if in := info(t, s, m, 2*time.Second, "A"); in.Held || in.Token != g.Token || in.TTL != 0 || in.Delay != 0 {
			t.Fatalf("info = %+v; want free, token %d", in, g.Token)
		}
		// Once free for Retention, the record is forgotten.
		if expire(time.Second+Retention-1, "A"); rawRecord(t, s, "A") == nil {
			t.Fatalf("the record was deleted before its retention ended")
		}
		if expire(time.Second+Retention, "A"); rawRecord(t, s, "A") != nil {
			t.Fatalf("the record outlived its retention")
		}
		if _, ok := m.Arm(); ok {
			t.Fatalf("a forgotten lock is still in the deadline index")
		}
		_ = s.View(func(tx *kv.Tx) error { err = m.Check(tx, time.Second+Retention, "A", g.Token); return nil })
		wantCode(t, err, fence.CodeNotHolder)
	})

	t.Run("lock delay", func(t *testing.T) {
		mustAcquire(t, s, m, 0, Request{Name: "D", TTL: time.Second, LockDelay: 3 * time.Second})
		if expire(time.Second, "D") {
			t.Fatalf("Expire at the deadline freed a lock with a lock-delay")
		}
		if at, ok := m.Arm(); !ok || at != 4*time.Second {
			t.Fatalf("Next = %v, %v; want 4s (end of the delay)", at, ok)
		}
		if in := info(t, s, m, 2*time.Second, "D"); in.Held || in.Delay != 2*time.Second {
			t.Fatalf("info in delay = %+v; want free with 2s of delay", in)
		}
		var err error
		in(t, s, func(tx *kv.Tx) { _, err = m.Acquire(tx, 3999*time.Millisecond, Request{Name: "D", TTL: time.Second}) })
		if e := wantCode(t, err, fence.CodeLockHeld); e.RetryAfter != time.Millisecond {
			t.Fatalf("retry in delay = %v; want 1ms", e.RetryAfter)
		}
		if expire(3999*time.Millisecond, "D") {
			t.Fatalf("Expire before the end of the delay freed the lock")
		}
		if !expire(4*time.Second, "D") {
			t.Fatalf("Expire at the end of the delay did not free the lock")
		}
		mustAcquire(t, s, m, 4*time.Second, Request{Name: "D", TTL: time.Second})
	})

	t.Run("delay already over", func(t *testing.T) {
		mustAcquire(t, s, m, 0, Request{Name: "E", TTL: time.Second, LockDelay: time.Second})
		if !expire(5*time.Second, "E") {
			t.Fatalf("a late Expire after the delay did not free the lock")
		}
	})

	t.Run("renewed since indexed", func(t *testing.T) {
		g := mustAcquire(t, s, m, 0, Request{Name: "R", TTL: time.Second})
		in(t, s, func(tx *kv.Tx) { m.Renew(tx, 900*time.Millisecond, "R", g.Token) })
		if expire(time.Second, "R") {
			t.Fatalf("Expire freed a renewed lease")
		}
		if in := info(t, s, m, time.Second, "R"); !in.Held {
			t.Fatalf("renewed lease not held: %+v", in)
		}
	})

	t.Run("missing lock", func(t *testing.T) {
		if expire(time.Second, "never") {
			t.Fatalf("Expire of a missing lock reported freed")
		}
	})
}

// TestRearm is G7 at the lease layer: after a restart every live lease gets
// its full TTL from now, and every lock in lock-delay its full delay.
func TestRearm(t *testing.T) {
	s, m := testStore(t), NewManager()
	mustAcquire(t, s, m, 0, Request{Name: "live", TTL: 2 * time.Second})
	mustAcquire(t, s, m, 0, Request{Name: "overdue", TTL: time.Second}) // past its deadline, never expired
	mustAcquire(t, s, m, 0, Request{Name: "delayed", TTL: time.Second, LockDelay: 10 * time.Second})
	mustAcquire(t, s, m, 0, Request{Name: "expired", TTL: time.Second})
	in(t, s, func(tx *kv.Tx) {
		m.Expire(tx, 5*time.Second, "delayed")
		m.Expire(tx, 5*time.Second, "expired")
	})

	// A new manager on the same store, with a new epoch: now is 100ms.
	m2 := NewManager()
	now := 100 * time.Millisecond
	in(t, s, func(tx *kv.Tx) {
		if err := m2.Rearm(tx, now); err != nil {
			t.Fatal(err)
		}
	})
	tests := []struct {
		name  string
		held  bool
		ttl   time.Duration
		delay time.Duration
	}{
		{"live", true, 2 * time.Second, 0},
		{"overdue", true, time.Second, 0},
		{"delayed", false, 0, 10 * time.Second},
		{"expired", false, 0, 0},
	}
	for _, tt := range tests {
		in := info(t, s, m2, now, tt.name)
		if in.Held != tt.held || in.TTL != tt.ttl || in.Delay != tt.delay {
			t.Errorf("%s after rearm: %+v; want held %v, ttl %v, delay %v", tt.name, in, tt.held, tt.ttl, tt.delay)
		}
	}
	if m2.Held() != 2 {
		t.Errorf("Held after rearm = %d; want 2", m2.Held())
	}
	if at, ok := m2.Arm(); !ok || at != now+time.Second {
		t.Errorf("Next after rearm = %v, %v; want %v", at, ok, now+time.Second)
	}
	if got := m2.Due(now+10*time.Second, 10); len(got) != 3 {
		t.Errorf("due after rearm = %v; want live, overdue and delayed", got)
	}
}

func TestRearmBadRecord(t *testing.T) {
	s, m := testStore(t), NewManager()
	in(t, s, func(tx *kv.Tx) { tx.PutLock("bad", []byte{0xff}) })
	err := s.Update(func(tx *kv.Tx) error { return m.Rearm(tx, 0) })
	if err == nil {
		t.Fatalf("Rearm with a corrupt record = nil; want an error")
	}
	// Reading the record reports it too, without a panic.
	err = s.View(func(tx *kv.Tx) error { _, err := m.Info(tx, 0, "bad"); return err })
	if err == nil {
		t.Fatalf("Info of a corrupt record = nil; want an error")
	}
	in(t, s, func(tx *kv.Tx) { tx.PutLock("empty", []byte{}) })
	err = s.View(func(tx *kv.Tx) error { _, err := m.Info(tx, 0, "empty"); return err })
	if err == nil {
		t.Fatalf("Info of an empty record = nil; want an error")
	}
}

func TestList(t *testing.T) {
	s, m := testStore(t), NewManager()
	for _, n := range []string{"a", "j/1", "j/2", "j/3", "k"} {
		mustAcquire(t, s, m, 0, Request{Name: n, TTL: time.Second})
	}
	mustAcquire(t, s, m, 0, Request{Name: "j/0", TTL: 100 * time.Millisecond}) // run out at 500ms
	list := func(prefix, start string, limit, maxBytes int) (string, bool) {
		var out []Info
		var more bool
		err := s.View(func(tx *kv.Tx) error {
			var err error
			out, more, err = m.List(tx, 500*time.Millisecond, prefix, start, limit, maxBytes)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, in := range out {
			want := 500 * time.Millisecond
			if in.Name == "j/0" {
				want = 0
			}
			if !in.Held || in.TTL != want {
				t.Errorf("listed %+v; want held with %v left", in, want)
			}
			names = append(names, in.Name)
		}
		return fmt.Sprint(names), more
	}
	// Until its expiry is applied, a lease that ran out is listed, held
	// with no time left: a restart would re-arm it.
	if got, _ := list("j/", "", 100, 1<<20); got != "[j/0 j/1 j/2 j/3]" {
		t.Errorf("before the expiry: List = %s; want [j/0 j/1 j/2 j/3]", got)
	}
	in(t, s, func(tx *kv.Tx) {
		if _, _, err := m.Expire(tx, 500*time.Millisecond, "j/0"); err != nil {
			t.Fatal(err)
		}
	})
	tests := []struct {
		prefix, start string
		limit, bytes  int
		want          string
		more          bool
	}{
		{"", "", 100, 1 << 20, "[a j/1 j/2 j/3 k]", false},
		{"j/", "", 100, 1 << 20, "[j/1 j/2 j/3]", false},
		{"j/", "", 2, 1 << 20, "[j/1 j/2]", true},
		{"j/", "j/2", 100, 1 << 20, "[j/2 j/3]", false},
		{"j/", "", 3, 1 << 20, "[j/1 j/2 j/3]", false},
		// Pages by bytes too: names of 3 bytes, no holders.
		{"j/", "", 100, 6, "[j/1 j/2]", true},
		{"j/", "", 100, 1, "[j/1]", true}, // at least one
	}
	for _, tt := range tests {
		got, more := list(tt.prefix, tt.start, tt.limit, tt.bytes)
		if got != tt.want || more != tt.more {
			t.Errorf("List(%q, %q, %d, %d) = %s, more %v; want %s, more %v", tt.prefix, tt.start, tt.limit, tt.bytes, got, more, tt.want, tt.more)
		}
	}
}

func TestWaiters(t *testing.T) {
	m := NewQueues()
	var ws []*Waiter
	for i := 0; i < 4; i++ {
		w := NewWaiter(Request{Name: "L", Holder: fmt.Sprint(i)})
		if err := m.Enqueue(w, 0); err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	other := NewWaiter(Request{Name: "M"})
	m.Enqueue(other, 0)
	if m.Waiting("L") != 4 || m.Total() != 5 {
		t.Fatalf("waiting = %d, total %d; want 4, 5", m.Waiting("L"), m.Total())
	}
	if got := m.QueuedLocks(); len(got) != 2 {
		t.Fatalf("queued locks = %v; want L and M", got)
	}
	if !m.Cancel(ws[1]) {
		t.Fatalf("Cancel of a queued waiter = false")
	}
	if m.Cancel(ws[1]) {
		t.Fatalf("second Cancel = true")
	}
	if m.Waiting("L") != 3 || m.Total() != 4 {
		t.Fatalf("after cancel: waiting = %d, total %d; want 3, 4", m.Waiting("L"), m.Total())
	}
	// FIFO, skipping the cancelled one.
	for _, want := range []*Waiter{ws[0], ws[2]} {
		if got := m.Pop("L"); got != want {
			t.Fatalf("Pop = %v; want waiter %s", got.Req.Holder, want.Req.Holder)
		}
	}
	if m.Cancel(ws[0]) {
		t.Fatalf("Cancel of a popped waiter = true; it must wait for its outcome")
	}
	if got := m.Pop("L"); got != ws[3] {
		t.Fatalf("Pop = %v; want waiter 3", got)
	}
	if got := m.Pop("L"); got != nil {
		t.Fatalf("Pop of an empty queue = %v; want nil", got)
	}
	if m.Waiting("L") != 0 || m.Total() != 1 {
		t.Fatalf("at end: waiting = %d, total %d; want 0, 1", m.Waiting("L"), m.Total())
	}
	if got := m.QueuedLocks(); len(got) != 1 || got[0] != "M" {
		t.Fatalf("queued locks = %v; want [M]", got)
	}
	ws[0].Finish(Grant{Token: 9}, nil)
	select {
	case <-ws[0].Done():
	default:
		t.Fatalf("Done not closed after Finish")
	}
}

func TestWaitersLimit(t *testing.T) {
	m := NewQueues()
	m.Enqueue(NewWaiter(Request{Name: "a"}), 2)
	m.Enqueue(NewWaiter(Request{Name: "b"}), 2)
	err := m.Enqueue(NewWaiter(Request{Name: "c"}), 2)
	wantCode(t, err, fence.CodeLimitExceeded)
	if m.Total() != 2 || m.Waiting("c") != 0 {
		t.Fatalf("a refused Enqueue queued the waiter")
	}
}

func TestWake(t *testing.T) {
	s, m := testStore(t), NewManager()
	woke := func() bool {
		select {
		case <-m.Wake():
			return true
		default:
			return false
		}
	}
	// The expiry loop has armed nothing yet: any due time wakes it.
	tokens := map[string]fence.Token{}
	take := func(name string, ttl time.Duration) {
		t.Helper()
		tokens[name] = mustAcquire(t, s, m, 0, Request{Name: name, TTL: ttl}).Token
	}
	release := func(name string) {
		t.Helper()
		var err error
		in(t, s, func(tx *kv.Tx) { err = m.Release(tx, 0, name, tokens[name]) })
		if err != nil {
			t.Fatalf("Release(%q): %v", name, err)
		}
	}
	take("a", 5*time.Second)
	if !woke() {
		t.Fatalf("no wake after the first deadline")
	}
	if at, ok := m.Arm(); !ok || at != 5*time.Second {
		t.Fatalf("Arm = %v, %v; want 5s", at, ok)
	}
	take("b", 10*time.Second)
	if woke() {
		t.Fatalf("wake for a deadline after the armed time")
	}
	take("c", time.Second)
	if !woke() {
		t.Fatalf("no wake for a deadline before the armed time")
	}
	if at, _ := m.Arm(); at != time.Second {
		t.Fatalf("Arm = %v; want 1s", at)
	}
	// A lock released and taken again, later each time, does not wake
	// the loop: its timer for the armed time still comes.
	for i := range 5 {
		release("c")
		take("c", time.Duration(2+i)*time.Second)
		if woke() {
			t.Fatalf("round %d: wake for a deadline after the armed time", i)
		}
	}
	// Once the loop finds nothing left (it armed nothing), the next
	// deadline wakes it, however late.
	for _, n := range []string{"a", "b", "c"} {
		release(n)
	}
	if _, ok := m.Arm(); ok {
		t.Fatalf("Arm found a deadline after every lock was released")
	}
	take("d", time.Hour)
	if !woke() {
		t.Fatalf("no wake for a deadline while nothing was armed")
	}
}

// TestExpireChanged: Expire says whether it changed the store, so that the
// engine logs only the expiries that did something.
func TestExpireChanged(t *testing.T) {
	s, m := testStore(t), NewManager()
	expire := func(now time.Duration, name string) (freed, changed bool) {
		t.Helper()
		var err error
		in(t, s, func(tx *kv.Tx) { freed, changed, err = m.Expire(tx, now, name) })
		if err != nil {
			t.Fatalf("Expire(%q) at %v: %v", name, now, err)
		}
		return freed, changed
	}
	mustAcquire(t, s, m, 0, Request{Name: "A", TTL: time.Second, LockDelay: time.Second})
	for _, step := range []struct {
		now            time.Duration
		freed, changed bool
		what           string
	}{
		{500 * time.Millisecond, false, false, "before the deadline"},
		{time.Second, false, true, "at the deadline: expired, into lock-delay"},
		{1500 * time.Millisecond, false, false, "during the lock-delay"},
		{2 * time.Second, true, true, "the lock-delay ends"},
		{2*time.Second + Retention/2, false, false, "free, within the retention"},
		{2*time.Second + Retention, false, true, "the record is forgotten"},
		{3*time.Second + Retention, false, false, "no record"},
	} {
		freed, changed := expire(step.now, "A")
		if freed != step.freed || changed != step.changed {
			t.Fatalf("%s: freed %v, changed %v; want %v, %v", step.what, freed, changed, step.freed, step.changed)
		}
	}
	if _, changed := expire(0, "never"); changed {
		t.Fatalf("Expire of a lock never taken changed something")
	}
}

// TestInfoUntilApplied: Info reports a lease, and a lock-delay, as lasting
// until their ends are applied, never over when a restart (Rearm) would
// bring them back. Each step checks Info, then what a restart at that
// point would make of the lock: held again only if Info said held, in
// lock-delay again only if Info said so.
func TestInfoUntilApplied(t *testing.T) {
	const (
		ttl   = time.Second
		delay = 2 * time.Second
	)
	steps := []struct {
		now       time.Duration
		expire    bool // apply what is due at now first
		held      bool
		ttl       time.Duration
		lockDelay time.Duration
	}{
		{now: 500 * time.Millisecond, held: true, ttl: 500 * time.Millisecond},
		{now: 1500 * time.Millisecond, held: true, ttl: 0},                               // ran out, expiry not applied
		{now: 1500 * time.Millisecond, expire: true, lockDelay: 1500 * time.Millisecond}, // expired at 1.5s: delay until 3s
		{now: 3500 * time.Millisecond, lockDelay: minDelayLeft},                          // delay over, its end not applied
		{now: 3500 * time.Millisecond, expire: true},                                     // free
	}
	for _, restart := range []bool{false, true} {
		for i, st := range steps {
			s, m := testStore(t), NewManager()
			mustAcquire(t, s, m, 0, Request{Name: "L", TTL: ttl, LockDelay: delay})
			for _, prev := range steps[:i+1] {
				if prev.expire {
					in(t, s, func(tx *kv.Tx) {
						if _, _, err := m.Expire(tx, prev.now, "L"); err != nil {
							t.Fatal(err)
						}
					})
				}
			}
			got := info(t, s, m, st.now, "L")
			if got.Held != st.held || got.TTL != st.ttl || got.Delay != st.lockDelay {
				t.Fatalf("step %d at %v: Info = %+v; want held %v, ttl %v, delay %v", i, st.now, got, st.held, st.ttl, st.lockDelay)
			}
			if !restart {
				continue
			}
			// A restart at this point, its clock starting again at 0.
			m = NewManager()
			in(t, s, func(tx *kv.Tx) {
				if err := m.Rearm(tx, 0); err != nil {
					t.Fatal(err)
				}
			})
			after := info(t, s, m, 0, "L")
			if after.Held != got.Held || (after.Delay > 0) != (got.Delay > 0) {
				t.Fatalf("step %d: Info said %+v, and after a restart %+v", i, got, after)
			}
		}
	}
}
