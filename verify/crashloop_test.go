package verify

// TestCrashLoop kills a real server with SIGKILL at random moments, over
// and over, restarts it on the same data dir, and checks after every
// restart that nothing acknowledged was lost (G6):
//
//   - writers: one per key, fenced puts of increasing values with rising
//     tokens, fenced incrs, and txns that write a key and its twin
//     together (after every kill both must agree: a txn is all or
//     nothing, also across a crash); each key must hold exactly its last
//     acknowledged value, or the value of the one write that was in flight
//     at the kill, with the fence that goes with it (so fences never went
//     down);
//   - lock users: acquire (on an own lock, or a shared one with a queue),
//     renew, release; every acknowledged grant's token is <= status
//     last_token, a lease acknowledged and not released is still held by
//     its token with at least its full TTL from the restart (G7), and the
//     next acquire's token is above every token ever acknowledged (G1).
//
// Every operation is sequential per worker, so at most one is in flight
// per worker when the server dies: the checks are exact, not "at least".

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wire"
)

type crashConfig struct {
	iterations int
	writers    int              // put writers, and as many incr writers
	lockers    int              // lock users
	killAfter  [2]time.Duration // run this long (at random) before a kill
	minAcks    int64            // and until at least this many acknowledgements
}

// crashTTL is the lease of the crash loop's grants: long enough that no
// lease expires within an iteration, so every acknowledged grant that was
// not released must survive the kill.
const crashTTL = 30 * time.Second

// crashOpTimeout bounds one call; a call that times out counts as in
// flight at the kill.
const crashOpTimeout = 20 * time.Second

func TestCrashLoop(t *testing.T) {
	cfg := crashConfig{iterations: 5, writers: 3, lockers: 3, killAfter: [2]time.Duration{300 * time.Millisecond, time.Second}, minAcks: 30}
	switch {
	case verifyLong():
		cfg.iterations, cfg.writers, cfg.lockers = 100, 4, 4
		cfg.killAfter = [2]time.Duration{100 * time.Millisecond, 3 * time.Second}
	case !testing.Short():
		cfg.iterations = 10
	}
	runCrashLoop(t, cfg)
}

// crashTok is the token a writer uses for its n-th value: it rises every
// few writes, so fences move and writes stay non-strict but fenced.
func crashTok(n int64) uint64 { return 1 + uint64(n)/5 }

// crashWriter owns one key. It writes values 1, 2, 3, ... with put, or
// counts with incr +1; either way the key's value after an accepted write
// n is n, and its fence crashTok(n).
type crashWriter struct {
	key  string
	incr bool
	// txn writes key and its twin (key + "/twin") together in one txn:
	// after any kill, both hold the same value and fence (atomicity).
	txn   bool
	acked int64 // the last acknowledged value; 0 for none
	// pending is the value of the write in flight at the kill; 0 for none.
	pending int64
}

// crashLocker uses locks: acquire, renew a few times, release.
type crashLocker struct {
	id   int
	lock string // its own lock; the shared one is crashSharedLock

	held      string // the lock it holds by an acknowledged grant ("" none)
	heldToken uint64
	renews    int // renews left before releasing

	// The call in flight at the kill: an acquire of pendLock (floor: every
	// token acknowledged before it was called), or a release of
	// held/heldToken (pendRelease).
	pendLock    string
	pendFloor   uint64
	pendRelease bool
}

const crashSharedLock = "crash/lock/shared"

// crashRun is the state of a crash loop across iterations.
type crashRun struct {
	t     *testing.T
	srv   *serverProc
	start time.Time
	rng   *rand.Rand

	writers []*crashWriter
	lockers []*crashLocker

	acks *opCounter // acknowledgements, for the kill schedule

	mu       sync.Mutex // guards grants, maxToken
	grants   []grantRec // every acknowledged grant
	maxToken uint64     // the highest token acknowledged (or seen held) so far
}

func (r *crashRun) now() int64 { return int64(time.Since(r.start)) }

func runCrashLoop(t *testing.T, cfg crashConfig) {
	seed := testSeed(t)
	r := &crashRun{t: t, srv: startServer(t, t.TempDir()), start: time.Now(),
		rng: rand.New(rand.NewPCG(seed, 0)), acks: newOpCounter()}
	for i := range cfg.writers {
		r.writers = append(r.writers,
			&crashWriter{key: fmt.Sprintf("crash/put/%d", i)},
			&crashWriter{key: fmt.Sprintf("crash/incr/%d", i), incr: true},
			&crashWriter{key: fmt.Sprintf("crash/txn/%d", i), txn: true})
	}
	for i := range cfg.lockers {
		r.lockers = append(r.lockers, &crashLocker{id: i, lock: fmt.Sprintf("crash/lock/%d", i)})
	}
	var acked, inFlight int
	for it := range cfg.iterations {
		a, f := r.iteration(cfg, seed, it)
		acked += a
		inFlight += f
		r.srv.start()
		r.check(it)
		if t.Failed() {
			t.Fatalf("iteration %d failed; seed %d", it, seed)
		}
	}
	r.mu.Lock()
	checkGrantOrder(t, r.grants)
	grants := len(r.grants)
	r.mu.Unlock()
	t.Logf("%d iterations (kill -9 and restart each): %d acknowledged operations (%d grants), %d in flight at a kill, all checked; %v",
		cfg.iterations, acked, grants, inFlight, time.Since(r.start).Round(time.Millisecond))
}

// iteration runs the workers until a kill at a random moment, and returns
// the acknowledged operations and the ones in flight at the kill.
func (r *crashRun) iteration(cfg crashConfig, seed uint64, it int) (acked, inFlight int) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var nAcked, nFlight atomic.Int64
	defer func() {
		cancel() // on a Fatalf: do not leave workers behind
		wg.Wait()
	}()
	addr, err := r.srv.Up(ctx)
	if err != nil {
		r.t.Fatalf("server not up: %v", err)
	}
	for _, w := range r.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, f := r.runWriter(ctx, addr, w)
			nAcked.Add(a)
			nFlight.Add(f)
		}()
	}
	for _, l := range r.lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(it)<<8|uint64(l.id)))
			a, f := r.runLocker(ctx, addr, l, rng)
			nAcked.Add(a)
			nFlight.Add(f)
		}()
	}
	r.acks.await(r.t, cfg.minAcks, randDuration(r.rng, cfg.killAfter[0], cfg.killAfter[1]), "workers acknowledged")
	r.srv.kill()
	wg.Wait() // every worker stops at its first failed call
	return int(nAcked.Load()), int(nFlight.Load())
}

// lost reports whether err means the call's outcome is unknown (the
// connection broke, or it timed out) rather than a refusal.
func lost(err error) bool {
	var fe *fencekv.Error
	return err != nil && !errors.As(err, &fe)
}

// runWriter writes w's key until a call fails; that call is w's pending
// write.
func (r *crashRun) runWriter(ctx context.Context, addr string, w *crashWriter) (acked, inFlight int64) {
	c, err := wire.Dial(ctx, addr)
	if err != nil {
		return 0, 0 // the server died before this worker started
	}
	defer c.Close()
	for ctx.Err() == nil {
		n := w.acked + 1
		tok := crashTok(n)
		opts := fencekv.WriteOptions{Token: fencekv.Token(tok)}
		cctx, cancel := context.WithTimeout(ctx, crashOpTimeout)
		var res fencekv.WriteResult
		var got int64
		switch {
		case w.incr:
			got, res, err = c.Incr(cctx, []byte(w.key), 1, opts)
		case w.txn:
			v := []byte(strconv.FormatInt(n, 10))
			var rs []fencekv.TxnResult
			_, rs, err = c.Txn(cctx, nil, []fencekv.TxnOp{
				{Op: state.OpPut, Key: []byte(w.key), Value: v},
				{Op: state.OpPut, Key: []byte(w.key + "/twin"), Value: v},
			}, opts)
			if err == nil {
				res.Fence = rs[0].Fence
			}
			got = n
		default:
			res, err = c.Put(cctx, []byte(w.key), []byte(strconv.FormatInt(n, 10)), opts)
			got = n
		}
		cancel()
		switch {
		case lost(err):
			w.pending = n
			return acked, 1
		case err != nil:
			r.t.Errorf("%s: write of %d with token %d refused: %v", w.key, n, tok, err)
			return acked, 0
		case got != n || uint64(res.Fence) != tok:
			r.t.Errorf("%s: write of %d with token %d answered value %d, fence %d", w.key, n, tok, got, res.Fence)
			return acked, 0
		}
		w.acked = n
		acked++
		r.acks.done()
	}
	return acked, 0
}

// runLocker acquires, renews and releases until a call fails.
func (r *crashRun) runLocker(ctx context.Context, addr string, l *crashLocker, rng *rand.Rand) (acked, inFlight int64) {
	c, err := wire.Dial(ctx, addr)
	if err != nil {
		return 0, 0
	}
	defer c.Close()
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, crashOpTimeout)
		switch {
		case l.held == "":
			lock, o := l.lock, &fencekv.AcquireOptions{Holder: fmt.Sprintf("crash locker %d", l.id)}
			if rng.IntN(3) == 0 {
				lock, o.Wait = crashSharedLock, 100*time.Millisecond
			}
			r.mu.Lock()
			floor := r.maxToken
			r.mu.Unlock()
			call := r.now()
			var g fencekv.Lease
			g, err = c.Acquire(cctx, lock, crashTTL, o)
			ret := r.now()
			switch {
			case lost(err):
				l.pendLock, l.pendFloor = lock, floor
			case errors.Is(err, fencekv.ErrLockHeld) && lock == crashSharedLock:
				err = nil
			case err == nil:
				r.mu.Lock()
				r.grants = append(r.grants, grantRec{lock: lock, token: uint64(g.Token), call: call, ret: ret})
				r.maxToken = max(r.maxToken, uint64(g.Token))
				r.mu.Unlock()
				l.held, l.heldToken, l.renews = lock, uint64(g.Token), rng.IntN(4)
			}
		case l.renews > 0:
			_, err = c.Renew(cctx, l.held, fencekv.Token(l.heldToken))
			l.renews--
		default:
			err = c.Release(cctx, l.held, fencekv.Token(l.heldToken))
			switch {
			case lost(err):
				l.pendRelease = true
			case err == nil:
				l.held, l.heldToken = "", 0
			}
		}
		cancel()
		switch {
		case lost(err):
			return acked, 1
		case err != nil:
			r.t.Errorf("locker %d: unexpected refusal: %v", l.id, err)
			return acked, 0
		}
		acked++
		r.acks.done()
	}
	return acked, 0
}

// check runs after a restart: it compares the store with what was
// acknowledged, resolves the calls that were in flight, and leaves every
// lock free for the next iteration.
func (r *crashRun) check(it int) {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr, err := r.srv.Up(ctx)
	if err != nil {
		t.Fatalf("iteration %d: server not up: %v", it, err)
	}
	c, err := wire.Dial(ctx, addr)
	if err != nil {
		t.Fatalf("iteration %d: dial: %v", it, err)
	}
	defer c.Close()

	st, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("iteration %d: status: %v", it, err)
	}
	r.mu.Lock()
	maxAcked := r.maxToken
	r.mu.Unlock()
	if uint64(st.LastToken) < maxAcked {
		t.Errorf("iteration %d: status last_token %d is below the acknowledged token %d (G1, G6)", it, st.LastToken, maxAcked)
	}

	for _, w := range r.writers {
		e, err := c.Get(ctx, []byte(w.key))
		if err != nil {
			t.Fatalf("iteration %d: get %s: %v", it, w.key, err)
		}
		var v int64
		if e.Found {
			if v, err = strconv.ParseInt(string(e.Value), 10, 64); err != nil {
				t.Errorf("iteration %d: %s holds %q", it, w.key, e.Value)
				continue
			}
		}
		wantFence := func(n int64) uint64 {
			if n == 0 {
				return 0
			}
			return crashTok(n)
		}
		switch {
		case e.Found == (w.acked > 0) && v == w.acked && uint64(e.Fence) == wantFence(w.acked):
		case w.pending > 0 && e.Found && v == w.pending && uint64(e.Fence) == wantFence(w.pending):
			w.acked = w.pending // the in-flight write was applied
		default:
			t.Errorf("iteration %d: %s is %q (found %v) with fence %d; acknowledged %d with fence %d, in flight %d (G6: an acknowledged write was lost, or the fence went down)",
				it, w.key, e.Value, e.Found, e.Fence, w.acked, wantFence(w.acked), w.pending)
			w.acked = v
		}
		w.pending = 0
		if w.txn {
			twin, err := c.Get(ctx, []byte(w.key+"/twin"))
			if err != nil {
				t.Fatalf("iteration %d: get %s/twin: %v", it, w.key, err)
			}
			if twin.Found != e.Found || string(twin.Value) != string(e.Value) || twin.Fence != e.Fence || twin.Revision != e.Revision {
				t.Errorf("iteration %d: txn half applied: %s = %q fence %d rev %d, its twin %q fence %d rev %d",
					it, w.key, e.Value, e.Fence, e.Revision, twin.Value, twin.Fence, twin.Revision)
			}
		}
	}

	// What each lock may look like now.
	type expect struct {
		definite    uint64          // held by this token (acknowledged, no release sent)
		maybe       map[uint64]bool // held by one of these (release in flight), or free
		acquireFrom uint64          // an acquire was in flight: held by a token above this, or free
		acquiring   bool
	}
	locks := map[string]*expect{crashSharedLock: {}}
	for _, l := range r.lockers {
		locks[l.lock] = &expect{}
	}
	for _, l := range r.lockers {
		switch {
		case l.held != "" && l.pendRelease:
			e := locks[l.held]
			if e.maybe == nil {
				e.maybe = map[uint64]bool{}
			}
			e.maybe[l.heldToken] = true
		case l.held != "":
			locks[l.held].definite = l.heldToken
		case l.pendLock != "":
			e := locks[l.pendLock]
			if !e.acquiring || l.pendFloor < e.acquireFrom {
				e.acquireFrom = l.pendFloor
			}
			e.acquiring = true
		}
	}
	for name, e := range locks {
		in, err := c.LockInfo(ctx, name)
		if err != nil {
			t.Fatalf("iteration %d: lock_info %s: %v", it, name, err)
		}
		sinceStart := time.Since(r.srv.Started())
		tok := uint64(in.Token)
		switch {
		case e.definite != 0 && (!in.Held || tok != e.definite):
			t.Errorf("iteration %d: lock %s: held=%v token %d; want held by the acknowledged grant %d (G6, G7)", it, name, in.Held, tok, e.definite)
		case e.definite != 0 && in.TTL < crashTTL-sinceStart-2*time.Millisecond:
			t.Errorf("iteration %d: lock %s: lease has %v left, %v after the restart began; want at least its full TTL %v from the restart (G7)", it, name, in.TTL, sinceStart, crashTTL)
		case e.definite != 0, !in.Held, e.maybe[tok]:
		case e.acquiring && tok > e.acquireFrom && tok <= uint64(st.LastToken):
			r.mu.Lock()
			r.maxToken = max(r.maxToken, tok) // an in-flight acquire was granted
			r.mu.Unlock()
		default:
			t.Errorf("iteration %d: lock %s is held by token %d, which no acknowledged or in-flight call explains (status last_token %d)", it, name, tok, st.LastToken)
		}
		if in.Held {
			if err := c.Release(ctx, name, in.Token); err != nil {
				t.Errorf("iteration %d: releasing %s token %d: %v", it, name, tok, err)
			}
		}
	}
	for _, l := range r.lockers {
		l.held, l.heldToken, l.pendLock, l.pendRelease = "", 0, "", false
	}

	// The next grant is above everything ever acknowledged (G1).
	call := r.now()
	g, err := c.Acquire(ctx, "crash/probe", crashTTL, nil)
	ret := r.now()
	if err != nil {
		t.Fatalf("iteration %d: probe acquire: %v", it, err)
	}
	r.mu.Lock()
	if uint64(g.Token) <= r.maxToken {
		t.Errorf("iteration %d: the first grant after the restart has token %d, not above %d acknowledged before (G1)", it, g.Token, r.maxToken)
	}
	r.grants = append(r.grants, grantRec{lock: "crash/probe", token: uint64(g.Token), call: call, ret: ret})
	r.maxToken = max(r.maxToken, uint64(g.Token))
	r.mu.Unlock()
	if st2, err := c.Status(ctx); err != nil {
		t.Fatalf("iteration %d: status: %v", it, err)
	} else if st2.LastToken != g.Token {
		t.Errorf("iteration %d: status last_token %d right after granting token %d", it, st2.LastToken, g.Token)
	}
	if err := c.Release(ctx, "crash/probe", g.Token); err != nil {
		t.Errorf("iteration %d: probe release: %v", it, err)
	}
}
