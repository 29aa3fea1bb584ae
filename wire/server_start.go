package wire

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
)

// Started writes. On the event loop, a write to a *fencekv.DB needs no
// goroutine: the loop reads it, checks it, and starts it (DB.StartLed,
// through eventLoop.start); the goroutine that commits its batch (the loop
// itself, or a committer) calls back with the result, and the answer is
// written from there. A goroutine that waits for the commit, and
// its wake-up, is what a write costs a goroutine connection; here there is
// none. An acquire that may wait for the lock still gets a handler.

// writeStarter is an engine whose writes the event loop starts without a
// goroutine waiting for them (a *fencekv.DB): StartLed queues a write, to
// call then with its result once durable, and reports whether the caller
// now leads the batch; the leader commits it (Lead) or hands it to a
// committer goroutine (PassLead). An engine that wraps a *fencekv.DB to
// change its writes must not pass these on.
type writeStarter interface {
	StartLed(ctx context.Context, c state.Command, w fencekv.WriteOptions, then func(state.Result)) bool
	Lead()
	PassLead()
	directer
}

// directer is an engine with paths that bypass its Engine methods
// (writeStarter, lender). Direct returns the engine those paths belong to:
// the engine itself for a *fencekv.DB; for a type that embeds one, the
// embedded DB, which inherits the paths but not the wrapper's changes
// (TestForwardingMarksConnection, TestWithLock's stuck renew).
type directer interface {
	Direct() any
}

// isDirect reports whether d's direct paths are eng's own, not those of
// an engine eng embeds.
func isDirect(d directer, eng Engine) bool { return d.Direct() == any(eng) }

// starter checks a write's arguments and returns its command and fencing,
// and the encoder of its result map from the command's Result.
type starter func(a *args) (state.Command, fencekv.WriteOptions, func(*encoder, *args, state.Result), error)

func writtenOf(r state.Result) fencekv.WriteResult {
	return fencekv.WriteResult{Fence: r.Entry.Fence, Revision: r.Entry.Revision}
}

func startPut(a *args) (state.Command, fencekv.WriteOptions, func(*encoder, *args, state.Result), error) {
	if err := need(a, fKey, fValue); err != nil {
		return state.Command{}, fencekv.WriteOptions{}, nil, err
	}
	w, err := a.write()
	return state.Command{Op: state.OpPut, Key: a.key, Value: a.value}, w, func(e *encoder, _ *args, r state.Result) {
		e.written(writtenOf(r), 0)
	}, err
}

func startDelete(a *args) (state.Command, fencekv.WriteOptions, func(*encoder, *args, state.Result), error) {
	if err := need(a, fKey); err != nil {
		return state.Command{}, fencekv.WriteOptions{}, nil, err
	}
	w, err := a.write()
	return state.Command{Op: state.OpDelete, Key: a.key}, w, func(e *encoder, _ *args, r state.Result) {
		e.written(writtenOf(r), 1)
		e.bool("deleted", r.Deleted)
	}, err
}

func startCAS(a *args) (state.Command, fencekv.WriteOptions, func(*encoder, *args, state.Result), error) {
	if err := need(a, fKey, fRevision, fValue); err != nil {
		return state.Command{}, fencekv.WriteOptions{}, nil, err
	}
	w, err := a.write()
	return state.Command{Op: state.OpCAS, Key: a.key, Revision: fencekv.Revision(a.revision), Value: a.value}, w, func(e *encoder, _ *args, r state.Result) {
		e.written(writtenOf(r), 0)
	}, err
}

func startIncr(a *args) (state.Command, fencekv.WriteOptions, func(*encoder, *args, state.Result), error) {
	if err := need(a, fKey, fDelta); err != nil {
		return state.Command{}, fencekv.WriteOptions{}, nil, err
	}
	w, err := a.write()
	return state.Command{Op: state.OpIncr, Key: a.key, Delta: a.delta}, w, func(e *encoder, _ *args, r state.Result) {
		e.written(writtenOf(r), 1)
		e.int("value", r.Int)
	}, err
}

func startAcquire(a *args) (state.Command, fencekv.WriteOptions, func(*encoder, *args, state.Result), error) {
	if err := need(a, fLock, fTTL); err != nil {
		return state.Command{}, fencekv.WriteOptions{}, nil, err
	}
	limit, err := acquireLimit(a) // semaphore.go
	if err != nil {
		return state.Command{}, fencekv.WriteOptions{}, nil, err
	}
	c := state.Command{Op: state.OpAcquire, Lease: state.LeaseRequest{Name: a.lock, TTL: ms(a.ttlMs), Holder: a.holder, LockDelay: ms(a.delayMs), Limit: limit}}
	return c, fencekv.WriteOptions{}, func(e *encoder, _ *args, r state.Result) {
		e.granted(r.Grant.Token, r.Grant.TTL)
	}, nil
}

func startRenew(a *args) (state.Command, fencekv.WriteOptions, func(*encoder, *args, state.Result), error) {
	if err := need(a, fLock, fToken); err != nil {
		return state.Command{}, fencekv.WriteOptions{}, nil, err
	}
	c := state.Command{Op: state.OpRenew, Lease: state.LeaseRequest{Name: a.lock}, Token: fencekv.Token(a.token)}
	return c, fencekv.WriteOptions{}, func(e *encoder, _ *args, r state.Result) {
		e.EncodeMapLen(1)
		e.int("ttl_ms", toMs(r.TTL))
	}, nil
}

func startRelease(a *args) (state.Command, fencekv.WriteOptions, func(*encoder, *args, state.Result), error) {
	if err := need(a, fLock, fToken); err != nil {
		return state.Command{}, fencekv.WriteOptions{}, nil, err
	}
	c := state.Command{Op: state.OpRelease, Lease: state.LeaseRequest{Name: a.lock}, Token: fencekv.Token(a.token)}
	return c, fencekv.WriteOptions{}, func(e *encoder, _ *args, r state.Result) {
		e.EncodeMapLen(0)
	}, nil
}

// starterFor returns the starter of m on c, or nil if m is served by a
// handler: c is not on the event loop, the method is not started, or it
// is an acquire with a wait (or a bad one, which its handler refuses).
func (c *conn) starterFor(m *message, a *args) starter {
	if c.raw == nil || c.s.starts == nil {
		return nil
	}
	if m.info == nil {
		return nil
	}
	st := m.info.start
	if st == nil || m.method == "acquire" && a.waitMs != 0 {
		return nil
	}
	return st
}

// started is a request on its way through DB.Start: one allocation holds
// what its answer needs.
type started struct {
	c      *conn
	m      message
	a      args // a copy: the connection reuses its own
	e      *encoder
	ctx    context.Context
	op     fencekv.Op
	encode func(*encoder, *args, state.Result)
}

// start serves m as handle does, with the engine's wait replaced by
// DB.Start: its checks and its refusals are answered at once, its result
// when the batch that applied it is durable. c.handlers counts it until
// it is answered.
func (c *conn) start(st starter, m message, a *args) {
	s := &started{c: c, m: m, a: *a, e: encoderPool.Get().(*encoder)}
	s.e.response(m.msgid)
	ctx, ferr := c.authorize(c.base, m.method, &s.a) // auth.go
	if ferr != nil {
		s.done(s.refuse(ferr))
		return
	}
	cmd, w, encode, err := st(&s.a)
	if err != nil {
		s.done(s.refuse(err))
		return
	}
	s.ctx, s.op, s.encode = ctx, cmd.Op, encode
	s.e.EncodeNil() // the error slot; the result follows
	c.s.loop.start(ctx, cmd, w, s.answer)
}

// answer answers with the command's result; DB.Start calls it.
func (s *started) answer(r state.Result) {
	var code fencekv.Code
	defer func() {
		if p := recover(); p != nil {
			s.c.s.log.Error("panic answering a request; recovered", "method", s.m.method, "panic", p, "stack", string(debug.Stack()))
			code = fencekv.CodeInternal
			s.e.response(s.m.msgid)
			s.c.finish(s.m, s.e, &fencekv.Error{Code: code, Message: fmt.Sprintf("internal error serving %s", s.m.method)})
		}
		s.done(code)
	}()
	audit(s.ctx, s.op, &s.a, r)
	if r.Err != nil {
		code = s.refuse(r.Err)
		return
	}
	s.encode(s.e, &s.a, r)
	s.c.send(s.m, s.e)
}

// refuse answers err, and returns its code.
func (s *started) refuse(err error) fencekv.Code {
	fe := asError(err)
	s.e.response(s.m.msgid)
	s.c.finish(s.m, s.e, fe)
	return fe.Code
}

// done reports the request to Config.Observe and ends it.
func (s *started) done(code fencekv.Code) {
	if s.c.s.cfg.Observe != nil {
		s.c.s.cfg.Observe(s.m.method, code, time.Since(s.m.began))
	}
	s.c.handlers.Done()
}

// The store's direct paths, checked at compile time.
var (
	_ writeStarter = (*fencekv.DB)(nil)
	_ lender       = (*fencekv.DB)(nil)
)
