package lease

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/kv"
)

// TestSemaphore: a limit of 3 grants 3 permits with rising tokens and
// refuses a 4th; each permit renews, releases and passes held-write checks
// by its own token; a different limit, a plain acquire, limit 0 or over
// MaxPermits, and a lock-delay are refused and change nothing; an expired
// permit is lease_expired and frees its slot; the limit survives Rearm and Load.
func TestSemaphore(t *testing.T) {
	s, m := testStore(t), NewManager()
	req := Request{Name: "S", TTL: time.Second, Limit: 3}
	var toks []fence.Token
	for i := 0; i < 3; i++ {
		g := mustAcquire(t, s, m, 0, req)
		if len(toks) > 0 && g.Token <= toks[len(toks)-1] {
			t.Fatalf("token %d not above %d", g.Token, toks[len(toks)-1])
		}
		if g.Free != 2-i {
			t.Fatalf("grant %d: Free = %d; want %d", i, g.Free, 2-i)
		}
		toks = append(toks, g.Token)
	}
	before := rawRecord(t, s, "S")
	refuse := func(r Request, code fence.Code) {
		t.Helper()
		var err error
		in(t, s, func(tx *kv.Tx) { _, err = m.Acquire(tx, 10*time.Millisecond, r) })
		wantCode(t, err, code)
		if !bytes.Equal(rawRecord(t, s, "S"), before) {
			t.Fatalf("refused %+v changed the record", r)
		}
	}
	refuse(req, fence.CodeLockHeld)
	refuse(Request{Name: "S", TTL: time.Second, Limit: 4}, fence.CodeLimitMismatch)
	refuse(Request{Name: "S", TTL: time.Second}, fence.CodeLimitMismatch)
	refuse(Request{Name: "S", TTL: time.Second, Limit: MaxPermits + 1}, fence.CodeBadRequest)
	refuse(Request{Name: "S", TTL: time.Second, Limit: 3, LockDelay: time.Second}, fence.CodeBadRequest)
	if in := info(t, s, m, 0, "S"); in.Limit() != 3 || len(in.Holders()) != 3 || !in.Full() || in.Token != toks[2] {
		t.Fatalf("info = %+v", in)
	}
	var err error
	in(t, s, func(tx *kv.Tx) { err = m.Check(tx, 500*time.Millisecond, "S", toks[1]) })
	wantCode(t, err, "")
	in(t, s, func(tx *kv.Tx) { _, err = m.Renew(tx, 500*time.Millisecond, "S", toks[0]) })
	wantCode(t, err, "")
	in(t, s, func(tx *kv.Tx) { err = m.Release(tx, 500*time.Millisecond, "S", toks[1]) })
	wantCode(t, err, "")
	in(t, s, func(tx *kv.Tx) { err = m.Check(tx, 500*time.Millisecond, "S", toks[1]) })
	wantCode(t, err, fence.CodeNotHolder)
	if m.Held() != 2 {
		t.Fatalf("Held = %d; want 2", m.Held())
	}
	// toks[2] runs out at 1s; toks[0] was renewed to 1.5s.
	in(t, s, func(tx *kv.Tx) {
		var freed bool
		freed, _, err = m.Expire(tx, 1200*time.Millisecond, "S")
		if !freed {
			t.Error("expiry freed nothing")
		}
	})
	wantCode(t, err, "")
	in(t, s, func(tx *kv.Tx) { err = m.Check(tx, 1200*time.Millisecond, "S", toks[2]) })
	wantCode(t, err, fence.CodeLeaseExpired)
	if in := info(t, s, m, 1200*time.Millisecond, "S"); len(in.Holders()) != 1 || in.Holders()[0].Token != toks[0] {
		t.Fatalf("after expiry info = %+v", in.Sem)
	}
	in(t, s, func(tx *kv.Tx) { err = m.Rearm(tx, 5*time.Second) })
	wantCode(t, err, "")
	m2 := NewManager()
	if err := s.View(func(tx *kv.Tx) error { return m2.Load(tx) }); err != nil {
		t.Fatal(err)
	}
	if m2.Held() != 1 || info(t, s, m2, 5*time.Second, "S").Limit() != 3 {
		t.Fatalf("after Load: held %d, info %+v", m2.Held(), info(t, s, m2, 5*time.Second, "S"))
	}
	// Once no permit is live the name can become a plain lock again.
	in(t, s, func(tx *kv.Tx) { err = m.Release(tx, 5*time.Second, "S", toks[0]) })
	wantCode(t, err, "")
	if g := mustAcquire(t, s, m, 5*time.Second, Request{Name: "S", TTL: time.Second}); g.Token <= toks[2] {
		t.Fatalf("plain token %d not above %d", g.Token, toks[2])
	}
	if in := info(t, s, m, 5*time.Second, "S"); in.Sem != nil || !in.Held {
		t.Fatalf("plain info = %+v", in)
	}
}

// TestSemRecordDecode: a damaged semaphore record is an error, never a panic.
func TestSemRecordDecode(t *testing.T) {
	r := semRecord{Limit: 2, Last: 5, Permits: []Permit{{Token: 4, Holder: "h", TTL: 1, Deadline: 2}, {Token: 5, Expired: true, ForgetAt: 9}}}
	b := r.marshal()
	got, err := unmarshalSem(b)
	if err != nil || len(got.Permits) != 2 || got.Permits[1] != r.Permits[1] || got.Permits[0] != r.Permits[0] {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for i := 0; i < len(b); i++ {
		if _, err := unmarshalSem(b[:i]); err == nil {
			t.Fatalf("truncated to %d bytes decoded", i)
		}
	}
}

// TestSemRecordVersions: a plain lock's record is what it was before
// semaphores (record.go, unchanged: the older binary's decoder), whether
// the acquire gave no limit or a limit of 1; a semaphore's record is
// refused by that decoder with a version error, never misread.
func TestSemRecordVersions(t *testing.T) {
	s, m := testStore(t), NewManager()
	raw := func(name string) []byte {
		var b []byte
		in(t, s, func(tx *kv.Tx) { b = bytes.Clone(tx.Lock(name)) })
		return b
	}
	mustAcquire(t, s, m, 0, Request{Name: "a", TTL: time.Second, Holder: "h"})
	mustAcquire(t, s, m, 0, Request{Name: "b", TTL: time.Second, Holder: "h", Limit: 1})
	a, b := raw("a"), raw("b")
	if !bytes.Equal(a[1:], b[1:]) && len(a) != len(b) || a[0] != recordVersion || b[0] != recordVersion {
		t.Fatalf("plain records: %x, %x; want version %d, alike", a, b, recordVersion)
	}
	for _, r := range [][]byte{a, b} {
		if _, err := unmarshal(r); err != nil {
			t.Fatalf("a plain lock's record %x: %v", r, err)
		}
	}
	mustAcquire(t, s, m, 0, Request{Name: "S", TTL: time.Second, Holder: "h", Limit: 3})
	if _, err := unmarshal(raw("S")); err == nil || !strings.Contains(err.Error(), "version 3, want 2") {
		t.Fatalf("a semaphore's record by the plain decoder: err = %v; want a version error", err)
	}
}
