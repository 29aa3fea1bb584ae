package wire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
)

// A method reads its arguments and, on success, writes its result map to e
// (the response's error slot is already nil). On a refusal it returns the
// error and writes nothing.
type method func(ctx context.Context, eng Engine, a *args, e *encoder) error

// reads applies the read's consistency: "" or "linearizable" (the
// default), or "stale" (a cluster node may answer from its own state).
func (a *args) reads(ctx context.Context) (context.Context, error) {
	switch a.consistency {
	case "", "linearizable":
		return ctx, nil
	case "stale":
		return fencekv.WithStaleReads(ctx), nil
	}
	return ctx, badRequest("param \"consistency\" is %q; want \"linearizable\" or \"stale\"", a.consistency)
}

func need(a *args, fs ...field) error {
	for _, f := range fs {
		if a.has&f == 0 {
			return badRequest("missing param %q", f)
		}
	}
	return nil
}

// write returns the fencing options of a write. A "lock" that is present
// but empty is refused rather than read as "no lock": a client that meant a
// held write must not silently get an unheld one.
func (a *args) write() (fencekv.WriteOptions, error) {
	if a.has&fLock != 0 && a.lock == "" {
		return fencekv.WriteOptions{}, badRequest("param \"lock\" is empty")
	}
	return fencekv.WriteOptions{Token: fencekv.Token(a.token), Strict: a.strict, Lock: a.lock}, nil
}

func (e *encoder) written(r fencekv.WriteResult, extra int) {
	e.EncodeMapLen(2 + extra)
	e.uint("fence", uint64(r.Fence))
	e.uint("revision", uint64(r.Revision))
}

// waited serves the write st describes (start.go) by calling the engine
// and waiting for the outcome: a handler's way, where the event loop
// starts it instead. Both check the arguments and write the result as st
// says.
func waited(st starter) method {
	return func(ctx context.Context, eng Engine, a *args, e *encoder) error {
		cmd, w, encode, err := st(a)
		if err != nil {
			return err
		}
		r := exec(ctx, eng, cmd, w)
		audit(ctx, cmd.Op, a, r)
		if r.Err != nil {
			return r.Err
		}
		encode(e, a, r)
		return nil
	}
}

// exec applies cmd, a write of a starter, through the engine's method for
// it, and returns the outcome as the command's Result.
func exec(ctx context.Context, eng Engine, cmd state.Command, w fencekv.WriteOptions) (r state.Result) {
	var wr fencekv.WriteResult
	switch cmd.Op {
	case state.OpPut:
		wr, r.Err = eng.Put(ctx, cmd.Key, cmd.Value, w)
	case state.OpDelete:
		r.Deleted, wr, r.Err = eng.Delete(ctx, cmd.Key, w)
	case state.OpCAS:
		wr, r.Err = eng.CAS(ctx, cmd.Key, cmd.Revision, cmd.Value, w)
	case state.OpIncr:
		r.Int, wr, r.Err = eng.Incr(ctx, cmd.Key, cmd.Delta, w)
	case state.OpRenew:
		r.TTL, r.Err = eng.Renew(ctx, cmd.Lease.Name, cmd.Token)
	case state.OpRelease:
		r.Err = eng.Release(ctx, cmd.Lease.Name, cmd.Token)
	default:
		r.Err = fmt.Errorf("wire: no engine method for op %d", cmd.Op)
	}
	r.Entry.Fence, r.Entry.Revision = wr.Fence, wr.Revision
	return r
}

// audit logs the outcome of a lock method to the lock audit trail.
func audit(ctx context.Context, op fencekv.Op, a *args, r state.Result) {
	switch op {
	case state.OpAcquire:
		auditAcquire(ctx, a, fencekv.Lease{Name: a.lock, Token: r.Grant.Token, TTL: r.Grant.TTL}, r.Err)
	case state.OpRenew:
		auditRenew(ctx, a, r.Err)
	case state.OpRelease:
		auditRelease(ctx, a, r.Err)
	}
}

func ping(_ context.Context, _ Engine, _ *args, e *encoder) error {
	e.EncodeMapLen(1)
	e.str("version", fencekv.Version)
	return nil
}

func get(ctx context.Context, eng Engine, a *args, e *encoder) error {
	ctx, err := a.reads(ctx)
	if err != nil {
		return err
	}
	if err := need(a, fKey); err != nil {
		return err
	}
	if l, ok := eng.(lender); ok && isDirect(l, eng) {
		// The local store lends the value, to be encoded without a copy.
		// Not through Engine: a cluster node's Get copies anyway, or
		// comes from the leader. The callback is the encoder's own,
		// made once: one made here would escape through the interface,
		// an allocation per get.
		return l.GetFunc(ctx, a.key, e.entryFn)
	}
	en, err := eng.Get(ctx, a.key)
	if err != nil {
		return err
	}
	e.entry(en)
	return nil
}

// lender is an engine that lends a stored value to fn, which must not
// keep it (a *fencekv.DB).
type lender interface {
	GetFunc(ctx context.Context, key []byte, fn func(fencekv.Entry)) error
	directer
}

// entry writes a get's result.
func (e *encoder) entry(en fencekv.Entry) {
	e.EncodeMapLen(4)
	e.bool("found", en.Found)
	e.EncodeString("value")
	switch {
	case !en.Found:
		e.EncodeNil()
	case en.Value == nil:
		e.EncodeBytes([]byte{})
	default:
		e.EncodeBytes(en.Value)
	}
	e.uint("fence", uint64(en.Fence))
	e.uint("revision", uint64(en.Revision))
}

func scan(ctx context.Context, eng Engine, a *args, e *encoder) error {
	ctx, err := a.reads(ctx)
	if err != nil {
		return err
	}
	items, more, err := scanPage(ctx, eng, a) // clipped to the principal's rights (auth.go)
	if err != nil {
		return err
	}
	e.EncodeMapLen(2)
	e.EncodeString("items")
	e.EncodeArrayLen(len(items))
	for _, it := range items {
		e.EncodeMapLen(4)
		e.bin("key", it.Key)
		e.bin("value", it.Value)
		e.uint("fence", uint64(it.Fence))
		e.uint("revision", uint64(it.Revision))
	}
	e.bool("more", more)
	return nil
}

// clampInt keeps a limit inside int range; the engine refuses what is over
// its own maximum.
func clampInt(n int64) int64 {
	const maxInt = int64(^uint(0) >> 1)
	if n > maxInt {
		return maxInt
	}
	return n
}

// auditKey is the context key of the logger the lock methods log to.
type auditKey struct{}

// withAudit returns a context that carries the server's logger.
func withAudit(ctx context.Context, log *slog.Logger) context.Context {
	return context.WithValue(ctx, auditKey{}, log)
}

// auditor returns the logger to log a lock method's outcome to, and at
// which level, or nil if that level is off: grants and releases at debug;
// refused renews and releases (a lease its holder thought it had) at
// info, other refusals at debug. Together with the refusal log's warnings
// of refused fenced writes, they are the audit trail of the locks.
func auditor(ctx context.Context, err error) (*slog.Logger, slog.Level) {
	log, _ := ctx.Value(auditKey{}).(*slog.Logger)
	level := slog.LevelDebug
	if errors.Is(err, fencekv.ErrNotHolder) || errors.Is(err, fencekv.ErrLeaseExpired) {
		level = slog.LevelInfo
	}
	if log == nil || !log.Enabled(ctx, level) {
		return nil, level
	}
	return log, level
}

func acquire(ctx context.Context, eng Engine, a *args, e *encoder) error {
	if err := need(a, fLock, fTTL); err != nil {
		return err
	}
	limit, err := acquireLimit(a) // semaphore.go
	if err != nil {
		return err
	}
	// The options go to the engine by pointer, through an interface, so
	// they live on the heap: in a, which does already.
	a.acquireOpts = fencekv.AcquireOptions{
		Holder:    a.holder,
		Wait:      ms(a.waitMs),
		LockDelay: ms(a.delayMs),
		Limit:     limit,
	}
	l, err := eng.Acquire(ctx, a.lock, ms(a.ttlMs), &a.acquireOpts)
	auditAcquire(ctx, a, l, err)
	if err != nil {
		return err
	}
	e.granted(l.Token, l.TTL)
	return nil
}

func (e *encoder) granted(token fencekv.Token, ttl time.Duration) {
	e.EncodeMapLen(2)
	e.uint("token", uint64(token))
	e.int("ttl_ms", toMs(ttl))
}

// auditAcquire logs an acquire's outcome to the lock audit trail.
func auditAcquire(ctx context.Context, a *args, l fencekv.Lease, err error) {
	if err != nil {
		if log, lv := auditor(ctx, err); log != nil && !errors.Is(err, context.Canceled) {
			log.Log(ctx, lv, "lock acquire refused", "lock", a.lock, "holder", a.holder, "err", err.Error(), "client", fencekv.ClientAddr(ctx))
		}
		return
	}
	if log, lv := auditor(ctx, nil); log != nil {
		log.Log(ctx, lv, "lock granted", "lock", a.lock, "token", uint64(l.Token), "holder", a.holder, "ttl", l.TTL, "client", fencekv.ClientAddr(ctx))
	}
}

// auditRenew logs a refused renew to the lock audit trail.
func auditRenew(ctx context.Context, a *args, err error) {
	if err == nil {
		return
	}
	if log, lv := auditor(ctx, err); log != nil {
		log.Log(ctx, lv, "lock renew refused", "lock", a.lock, "token", a.token, "err", err.Error(), "client", fencekv.ClientAddr(ctx))
	}
}

// auditRelease logs a release's outcome to the lock audit trail.
func auditRelease(ctx context.Context, a *args, err error) {
	if err != nil {
		if log, lv := auditor(ctx, err); log != nil {
			log.Log(ctx, lv, "lock release refused", "lock", a.lock, "token", a.token, "err", err.Error(), "client", fencekv.ClientAddr(ctx))
		}
		return
	}
	if log, lv := auditor(ctx, nil); log != nil {
		log.Log(ctx, lv, "lock released", "lock", a.lock, "token", a.token, "client", fencekv.ClientAddr(ctx))
	}
}

func lockInfo(ctx context.Context, eng Engine, a *args, e *encoder) error {
	ctx, err := a.reads(ctx)
	if err != nil {
		return err
	}
	if err := need(a, fLock); err != nil {
		return err
	}
	in, err := eng.LockInfo(ctx, a.lock)
	if err != nil {
		return err
	}
	e.lockMap(in, false)
	return nil
}

func (e *encoder) lockMap(in fencekv.LockInfo, withName bool) {
	n := 6 + semFields(&in) // semaphore.go
	if withName {
		n++
		e.EncodeMapLen(n)
		e.bin("lock", []byte(in.Name))
	} else {
		e.EncodeMapLen(n)
	}
	e.bool("held", in.Held)
	e.str("holder", in.Holder)
	e.uint("token", uint64(in.Token))
	e.int("ttl_ms", toMs(in.TTL))
	e.int("waiters", int64(in.Waiters))
	e.int("lock_delay_ms", toMs(in.Delay))
	e.semaphore(&in)
}

func locks(ctx context.Context, eng Engine, a *args, e *encoder) error {
	ctx, err := a.reads(ctx)
	if err != nil {
		return err
	}
	ls, more, err := locksPage(ctx, eng, a) // clipped to the principal's rights (auth.go)
	if err != nil {
		return err
	}
	e.EncodeMapLen(2)
	e.EncodeString("locks")
	e.EncodeArrayLen(len(ls))
	for _, in := range ls {
		e.lockMap(in, true)
	}
	e.bool("more", more)
	return nil
}

func status(ctx context.Context, eng Engine, _ *args, e *encoder) error {
	st, err := eng.Status(ctx)
	if err != nil {
		return err
	}
	e.EncodeMapLen(19)
	e.str("version", st.Version)
	e.int("pid", int64(os.Getpid()))
	e.str("node", st.Node)
	e.str("role", st.Role)
	e.str("leader", st.Leader)
	e.uint("term", st.Term)
	e.uint("commit_index", st.CommitIndex)
	e.uint("applied_index", st.AppliedIndex)
	e.uint("last_token", uint64(st.LastToken))
	e.uint("revision", uint64(st.Revision))
	e.uint("keys", st.Keys)
	e.int("locks", int64(st.Locks))
	e.int("waiters", int64(st.Waiters))
	e.uint("commits", st.Commits)
	e.uint("commands", st.Commands)
	e.int("data_size", st.DataSize)
	e.int("sync_us", st.SyncTime.Microseconds())
	e.uint("checkpoints", st.Checkpoints)
	e.int("checkpoint_us", st.CheckpointTime.Microseconds())
	return nil
}

// termer is a cluster node: it knows its raft term.
type termer interface {
	Term() uint64
}

// term answers the node's raft term as it is now (0 on a single node). A
// cluster's leader asks each voter for it before it answers a
// linearizable read: a voter still in no newer term has voted for no newer
// leader.
func term(_ context.Context, eng Engine, _ *args, e *encoder) error {
	var t uint64
	if tm, ok := eng.(termer); ok {
		t = tm.Term()
	}
	e.EncodeMapLen(1)
	e.uint("term", t)
	return nil
}

// readIndexer is a cluster node: as the leader, it confirms that it leads
// and gives its commit index, for another node's linearizable read.
type readIndexer interface {
	ReadIndex(ctx context.Context) (uint64, error)
}

// readIndex answers the leader's commit index once it has confirmed, as
// for a linearizable read of its own, that it leads: a follower that has
// applied the log up to it may answer a read that arrived before it asked
// from its own state.
func readIndex(ctx context.Context, eng Engine, _ *args, e *encoder) error {
	ri, ok := eng.(readIndexer)
	if !ok {
		return &fencekv.Error{Code: fencekv.CodeNotLeader, Message: "read_index: this server is not a cluster node"}
	}
	index, err := ri.ReadIndex(ctx)
	if err != nil {
		return err
	}
	e.EncodeMapLen(1)
	e.uint("index", index)
	return nil
}

// memberLister is an engine that knows its cluster's members.
type memberLister interface {
	Members(ctx context.Context) ([]fencekv.Member, error)
}

// members lists a cluster's nodes; a single node lists none.
func members(ctx context.Context, eng Engine, _ *args, e *encoder) error {
	var ms []fencekv.Member
	if ml, ok := eng.(memberLister); ok {
		var err error
		if ms, err = ml.Members(ctx); err != nil {
			return err
		}
	}
	e.EncodeMapLen(1)
	e.EncodeString("members")
	e.EncodeArrayLen(len(ms))
	for _, m := range ms {
		e.EncodeMapLen(7)
		e.str("node", m.Node)
		e.str("client_addr", m.ClientAddr)
		e.str("raft_addr", m.RaftAddr)
		e.str("gossip_addr", m.GossipAddr)
		e.str("state", m.State)
		e.bool("voter", m.Voter)
		e.str("raft_role", m.RaftRole)
	}
	return nil
}

// refusalLister is an engine that keeps a refusal log.
type refusalLister interface {
	Refusals(ctx context.Context, since uint64, limit int) ([]fencekv.Refusal, uint64, error)
}

// refusals lists refused fenced writes after sequence number since.
func refusals(ctx context.Context, eng Engine, a *args, e *encoder) error {
	rl, ok := eng.(refusalLister)
	if !ok {
		return &fencekv.Error{Code: fencekv.CodeUnknownMethod, Message: "this server keeps no refusal log"}
	}
	rs, last, err := rl.Refusals(ctx, a.since, int(a.limit))
	if err != nil {
		return err
	}
	e.EncodeMapLen(2)
	e.EncodeString("refusals")
	e.EncodeArrayLen(len(rs))
	for _, r := range rs {
		e.EncodeMapLen(13)
		e.uint("seq", r.Seq)
		e.int("time_ms", r.Time.UnixMilli())
		e.str("code", string(r.Code))
		e.str("op", r.Op)
		e.bin("key", r.Key)
		e.str("lock", r.Lock)
		e.uint("token", uint64(r.Token))
		e.uint("fence", uint64(r.Fence))
		e.uint("holder_token", uint64(r.Holder))
		e.str("granted_lock", r.GrantedLock)
		e.str("granted_holder", r.GrantedHolder)
		e.str("client", r.Client)
		e.bool("known", r.GrantedLock != "")
	}
	e.uint("last", last)
	return nil
}

// txner is an engine that applies multi-key transactions.
type txner interface {
	Txn(ctx context.Context, compares []fencekv.Compare, ops []fencekv.TxnOp, w fencekv.WriteOptions) (fencekv.Revision, []fencekv.TxnResult, error)
}

// txn applies ops, all or none, if every compare holds.
func txn(ctx context.Context, eng Engine, a *args, e *encoder) error {
	t, ok := eng.(txner)
	if !ok {
		return &fencekv.Error{Code: fencekv.CodeUnknownMethod, Message: "this server has no txn"}
	}
	if err := need(a, fOps); err != nil {
		return err
	}
	w, err := a.write()
	if err != nil {
		return err
	}
	rev, rs, err := t.Txn(ctx, a.compares, a.ops, w)
	if err != nil {
		return err
	}
	e.EncodeMapLen(2)
	e.uint("revision", uint64(rev))
	e.EncodeString("results")
	e.EncodeArrayLen(len(rs))
	for i, r := range rs {
		incr := a.ops[i].Op == state.OpIncr
		e.EncodeMapLen(3 + b2i(incr))
		e.bin("key", r.Key)
		e.uint("fence", uint64(r.Fence))
		e.uint("revision", uint64(r.Revision))
		if incr {
			e.int("value", r.Int)
		}
	}
	return nil
}
