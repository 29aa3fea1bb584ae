package fencekv_test

// A model-based property test: rapid drives random sequences of writes
// (with random tokens, strict and held-lock options), lock commands and
// clock advances through a real engine on a fake clock, and through a plain
// in-memory model of G1–G4 and G7 written from the guarantees alone (the
// package doc, fencekv.go). Every result (error code and facts, fence,
// revision, value, token, TTL) must match the model, and so must the full
// state after every step.

import (
	"context"
	"errors"
	"math"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/state"
	"pgregory.net/rapid"
)

var (
	propKeys   = []string{"a", "b", "c"}
	propLocks  = []string{"L1", "L2"}
	propValues = []string{"", "0", "1", "-7", "x", "9223372036854775807", "-9223372036854775808"}
	propDeltas = []int64{0, 1, -1, 5, math.MaxInt64, math.MinInt64}
	propTTLs   = []time.Duration{100 * time.Millisecond, time.Second, 3 * time.Second}
	propDelays = []time.Duration{0, 0, 2 * time.Second}
	propSteps  = []time.Duration{time.Millisecond, 99 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second}
)

// modelKey is a key's state. A key with a record but not live was deleted
// (or deleted while missing, with a token) and keeps its fence.
type modelKey struct {
	live  bool
	value string
	fence fencekv.Token
	rev   fencekv.Revision
}

// modelLock is a lock's latest grant; a released lock has none.
type modelLock struct {
	token    fencekv.Token
	holder   string
	ttl      time.Duration
	delay    time.Duration
	deadline time.Duration
}

type model struct {
	now   time.Duration
	rev   fencekv.Revision
	last  fencekv.Token
	keys  map[string]*modelKey
	locks map[string]*modelLock
}

func refusal(code fencekv.Code) *fencekv.Error { return &fencekv.Error{Code: code} }

func (m *model) key(k string) *modelKey {
	if m.keys[k] == nil {
		m.keys[k] = &modelKey{}
	}
	return m.keys[k]
}

// held reports whether lock is held by a live lease.
func (m *model) held(name string) (*modelLock, bool) {
	l := m.locks[name]
	return l, l != nil && m.now < l.deadline
}

// checkHolder is the holder check of held writes, renew and release.
func (m *model) checkHolder(name string, tok fencekv.Token) *fencekv.Error {
	l, held := m.held(name)
	switch {
	case l != nil && l.token == tok && held:
		return nil
	case l != nil && l.token == tok:
		return &fencekv.Error{Code: fencekv.CodeLeaseExpired, Token: tok}
	case held:
		return &fencekv.Error{Code: fencekv.CodeNotHolder, Token: l.token}
	}
	return &fencekv.Error{Code: fencekv.CodeNotHolder}
}

type modelWrite struct {
	op     fencekv.Op
	key    string
	value  string
	rev    fencekv.Revision
	delta  int64
	token  fencekv.Token
	strict bool
	lock   string
}

type writeOutcome struct {
	err     *fencekv.Error
	res     fencekv.WriteResult
	deleted bool
	n       int64
}

// write applies w to the model: the refusal order of wire/PROTOCOL.md §4.1, then the
// fence rule, then the operation.
func (m *model) write(w modelWrite) writeOutcome {
	if w.strict && w.token == 0 || w.lock != "" && w.token == 0 {
		return writeOutcome{err: refusal(fencekv.CodeBadRequest)}
	}
	if w.lock != "" {
		if err := m.checkHolder(w.lock, w.token); err != nil {
			return writeOutcome{err: err}
		}
	}
	k := m.keys[w.key]
	var cur modelKey
	if k != nil {
		cur = *k
	}
	if w.token < cur.fence || w.strict && w.token == cur.fence {
		return writeOutcome{err: &fencekv.Error{Code: fencekv.CodeStaleToken, Fence: cur.fence}}
	}
	curRev := fencekv.Revision(0)
	if cur.live {
		curRev = cur.rev
	}
	fence := max(cur.fence, w.token)
	var out writeOutcome
	value := w.value
	switch w.op {
	case fencekv.OpDelete:
		if !cur.live && w.token == 0 {
			m.rev++ // changes no key, but advances the store's revision
			return writeOutcome{res: fencekv.WriteResult{Fence: fence, Revision: m.rev}}
		}
		m.rev++
		*m.key(w.key) = modelKey{fence: fence, rev: m.rev}
		return writeOutcome{deleted: cur.live, res: fencekv.WriteResult{Fence: fence, Revision: m.rev}}
	case state.OpCAS:
		if curRev != w.rev {
			return writeOutcome{err: &fencekv.Error{Code: fencekv.CodeCompareFailed, Revision: curRev}}
		}
	case fencekv.OpIncr:
		var n int64
		if cur.live {
			var err error
			if n, err = strconv.ParseInt(cur.value, 10, 64); err != nil {
				return writeOutcome{err: refusal(fencekv.CodeNotInteger)}
			}
		}
		sum := n + w.delta
		if (w.delta > 0 && sum < n) || (w.delta < 0 && sum > n) {
			return writeOutcome{err: refusal(fencekv.CodeNotInteger)}
		}
		out.n = sum
		value = strconv.FormatInt(sum, 10)
	}
	m.rev++
	*m.key(w.key) = modelKey{live: true, value: value, fence: fence, rev: m.rev}
	out.res = fencekv.WriteResult{Fence: fence, Revision: m.rev}
	return out
}

// txn applies a transaction to the model: bad input, the lock, every
// key's fence as before the txn, the compares, the integers; then every op
// at one revision.
func (m *model) txn(compares []fencekv.Compare, ops []modelWrite, w modelWrite) ([]fencekv.TxnResult, *fencekv.Error) {
	if w.strict && w.token == 0 || w.lock != "" && w.token == 0 {
		return nil, refusal(fencekv.CodeBadRequest)
	}
	if w.lock != "" {
		if err := m.checkHolder(w.lock, w.token); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	for _, op := range ops {
		if seen[op.key] {
			continue
		}
		seen[op.key] = true
		var fence fencekv.Token
		if k := m.keys[op.key]; k != nil {
			fence = k.fence
		}
		if w.token < fence || w.strict && w.token == fence {
			return nil, &fencekv.Error{Code: fencekv.CodeStaleToken, Fence: fence, Key: op.key}
		}
	}
	for _, c := range compares {
		var rev fencekv.Revision
		if k := m.keys[string(c.Key)]; k != nil && k.live {
			rev = k.rev
		}
		if rev != c.Revision {
			return nil, &fencekv.Error{Code: fencekv.CodeCompareFailed, Revision: rev, Key: string(c.Key)}
		}
	}
	// The integers, with the txn's earlier writes in view.
	vals := map[string]*modelKey{}
	for _, op := range ops {
		v, ok := vals[op.key]
		if !ok {
			v = &modelKey{}
			if k := m.keys[op.key]; k != nil {
				*v = *k
			}
			vals[op.key] = v
		}
		switch op.op {
		case fencekv.OpPut:
			v.live, v.value = true, op.value
		case fencekv.OpDelete:
			v.live, v.value = false, ""
		case fencekv.OpIncr:
			var n int64
			if v.live {
				var err error
				if n, err = strconv.ParseInt(v.value, 10, 64); err != nil {
					return nil, &fencekv.Error{Code: fencekv.CodeNotInteger, Key: op.key}
				}
			}
			sum := n + op.delta
			if (op.delta > 0 && sum < n) || (op.delta < 0 && sum > n) {
				return nil, &fencekv.Error{Code: fencekv.CodeNotInteger, Key: op.key}
			}
			v.live, v.value = true, strconv.FormatInt(sum, 10)
		}
	}
	m.rev++
	out := make([]fencekv.TxnResult, len(ops))
	for i, op := range ops {
		var cur modelKey
		if k := m.keys[op.key]; k != nil {
			cur = *k
		}
		fence := max(cur.fence, w.token)
		r := fencekv.TxnResult{Key: []byte(op.key), Fence: fence, Revision: m.rev}
		switch op.op {
		case fencekv.OpDelete:
			r.Deleted = cur.live
			if cur.live || w.token != 0 {
				*m.key(op.key) = modelKey{fence: fence, rev: m.rev}
			}
		case fencekv.OpPut:
			*m.key(op.key) = modelKey{live: true, value: op.value, fence: fence, rev: m.rev}
		case fencekv.OpIncr:
			var n int64
			if cur.live {
				n, _ = strconv.ParseInt(cur.value, 10, 64)
			}
			r.Int = n + op.delta
			*m.key(op.key) = modelKey{live: true, value: strconv.FormatInt(r.Int, 10), fence: fence, rev: m.rev}
		}
		out[i] = r
	}
	return out, nil
}

func (m *model) acquire(name string, ttl, delay time.Duration, holder string) (fencekv.Lease, *fencekv.Error) {
	if l, held := m.held(name); held {
		return fencekv.Lease{}, &fencekv.Error{Code: fencekv.CodeLockHeld, Holder: l.holder, Token: l.token, RetryAfter: l.deadline - m.now}
	} else if l != nil && l.delay > 0 && l.deadline+l.delay > m.now {
		return fencekv.Lease{}, &fencekv.Error{Code: fencekv.CodeLockHeld, RetryAfter: l.deadline + l.delay - m.now}
	}
	m.last++
	m.locks[name] = &modelLock{token: m.last, holder: holder, ttl: ttl, delay: delay, deadline: m.now + ttl}
	return fencekv.Lease{Name: name, Token: m.last, TTL: ttl}, nil
}

func (m *model) renew(name string, tok fencekv.Token) (time.Duration, *fencekv.Error) {
	if err := m.checkHolder(name, tok); err != nil {
		return 0, err
	}
	l := m.locks[name]
	l.deadline = m.now + l.ttl
	return l.ttl, nil
}

func (m *model) release(name string, tok fencekv.Token) *fencekv.Error {
	if err := m.checkHolder(name, tok); err != nil {
		return err
	}
	delete(m.locks, name)
	return nil
}

func (m *model) info(name string) fencekv.LockInfo {
	in := fencekv.LockInfo{Name: name}
	l, held := m.held(name)
	if l == nil {
		return in
	}
	in.Token = l.token
	switch {
	case held:
		in.Held, in.Holder, in.TTL = true, l.holder, l.deadline-m.now
	case l.delay > 0 && l.deadline+l.delay > m.now:
		in.Delay = l.deadline + l.delay - m.now
	}
	return in
}

// sameRefusal fails unless got is the refusal want (code and facts), or
// both are nil.
func sameRefusal(t *rapid.T, what string, got error, want *fencekv.Error) {
	t.Helper()
	if want == nil {
		if got != nil {
			t.Fatalf("%s: err = %v; model says ok", what, got)
		}
		return
	}
	var e *fencekv.Error
	if !errors.As(got, &e) {
		t.Fatalf("%s: err = %v; model says %s %+v", what, got, want.Code, *want)
	}
	g := *e
	g.Message = ""
	if g != *want {
		t.Fatalf("%s: refusal = %+v; model says %+v", what, g, *want)
	}
}

// genToken picks a token for a write, renew or release on lock: none, the
// lock's current one, another issued one, the next one to be issued, or
// one far above the sequence.
func genToken(t *rapid.T, m *model, lock string) fencekv.Token {
	switch rapid.IntRange(0, 5).Draw(t, "token kind") {
	case 0:
		return 0
	case 1, 2:
		if l := m.locks[lock]; l != nil {
			return l.token
		}
		return m.last
	case 3:
		if m.last == 0 {
			return 0
		}
		return fencekv.Token(rapid.Uint64Range(1, uint64(m.last)).Draw(t, "issued token"))
	case 4:
		return m.last + 1
	}
	return m.last + 100
}

func TestPropertyModel(t *testing.T) {
	parent := t.TempDir()
	rapid.Check(t, func(t *rapid.T) {
		dir, err := os.MkdirTemp(parent, "prop")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		clock := fencekvtest.NewClock()
		o := fencekv.DefaultOptions()
		o.Clock = clock
		o.NoSync = true
		db, err := fencekv.Open(dir, &o)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ctx := context.Background()
		m := &model{keys: map[string]*modelKey{}, locks: map[string]*modelLock{}}

		genWrite := func(t *rapid.T, op fencekv.Op) modelWrite {
			w := modelWrite{op: op, key: rapid.SampledFrom(propKeys).Draw(t, "key")}
			if rapid.IntRange(0, 2).Draw(t, "held") == 0 {
				w.lock = rapid.SampledFrom(propLocks).Draw(t, "lock")
			}
			w.token = genToken(t, m, w.lock)
			w.strict = rapid.IntRange(0, 3).Draw(t, "strict") == 0
			return w
		}
		wopts := func(w modelWrite) fencekv.WriteOptions {
			return fencekv.WriteOptions{Token: w.token, Strict: w.strict, Lock: w.lock}
		}
		checkWrite := func(t *rapid.T, w modelWrite, res fencekv.WriteResult, err error) writeOutcome {
			want := m.write(w)
			sameRefusal(t, w.op.String(), err, want.err)
			if want.err == nil && res != want.res {
				t.Fatalf("%s %q: result = %+v; model says %+v", w.op, w.key, res, want.res)
			}
			return want
		}

		actions := map[string]func(*rapid.T){
			"put": func(t *rapid.T) {
				w := genWrite(t, fencekv.OpPut)
				w.value = rapid.SampledFrom(propValues).Draw(t, "value")
				res, err := db.Put(ctx, []byte(w.key), []byte(w.value), wopts(w))
				checkWrite(t, w, res, err)
			},
			"delete": func(t *rapid.T) {
				w := genWrite(t, fencekv.OpDelete)
				deleted, res, err := db.Delete(ctx, []byte(w.key), wopts(w))
				if want := checkWrite(t, w, res, err); want.err == nil && deleted != want.deleted {
					t.Fatalf("delete %q: deleted = %v; model says %v", w.key, deleted, want.deleted)
				}
			},
			"cas": func(t *rapid.T) {
				w := genWrite(t, state.OpCAS)
				w.value = rapid.SampledFrom(propValues).Draw(t, "value")
				w.rev = 0
				if k := m.keys[w.key]; k != nil && k.live && rapid.Bool().Draw(t, "current revision") {
					w.rev = k.rev
				} else if rapid.Bool().Draw(t, "other revision") {
					w.rev = fencekv.Revision(rapid.Uint64Range(1, uint64(m.rev)+1).Draw(t, "revision"))
				}
				res, err := db.CAS(ctx, []byte(w.key), w.rev, []byte(w.value), wopts(w))
				checkWrite(t, w, res, err)
			},
			"incr": func(t *rapid.T) {
				w := genWrite(t, fencekv.OpIncr)
				w.delta = rapid.SampledFrom(propDeltas).Draw(t, "delta")
				n, res, err := db.Incr(ctx, []byte(w.key), w.delta, wopts(w))
				if want := checkWrite(t, w, res, err); want.err == nil && n != want.n {
					t.Fatalf("incr %q: value = %d; model says %d", w.key, n, want.n)
				}
			},
			"acquire": func(t *rapid.T) {
				name := rapid.SampledFrom(propLocks).Draw(t, "lock")
				ttl := rapid.SampledFrom(propTTLs).Draw(t, "ttl")
				delay := rapid.SampledFrom(propDelays).Draw(t, "delay")
				holder := rapid.SampledFrom([]string{"", "p", "q"}).Draw(t, "holder")
				l, err := db.Acquire(ctx, name, ttl, &fencekv.AcquireOptions{Holder: holder, LockDelay: delay})
				want, werr := m.acquire(name, ttl, delay, holder)
				sameRefusal(t, "acquire "+name, err, werr)
				if werr == nil && l != want {
					t.Fatalf("acquire %s = %+v; model says %+v", name, l, want)
				}
			},
			"renew": func(t *rapid.T) {
				name := rapid.SampledFrom(propLocks).Draw(t, "lock")
				tok := genToken(t, m, name)
				ttl, err := db.Renew(ctx, name, tok)
				want, werr := m.renew(name, tok)
				sameRefusal(t, "renew "+name, err, werr)
				if ttl != want {
					t.Fatalf("renew %s/%d = %v; model says %v", name, tok, ttl, want)
				}
			},
			"release": func(t *rapid.T) {
				name := rapid.SampledFrom(propLocks).Draw(t, "lock")
				tok := genToken(t, m, name)
				sameRefusal(t, "release "+name, db.Release(ctx, name, tok), m.release(name, tok))
			},
			"txn": func(t *rapid.T) {
				w := genWrite(t, state.OpTxn)
				var ops []modelWrite
				var tops []fencekv.TxnOp
				for range rapid.IntRange(1, 3).Draw(t, "ops") {
					op := modelWrite{op: rapid.SampledFrom([]fencekv.Op{fencekv.OpPut, fencekv.OpDelete, fencekv.OpIncr}).Draw(t, "txn op"),
						key: rapid.SampledFrom(propKeys).Draw(t, "txn key")}
					switch op.op {
					case fencekv.OpPut:
						op.value = rapid.SampledFrom(propValues).Draw(t, "txn value")
					case fencekv.OpIncr:
						op.delta = rapid.SampledFrom(propDeltas).Draw(t, "txn delta")
					}
					ops = append(ops, op)
					tops = append(tops, fencekv.TxnOp{Op: op.op, Key: []byte(op.key), Value: []byte(op.value), Delta: op.delta})
				}
				var compares []fencekv.Compare
				for range rapid.IntRange(0, 2).Draw(t, "compares") {
					key := rapid.SampledFrom(propKeys).Draw(t, "compare key")
					var rev fencekv.Revision
					if k := m.keys[key]; k != nil && k.live && rapid.Bool().Draw(t, "compare current") {
						rev = k.rev
					} else if rapid.Bool().Draw(t, "compare other") {
						rev = fencekv.Revision(rapid.Uint64Range(1, uint64(m.rev)+1).Draw(t, "compare revision"))
					}
					compares = append(compares, fencekv.Compare{Key: []byte(key), Revision: rev})
				}
				rev, rs, err := db.Txn(ctx, compares, tops, wopts(w))
				want, werr := m.txn(compares, ops, w)
				sameRefusal(t, "txn", err, werr)
				if werr != nil {
					return
				}
				if rev != m.rev || len(rs) != len(want) {
					t.Fatalf("txn = revision %d, %d results; model says %d, %d", rev, len(rs), m.rev, len(want))
				}
				for i := range rs {
					if string(rs[i].Key) != string(want[i].Key) || rs[i].Fence != want[i].Fence || rs[i].Revision != want[i].Revision ||
						rs[i].Deleted != want[i].Deleted || rs[i].Int != want[i].Int {
						t.Fatalf("txn op %d = %+v; model says %+v", i, rs[i], want[i])
					}
				}
			},
			"advance": func(t *rapid.T) {
				d := rapid.SampledFrom(propSteps).Draw(t, "step")
				clock.Advance(d)
				m.now += d
			},
		}
		// check compares the whole state with the model.
		check := func(t *rapid.T) {
			s, err := db.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			live := uint64(0)
			for _, k := range m.keys {
				if k.live {
					live++
				}
			}
			if s.LastToken != m.last || s.Revision != m.rev || s.Keys != live {
				t.Fatalf("status = last token %d, revision %d, keys %d; model says %d, %d, %d",
					s.LastToken, s.Revision, s.Keys, m.last, m.rev, live)
			}
			for _, key := range propKeys {
				e, err := db.Get(ctx, []byte(key))
				if err != nil {
					t.Fatal(err)
				}
				var want fencekv.Entry
				if k := m.keys[key]; k != nil {
					want.Fence = k.fence
					if k.live {
						want.Found, want.Value, want.Revision = true, []byte(k.value), k.rev
					}
				}
				if e.Found != want.Found || string(e.Value) != string(want.Value) || e.Fence != want.Fence || e.Revision != want.Revision {
					t.Fatalf("get %q = {found %v value %q fence %d rev %d}; model says {found %v value %q fence %d rev %d}",
						key, e.Found, e.Value, e.Fence, e.Revision, want.Found, want.Value, want.Fence, want.Revision)
				}
			}
			for _, name := range propLocks {
				in, err := db.LockInfo(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if want := m.info(name); in != want {
					t.Fatalf("lock info %s = %+v; model says %+v", name, in, want)
				}
			}
		}
		// Writes and lock commands weigh more than clock steps. rapid's
		// own Repeat averages 30 steps; longer runs reach lock-delays,
		// renewals of old grants and fences raised by made-up tokens.
		names := []string{"put", "put", "delete", "cas", "incr", "incr", "txn", "acquire", "acquire", "renew", "release", "advance", "advance"}
		steps := rapid.IntRange(1, 100).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			actions[rapid.SampledFrom(names).Draw(t, "action")](t)
			check(t)
		}
	})
}
