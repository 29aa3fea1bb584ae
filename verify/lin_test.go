package verify

// TestLinearizable runs concurrent clients against a real server that is
// SIGKILLed and restarted on its data dir several times, records every
// operation with its call and return times, and checks the history with
// porcupine against a model of fencekv's state machine: values, fences
// (G2, G3), revisions, held writes (G4), lock grants (G1, G7), what
// lock_info reports of a lock, and scans of a partition's keys (one
// snapshot).
//
// Leases are timed: the model lets a lease run out at any point from its
// TTL after the grant's (or last renew's) call, and requires it to have run
// out once the TTL and a slack have passed since the grant's (or renew's)
// return, or, after a restart or a new leader (which may give it its full
// TTL again, or bring back one seen run out whose end was not durable),
// since the fault-free stretch began (linInput.Quiet). So a held write past the lease that
// the server accepted fails the check (G4); clients walk away from leases
// and, like a paused holder waking up, write under them once they must
// have run out.
//
// An operation whose call failed with a connection error or timed out has
// an unknown outcome: it is recorded with return time "infinity", and the
// model lets it either have been applied (at any point after its call) or
// not at all.
//
// The keys and locks fall into partitions that share no state, so porcupine
// checks each on its own:
//
//	held-a, held-b  a lock and a key written with the lock's tokens, often
//	                as held writes naming the lock (G4); acquire, renew,
//	                release, and leases left to expire
//	fenced          two keys written with tokens the clients pick from a
//	                small window that rises over time, strict or not (G2)
//	plain           one key written without tokens (G3's unfenced use)
//
// Revisions are store-wide, so a partition sees gaps: the model accepts
// any revision above the highest it has seen in the partition, and requires
// reads to report exactly the revision of the key's last write.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

type linOp uint8

const (
	linGet linOp = iota
	linPut
	linDelete
	linCAS
	linIncr
	linAcquire
	linRelease
	linRenew
	linLockInfo
	linScan // every key of a partition, by their common prefix
)

var linOpNames = [...]string{"get", "put", "delete", "cas", "incr", "acquire", "release", "renew", "lock_info", "scan"}

func (o linOp) String() string { return linOpNames[o] }

// linPart is a partition of the workload: keys and at most one lock.
type linPart struct {
	name string
	keys []string // at most linMaxKeys
	lock string   // "" for none
	// tokens says how writes pick tokens: "lock" (from the partition's
	// grants), "window" (a small window rising with time) or "none".
	tokens string
}

const linMaxKeys = 2

// linScanPart is the partition the workload scans: the one with more than
// one key.
const linScanPart = 2

var linParts = []linPart{
	{name: "held-a", keys: []string{"lin/a"}, lock: "lin/lock-a", tokens: "lock"},
	{name: "held-b", keys: []string{"lin/b"}, lock: "lin/lock-b", tokens: "lock"},
	{name: "fenced", keys: []string{"lin/f0", "lin/f1"}, tokens: "window"},
	{name: "plain", keys: []string{"lin/u"}, tokens: "none"},
}

// linTTL is the lease every acquire asks for. Short, so that abandoned and
// unreleased leases expire during the run.
const linTTL = time.Second

// linInfinity is the return time of an operation with an unknown outcome.
const linInfinity = math.MaxInt64

// linInput is an operation as the client issued it. Call and Return repeat
// the operation's times: the model needs them to tell whether a lease
// could have expired (it cannot before grant call + TTL).
type linInput struct {
	Op     linOp
	Part   int
	Key    int // index into the partition's keys
	Value  string
	Delta  int64
	Rev    uint64 // cas: expected revision
	Token  uint64
	Strict bool
	Held   bool  // the write names the partition's lock
	Wait   int64 // acquire: ms to queue
	Delay  int64 // acquire: the lease's lock-delay, in ms
	Call   int64
	Return int64
	// Quiet is when the fault-free stretch of the run that holds the
	// whole operation (call to return) began, or -1 if a fault (or what
	// may follow one: a restart, a new leader, both of which give every
	// lease its full TTL again) overlaps it. Set once the run is over
	// (markQuiet).
	Quiet int64
}

// linOutput is what the server answered. Unknown: no answer (connection
// error or timeout).
type linOutput struct {
	Unknown bool
	Err     string // refusal code; "" on success
	Fact    uint64 // stale_token: fence; compare_failed: revision
	Found   bool
	Value   string
	Fence   uint64
	Rev     uint64
	Deleted bool
	N       int64               // incr
	Token   uint64              // acquire; lock_info: the holder's (or the last grant's)
	Held    bool                // lock_info
	Left    bool                // lock_info: lease time left (TTL > 0)
	Items   [linMaxKeys]linItem // scan: the partition's keys, in its order (Found false: not listed)
}

// linItem is a key as a scan listed it.
type linItem struct {
	Found bool
	Value string
	Fence uint64
	Rev   uint64
}

// linKey is the model of a key. Rev is exact when RevKnown; otherwise the
// key's last write had an unknown outcome and Rev is a lower bound.
type linKey struct {
	Found    bool
	Value    string
	Fence    uint64
	Rev      uint64
	RevKnown bool
}

// linLock is the model of a lock.
type linLock struct {
	Present bool   // a lease record exists: held, or expired and kept
	Token   uint64 // the record's token; 0 if granted by an acquire with an unknown outcome
	Since   int64  // the lease's deadline is at least Since + linTTL (renewals and restarts only extend it)
	Until   int64  // the last grant or renew returned by then (linInfinity: unknown); see worlds
	Expired bool   // an observation showed the lease ran out
	At      int64  // the Quiet of the operation that first saw it run out
	Over    bool   // its end is durable: a lock_info reported it free
	Last    uint64 // a lower bound of the highest token granted on this lock
	Delay   int64  // the lease's lock-delay (ns): once it ran out, nobody gets the lock until Delay after its deadline
}

// linState is the model state of one partition.
type linState struct {
	Keys   [linMaxKeys]linKey
	Lock   linLock
	MaxRev uint64 // a lower bound of the highest revision written in the partition
}

func linInit() linState {
	var s linState
	for i := range s.Keys {
		s.Keys[i].RevKnown = true
	}
	return s
}

// worlds returns the states the lock may be in for op in: if the lease may
// have run out by the time op returned, both "still live" and "expired";
// if it must have run out before op was called, only "expired" (G4: a held
// write past the lease is refused). A lease seen run out may come back if
// a restart or a new leader came between, while its end was not durable
// (G7 gives every live lease its full TTL again then).
//
// When op lies in a stretch free of faults (in.Quiet >= 0), the lease's
// deadline is at most linTTL after the later of the last grant's or
// renew's return and the stretch's start (a restart or new leader, which
// may have given it its full TTL again, came before that start): if op
// was called more than linTTL (and linExpirySlack) after that, the lease
// must have run out.
func (s linState) worlds(in linInput) []linState {
	lockOp := in.Held || in.Op >= linAcquire && in.Op != linScan
	l := s.Lock
	if !lockOp || !l.Present {
		return []linState{s}
	}
	ranOut := linRanOut(l.Until, in)
	if l.Expired {
		if l.Over || in.Quiet == l.At || ranOut {
			return []linState{s}
		}
		r := s
		r.Lock.Expired = false
		return []linState{s, r}
	}
	if in.Return < l.Since+int64(linTTL) {
		return []linState{s}
	}
	e := s
	e.Lock.Expired, e.Lock.At = true, in.Quiet
	if ranOut {
		return []linState{e}
	}
	return []linState{s, e}
}

// lockInfo checks a lock_info answer. A live lease is reported held by its
// token (with time left, or none if its deadline passed and its expiry is
// not applied yet); one that ran out, free, or still held with no time
// left (an expiry not applied yet, answered without waiting for it); a
// lock never granted or released, free. Free means the lease is over for
// good: no restart or new leader may bring it back (G7).
func (w linState) lockInfo(out linOutput) (linState, bool) {
	if out.Unknown {
		return w, true
	}
	if out.Err != "" {
		return w, false
	}
	l := w.Lock
	switch {
	case !l.Present:
		return w, !out.Held
	case l.Expired && !out.Held:
		w.Lock.Over = true
		return w, true
	case l.Expired:
		return w, !out.Left && (l.Token == 0 || out.Token == l.Token)
	case !out.Held:
		return w, false
	case l.Token != 0:
		return w, out.Token == l.Token
	case out.Token < l.Last:
		return w, false
	}
	// The acquire whose outcome was unknown was applied: its token is
	// learnt.
	w.Lock.Token, w.Lock.Last = out.Token, out.Token
	return w, true
}

// scan checks a scan of the partition's keys: one snapshot in which each
// live key is listed with its value, fence and revision, and no deleted
// or absent key is.
func (w linState) scan(out linOutput) (linState, bool) {
	if out.Unknown {
		return w, true
	}
	if out.Err != "" {
		return w, false
	}
	for i, k := range w.Keys {
		it := out.Items[i]
		if it.Found != k.Found {
			return w, false
		}
		if !k.Found {
			continue
		}
		if it.Value != k.Value || it.Fence != k.Fence {
			return w, false
		}
		var ok bool
		if w, ok = w.learnRev(i, it.Rev); !ok {
			return w, false
		}
	}
	return w, true
}

// linRanOut reports whether a lease last granted or renewed by until must
// have run out by in's call (see worlds).
func linRanOut(until int64, in linInput) bool {
	return in.Quiet >= 0 && max(until, in.Quiet) < in.Call-int64(linTTL+linExpirySlack)
}

// linExpirySlack is how long past Until + linTTL the model still lets a
// lease live: the server's clock is this machine's, and its lease starts
// no later than the grant's return, so no slack is needed in principle;
// this one keeps the check from resting on that to the millisecond.
const linExpirySlack = 200 * time.Millisecond

// linStep is the nondeterministic step: every state the partition can be
// in after in with outcome out.
func linStep(s linState, in linInput, out linOutput) []linState {
	var next []linState
	if out.Unknown {
		next = append(next, s) // never applied
	}
	for _, w := range s.worlds(in) {
		if ns, ok := w.apply(in, out); ok {
			next = append(next, ns)
		}
	}
	return next
}

// refusal reports whether out is the refusal code with the fact (if
// checkFact); an unknown outcome may always have been refused, which
// changes nothing.
func refusal(out linOutput, code fencekv.Code, fact uint64, checkFact bool) bool {
	if out.Unknown {
		return true
	}
	return out.Err == string(code) && (!checkFact || out.Fact == fact)
}

// apply is the state machine of fencekv, restricted to one partition, for
// one world. With a known outcome it reports whether out is what the
// server must answer; with an unknown one, it gives the state if the
// operation was applied (a refusal leaves w as it was).
func (w linState) apply(in linInput, out linOutput) (linState, bool) {
	ok := out.Unknown || out.Err == ""
	switch in.Op {
	case linAcquire:
		l := w.Lock
		if l.Present && !l.Expired {
			return w, refusal(out, fencekv.CodeLockHeld, 0, false)
		}
		// A lease that ran out with a lock-delay keeps the lock from
		// everyone until the delay after its deadline, which is at least
		// Since + linTTL: the delay may be running (a refusal is
		// allowed), and a grant that returned before Since + linTTL +
		// Delay came inside it for certain. Restarts and new leaders
		// only move the deadline later.
		delayed := l.Present && l.Expired && l.Delay > 0
		if delayed && !out.Unknown && out.Err == string(fencekv.CodeLockHeld) {
			return w, true
		}
		if !ok {
			return w, false
		}
		if delayed && in.Return < l.Since+int64(linTTL)+l.Delay {
			return w, false
		}
		delay := in.Delay * int64(time.Millisecond)
		tok := out.Token
		if out.Unknown {
			tok = 0
			w.Lock = linLock{Present: true, Since: in.Call, Until: linInfinity, Last: l.Last + 1, Delay: delay}
			return w, true
		}
		if tok <= l.Last {
			return w, false // G1: tokens strictly increase
		}
		w.Lock = linLock{Present: true, Token: tok, Since: in.Call, Until: in.Return, Last: tok, Delay: delay}
		return w, true
	case linRelease, linRenew:
		l := w.Lock
		switch {
		case !l.Present || l.Token == 0 || l.Token != in.Token:
			return w, refusal(out, fencekv.CodeNotHolder, 0, false)
		case l.Expired:
			return w, refusal(out, fencekv.CodeLeaseExpired, 0, false)
		case !ok:
			return w, false
		case in.Op == linRelease:
			w.Lock = linLock{Last: l.Last}
		default:
			// A renew with an unknown outcome may have been applied at
			// any time after its call: Until becomes linInfinity.
			w.Lock.Since = max(l.Since, in.Call)
			w.Lock.Until = max(l.Until, in.Return)
		}
		return w, true
	case linLockInfo:
		return w.lockInfo(out)
	case linScan:
		return w.scan(out)
	}

	k := w.Keys[in.Key]
	if in.Op == linGet {
		if out.Unknown {
			return w, true
		}
		if out.Err != "" || out.Found != k.Found || out.Fence != k.Fence {
			return w, false
		}
		if !k.Found {
			return w, out.Rev == 0
		}
		if out.Value != k.Value {
			return w, false
		}
		return w.learnRev(in.Key, out.Rev)
	}

	// A write: lock check (G4), then the fence (G2, G3), then the op's own
	// condition, as wire/PROTOCOL.md §4.1 orders the refusals.
	if in.Held {
		l := w.Lock
		switch {
		case !l.Present || l.Token == 0 || l.Token != in.Token:
			return w, refusal(out, fencekv.CodeNotHolder, 0, false)
		case l.Expired:
			return w, refusal(out, fencekv.CodeLeaseExpired, 0, false)
		}
	}
	if (in.Strict && in.Token <= k.Fence) || in.Token < k.Fence {
		return w, refusal(out, fencekv.CodeStaleToken, k.Fence, true)
	}
	fence := max(k.Fence, in.Token)
	switch in.Op {
	case linPut:
		if !ok {
			return w, false
		}
		return w.written(in.Key, linKey{Found: true, Value: in.Value, Fence: fence}, out)
	case linCAS:
		cur, exact := k.Rev, k.RevKnown
		if !k.Found {
			cur, exact = 0, true
		}
		switch {
		case out.Unknown && (exact && cur != in.Rev || !exact && in.Rev < cur):
			return w, true // refused: compare_failed
		case out.Unknown:
		case out.Err == string(fencekv.CodeCompareFailed):
			if out.Fact == in.Rev {
				return w, false
			}
			if exact {
				return w, out.Fact == cur
			}
			return w.learnRev(in.Key, out.Fact)
		case out.Err != "":
			return w, false
		case exact && cur != in.Rev || !exact && in.Rev < cur:
			return w, false
		}
		return w.written(in.Key, linKey{Found: true, Value: in.Value, Fence: fence}, out)
	case linIncr:
		var n int64
		if k.Found {
			var err error
			if n, err = strconv.ParseInt(k.Value, 10, 64); err != nil {
				return w, refusal(out, fencekv.CodeNotInteger, 0, false)
			}
		}
		n += in.Delta
		if !ok || !out.Unknown && out.N != n {
			return w, false
		}
		return w.written(in.Key, linKey{Found: true, Value: strconv.FormatInt(n, 10), Fence: fence}, out)
	case linDelete:
		if !ok {
			return w, false
		}
		if !k.Found && in.Token == 0 {
			// Changes no key, but advances the store's revision.
			if !out.Unknown && out.Deleted {
				return w, false
			}
			return w.written(in.Key, k, out)
		}
		if !out.Unknown && out.Deleted != k.Found {
			return w, false
		}
		return w.written(in.Key, linKey{Fence: fence, RevKnown: true}, out)
	}
	return w, false
}

// learnRev takes rev as key i's revision, reported by a read or a
// compare_failed: it must be the known one, or (after a write with an
// unknown outcome) at least its lower bound.
func (w linState) learnRev(i int, rev uint64) (linState, bool) {
	k := w.Keys[i]
	if k.RevKnown {
		return w, rev == k.Rev
	}
	if rev < k.Rev {
		return w, false
	}
	w.Keys[i].Rev, w.Keys[i].RevKnown = rev, true
	w.MaxRev = max(w.MaxRev, rev)
	return w, true
}

// written applies an accepted write that leaves key i as nk (Rev aside):
// the answer must carry nk's fence and a revision above every revision
// written in the partition before.
func (w linState) written(i int, nk linKey, out linOutput) (linState, bool) {
	if out.Unknown {
		w.MaxRev++
		if nk.Found {
			nk.Rev, nk.RevKnown = w.MaxRev, false
		}
		w.Keys[i] = nk
		return w, true
	}
	if out.Fence != nk.Fence || out.Rev <= w.MaxRev {
		return w, false
	}
	w.MaxRev = out.Rev
	if nk.Found {
		nk.Rev, nk.RevKnown = out.Rev, true
	}
	w.Keys[i] = nk
	return w, true
}

var linHashSeed = maphash.MakeSeed()

func linModel() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			parts := make([][]porcupine.Operation, len(linParts))
			for _, op := range history {
				p := op.Input.(linInput).Part
				parts[p] = append(parts[p], op)
			}
			nonEmpty := parts[:0]
			for _, p := range parts {
				if len(p) > 0 {
					nonEmpty = append(nonEmpty, p)
				}
			}
			return nonEmpty
		},
		Init: func() []any { return []any{linInit()} },
		Step: func(state, input, output any) []any {
			next := linStep(state.(linState), input.(linInput), output.(linOutput))
			states := make([]any, len(next))
			for i, s := range next {
				states[i] = s
			}
			return states
		},
		Hash:              func(state any) uint64 { return maphash.Comparable(linHashSeed, state.(linState)) },
		DescribeOperation: func(input, output any) string { return linDescribe(input.(linInput), output.(linOutput)) },
		DescribeState:     func(state any) string { return state.(linState).String() },
	}
	return m.ToModel()
}

func linDescribe(in linInput, out linOutput) string {
	p := linParts[in.Part]
	var b strings.Builder
	switch in.Op {
	case linAcquire:
		fmt.Fprintf(&b, "acquire %s", p.lock)
		if in.Wait > 0 {
			fmt.Fprintf(&b, " wait=%dms", in.Wait)
		}
		if in.Delay > 0 {
			fmt.Fprintf(&b, " lock-delay=%dms", in.Delay)
		}
	case linRelease, linRenew:
		fmt.Fprintf(&b, "%s %s tok=%d", in.Op, p.lock, in.Token)
	case linLockInfo:
		fmt.Fprintf(&b, "lock_info %s", p.lock)
	case linScan:
		fmt.Fprintf(&b, "scan %s", p.prefix())
	default:
		fmt.Fprintf(&b, "%s %s", in.Op, p.keys[in.Key])
		switch in.Op {
		case linPut:
			fmt.Fprintf(&b, " =%s", in.Value)
		case linCAS:
			fmt.Fprintf(&b, " rev=%d =%s", in.Rev, in.Value)
		case linIncr:
			fmt.Fprintf(&b, " %+d", in.Delta)
		}
		if in.Op != linGet {
			fmt.Fprintf(&b, " tok=%d", in.Token)
		}
		if in.Strict {
			b.WriteString(" strict")
		}
		if in.Held {
			fmt.Fprintf(&b, " lock=%s", p.lock)
		}
	}
	b.WriteString(" -> ")
	switch {
	case out.Unknown:
		b.WriteString("unknown")
	case out.Err != "":
		b.WriteString(out.Err)
		if out.Fact != 0 {
			fmt.Fprintf(&b, "(%d)", out.Fact)
		}
	case in.Op == linGet && !out.Found:
		fmt.Fprintf(&b, "not found fence=%d", out.Fence)
	case in.Op == linGet:
		fmt.Fprintf(&b, "%s fence=%d rev=%d", out.Value, out.Fence, out.Rev)
	case in.Op == linAcquire:
		fmt.Fprintf(&b, "token %d", out.Token)
	case in.Op == linLockInfo && !out.Held:
		fmt.Fprintf(&b, "free (last token %d)", out.Token)
	case in.Op == linLockInfo:
		fmt.Fprintf(&b, "held by %d, time left: %v", out.Token, out.Left)
	case in.Op == linScan:
		for i, it := range out.Items[:len(p.keys)] {
			if it.Found {
				fmt.Fprintf(&b, "%s=%s fence=%d rev=%d ", p.keys[i], it.Value, it.Fence, it.Rev)
			}
		}
		fmt.Fprintf(&b, "(%d listed)", linListed(out))
	case in.Op == linRelease || in.Op == linRenew:
		b.WriteString("ok")
	default:
		if in.Op == linIncr {
			fmt.Fprintf(&b, "%d ", out.N)
		}
		if in.Op == linDelete {
			fmt.Fprintf(&b, "deleted=%v ", out.Deleted)
		}
		fmt.Fprintf(&b, "fence=%d rev=%d", out.Fence, out.Rev)
	}
	return b.String()
}

func (s linState) String() string {
	var b strings.Builder
	for i, k := range s.Keys {
		switch {
		case !k.Found && k.Fence == 0:
			continue
		case !k.Found:
			fmt.Fprintf(&b, "k%d:absent fence=%d ", i, k.Fence)
		case k.RevKnown:
			fmt.Fprintf(&b, "k%d:%s fence=%d rev=%d ", i, k.Value, k.Fence, k.Rev)
		default:
			fmt.Fprintf(&b, "k%d:%s fence=%d rev>=%d ", i, k.Value, k.Fence, k.Rev)
		}
	}
	l := s.Lock
	switch {
	case !l.Present:
		fmt.Fprintf(&b, "lock:free")
	case l.Token == 0:
		fmt.Fprintf(&b, "lock:held(unknown token)")
	default:
		fmt.Fprintf(&b, "lock:held(%d)", l.Token)
	}
	if l.Expired {
		b.WriteString(" expired")
	}
	if l.Present && l.Delay > 0 {
		fmt.Fprintf(&b, " lock-delay=%v", time.Duration(l.Delay))
	}
	fmt.Fprintf(&b, " last>=%d maxrev>=%d", l.Last, s.MaxRev)
	return b.String()
}

// linConfig sizes a run.
type linConfig struct {
	clients   int
	kills     int
	killAfter [2]time.Duration // run this long (at random) between restarts
	minOps    int64            // and at least this many operations
	checkTime time.Duration    // porcupine's budget
}

func TestLinearizable(t *testing.T) {
	cfg := linConfig{clients: 4, kills: 3, killAfter: [2]time.Duration{time.Second, 2500 * time.Millisecond}, minOps: 50, checkTime: 2 * time.Minute}
	if verifyLong() {
		cfg = linConfig{clients: 6, kills: 30, killAfter: [2]time.Duration{time.Second, 5 * time.Second}, minOps: 200, checkTime: 10 * time.Minute}
	} else if !testing.Short() {
		cfg.kills = 6
	}
	runLinearizable(t, cfg)
}

// linTarget is what the clients of a run talk to: one server, or a
// cluster.
type linTarget interface {
	// dial connects to a serving node (for a cluster, one chosen with
	// rng), waiting for one until ctx ends.
	dial(ctx context.Context, rng *rand.Rand) (*wire.Client, error)
}

// dial connects to the live incarnation.
func (s *serverProc) dial(ctx context.Context, _ *rand.Rand) (*wire.Client, error) {
	addr, err := s.Up(ctx)
	if err != nil {
		return nil, err
	}
	return wire.Dial(ctx, addr)
}

// linRun is one run of the linearizability test.
type linRun struct {
	t      *testing.T
	target linTarget
	// cluster: unavailable is an answer (a command not applied, or with
	// Outcome unknown one whose outcome is unknown), not an odd refusal.
	cluster bool
	start   time.Time
	ctx     context.Context // cancelled if the test fails early: clients stop waiting for a server
	cancel  context.CancelFunc
	done    atomic.Bool // clients stop issuing operations
	ops     *opCounter  // operations completed, for the kill schedule

	mu         sync.Mutex // guards history, odd, notApplied, holders
	history    []porcupine.Operation
	odd        []string          // answers that fit no refusal the workload can cause
	notApplied []string          // operations answered unavailable (not applied): left out of the history
	holders    map[uint64]string // token → the holder its grant was made for, as the answers told it
}

func (r *linRun) now() int64 { return int64(time.Since(r.start)) }

// sawHolder checks an answer's holder of token against every earlier
// answer's: a token is granted once, to one holder (G4), whose name an
// acquire's answer implies and lock_info reports. The porcupine model
// leaves holders out; this check is outside it.
func (r *linRun) sawHolder(token uint64, holder, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !strings.HasPrefix(holder, "lin client ") {
		r.odd = append(r.odd, fmt.Sprintf("%s: token %d held by %q, a name no client used", what, token, holder))
		return
	}
	if r.holders == nil {
		r.holders = map[uint64]string{}
	}
	if h, ok := r.holders[token]; ok && h != holder {
		r.odd = append(r.odd, fmt.Sprintf("%s: token %d held by %q, but it was granted to %q", what, token, holder, h))
		return
	}
	r.holders[token] = holder
}

func runLinearizable(t *testing.T, cfg linConfig) {
	seed := testSeed(t)
	srv := startServer(t, t.TempDir())
	r := &linRun{t: t, target: srv, start: time.Now(), ops: newOpCounter()}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		// On a Fatalf in this goroutine: stop the clients before the test
		// ends, so none logs after it.
		r.done.Store(true)
		r.cancel()
		wg.Wait()
	}()
	r.startClients(&wg, cfg.clients, seed)
	// The main goroutine owns the server: run, kill, restart.
	rng := rand.New(rand.NewPCG(seed, math.MaxUint64))
	var annotations []porcupine.Annotation
	for k := 0; k <= cfg.kills; k++ {
		r.ops.await(r.t, cfg.minOps, randDuration(rng, cfg.killAfter[0], cfg.killAfter[1]), "clients completed")
		if k == cfg.kills {
			break
		}
		at := r.now()
		srv.kill()
		srv.start()
		annotations = append(annotations, porcupine.Annotation{Tag: "server", Start: at, End: r.now(),
			Description: fmt.Sprintf("kill -9 #%d", k+1), BackgroundColor: "#ffb3b3"})
	}
	r.done.Store(true)
	wg.Wait()
	history := r.finish(cfg.clients, seed)
	// A restart gives every lease its full TTL again: from the kill until
	// the server is back.
	var windows [][2]int64
	for _, a := range annotations {
		windows = append(windows, [2]int64{a.Start, a.End})
	}
	markQuiet(history, windows)
	r.checkGrants(history)
	r.check(history, cfg, annotations)
}

// markQuiet sets each operation's Quiet (see linInput), given the windows
// of the run in which a lease may have been given its full TTL again.
func markQuiet(history []porcupine.Operation, windows [][2]int64) {
	for i := range history {
		in := history[i].Input.(linInput)
		in.Quiet = quietAt(windows, history[i].Call, history[i].Return)
		history[i].Input = in
	}
}

// lateHeld counts the held writes the model takes as called after their
// lease ran out for certain (see worlds): in a stretch free of faults,
// more than linTTL and linExpirySlack after the later of the stretch's
// start and the return of their token's last grant or renew. The server
// must refuse every one of them.
func lateHeld(history []porcupine.Operation) int {
	type refresh struct{ call, ret int64 }
	refreshes := map[[2]uint64][]refresh{} // by partition and token
	for _, op := range history {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if out.Err != "" {
			continue
		}
		switch {
		case in.Op == linAcquire && !out.Unknown:
			k := [2]uint64{uint64(in.Part), out.Token}
			refreshes[k] = append(refreshes[k], refresh{op.Call, op.Return})
		case in.Op == linRenew:
			k := [2]uint64{uint64(in.Part), in.Token}
			refreshes[k] = append(refreshes[k], refresh{op.Call, op.Return})
		}
	}
	n := 0
	for _, op := range history {
		in := op.Input.(linInput)
		if !in.Held {
			continue
		}
		var last refresh
		for _, f := range refreshes[[2]uint64{uint64(in.Part), in.Token}] {
			if f.call < op.Call && f.ret > last.ret {
				last = f
			}
		}
		if last.ret > 0 && linRanOut(last.ret, in) {
			n++
		}
	}
	return n
}

// quietAt returns when the stretch free of windows that holds [call, ret]
// began (0: the run's start), or -1 if a window overlaps it.
func quietAt(windows [][2]int64, call, ret int64) int64 {
	var quiet int64
	for _, w := range windows {
		switch {
		case w[0] <= ret && w[1] >= call:
			return -1
		case w[1] < call:
			quiet = max(quiet, w[1])
		}
	}
	return quiet
}

// startClients starts n clients, each with its own random source.
func (r *linRun) startClients(wg *sync.WaitGroup, n int, seed uint64) {
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &linClient{run: r, id: i, rng: rand.New(rand.NewPCG(seed, uint64(i))), lastRev: map[string]uint64{}}
			c.loop()
		}()
	}
}

// finish makes a last read of every key, on a fresh connection, which pins
// down what the operations with unknown outcomes did, reports the odd
// answers, and returns the history. The clients must have stopped.
func (r *linRun) finish(clients int, seed uint64) []porcupine.Operation {
	final := &linClient{run: r, id: clients, rng: rand.New(rand.NewPCG(seed, 1<<32))}
	for p, part := range linParts {
		for k := range part.keys {
			in := linInput{Op: linGet, Part: p, Key: k}
			// In a cluster a read may meet an election: read again until
			// one is answered.
			for range 20 {
				if final.do(context.Background(), in) {
					break
				}
			}
		}
	}
	final.close()

	r.mu.Lock()
	history, odd := r.history, r.odd
	r.mu.Unlock()
	for _, o := range odd {
		r.t.Errorf("unexpected answer: %s", o)
	}
	return history
}

func (r *linRun) check(history []porcupine.Operation, cfg linConfig, annotations []porcupine.Annotation) {
	t := r.t
	load := time.Duration(r.now())
	counts, unknownIn := map[string]int{}, map[string]int{}
	unknown := 0
	for _, op := range history {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		switch {
		case out.Unknown:
			unknown++
			counts[in.Op.String()+" unknown"]++
			unknownIn[linParts[in.Part].name]++
		case out.Err != "":
			counts[out.Err]++
		default:
			counts[in.Op.String()+" ok"]++
		}
	}
	if verifyLong() {
		// A long check can take its whole budget (it is exponential in
		// a partition's operations of unknown outcome): keep what it
		// checks, and where they were, before it starts (removed if it
		// passes, unless FENCEKV_VERIFY_ARTIFACTS names the dir).
		dir := artifactDir(t)
		path := filepath.Join(dir, "history.txt")
		r.dumpHistory(path, history)
		t.Logf("checking %d operations; unknown outcomes by partition %v; history kept in %s", len(history), unknownIn, path)
		if os.Getenv("FENCEKV_VERIFY_ARTIFACTS") == "" {
			defer func() {
				if !t.Failed() && !t.Skipped() {
					os.RemoveAll(dir)
				}
			}()
		}
	}
	model := linModel()
	began := time.Now()
	res := porcupine.CheckOperationsTimeout(model, history, cfg.checkTime)
	t.Logf("%d held writes called when their lease had run out for certain", lateHeld(history))
	t.Logf("%d operations (%d with unknown outcome), %d faults, %d clients, %v of load; checked in %v: %s",
		len(history), unknown, cfg.kills, cfg.clients, load.Round(time.Millisecond),
		time.Since(began).Round(time.Millisecond), res)
	t.Logf("outcomes: %v", counts)
	if res == porcupine.Ok {
		if os.Getenv("FENCEKV_VERIFY_DUMP") == "1" {
			path := filepath.Join(artifactDir(t), "history.txt")
			r.dumpHistory(path, history)
			t.Logf("history written to %s", path)
		}
		return
	}
	if res == porcupine.Unknown && !verifyLong() {
		// No verdict is not a violation. The search is exponential in
		// the operations of unknown outcome on a lock (each may take
		// effect at any later point), and its budget is wall time, which
		// -race (4-5x) on a busy machine eats: one legal history of the
		// short cluster run took 61 s to check alone, and 4m37s under
		// -race. make verify's long runs still fail on it.
		path := filepath.Join(artifactDir(t), "history.txt")
		r.dumpHistory(path, history)
		t.Skipf("porcupine gave no verdict within %v: the check is inconclusive, not failed (history kept in %s)", cfg.checkTime, path)
	}
	// Visualize the partition that failed. Proving a partition illegal can
	// take the checker long (it must try every order), so each step here
	// is bounded; a timed-out verbose check still shows the longest
	// linearizable prefixes it found.
	show := history
	if res == porcupine.Illegal {
		for _, part := range model.Partition(history) {
			if porcupine.CheckOperationsTimeout(model, part, time.Minute) == porcupine.Illegal {
				show = part
				t.Logf("partition %s is not linearizable", linParts[part[0].Input.(linInput).Part].name)
				break
			}
		}
	}
	_, info := porcupine.CheckOperationsVerbose(model, show, time.Minute)
	info.AddAnnotations(annotations)
	dir := artifactDir(t)
	path := filepath.Join(dir, "linearizability.html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Errorf("writing the visualization: %v", err)
	}
	r.dumpHistory(filepath.Join(dir, "history.txt"), history)
	if res == porcupine.Illegal {
		t.Fatalf("the history is not linearizable; see %s (and history.txt next to it)", path)
	}
	t.Fatalf("porcupine gave no verdict within %v (%s); see %s", cfg.checkTime, res, path)
}

func (r *linRun) dumpHistory(path string, history []porcupine.Operation) {
	h := append([]porcupine.Operation(nil), history...)
	sort.Slice(h, func(i, j int) bool { return h[i].Call < h[j].Call })
	var b strings.Builder
	for _, op := range h {
		ret := "inf"
		if op.Return != linInfinity {
			ret = strconv.FormatInt(op.Return, 10)
		}
		fmt.Fprintf(&b, "client %d [%d, %s] %s: %s\n", op.ClientId, op.Call, ret,
			linParts[op.Input.(linInput).Part].name, linDescribe(op.Input.(linInput), op.Output.(linOutput)))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		r.t.Errorf("writing the history: %v", err)
	}
	// The same as JSON, for TestLinReplay.
	ops := make([]linRecord, len(h))
	for i, op := range h {
		ops[i] = linRecord{op.ClientId, op.Input.(linInput), op.Output.(linOutput), op.Call, op.Return}
	}
	js, err := json.Marshal(ops)
	if err == nil {
		err = os.WriteFile(strings.TrimSuffix(path, ".txt")+".json", js, 0o644)
	}
	if err != nil {
		r.t.Errorf("writing the history as JSON: %v", err)
	}
}

// linRecord is an operation of a history as history.json keeps it.
type linRecord struct {
	Client       int
	Input        linInput
	Output       linOutput
	Call, Return int64
}

// TestLinReplay checks a history that a failed run left as history.json
// ($FENCEKV_VERIFY_REPLAY), and narrows an illegal partition down to the
// shortest prefix (by call time) that porcupine finds illegal, written as
// replay.html and replay.txt beside it.
func TestLinReplay(t *testing.T) {
	path := os.Getenv("FENCEKV_VERIFY_REPLAY")
	if path == "" {
		t.Skip("set FENCEKV_VERIFY_REPLAY to a history.json")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []linRecord
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatal(err)
	}
	var history []porcupine.Operation
	for _, r := range recs {
		history = append(history, porcupine.Operation{ClientId: r.Client, Input: r.Input, Output: r.Output, Call: r.Call, Return: r.Return})
	}
	model := linModel()
	if res := porcupine.CheckOperationsTimeout(model, history, 5*time.Minute); res != porcupine.Illegal {
		t.Logf("%d operations: %s", len(history), res)
		return
	}
	for _, part := range model.Partition(history) {
		if porcupine.CheckOperationsTimeout(model, part, time.Minute) != porcupine.Illegal {
			continue
		}
		sort.Slice(part, func(i, j int) bool { return part[i].Call < part[j].Call })
		lo, hi := 1, len(part) // part[:hi] is illegal
		for lo < hi {
			mid := (lo + hi) / 2
			if porcupine.CheckOperationsTimeout(model, part[:mid], time.Minute) == porcupine.Illegal {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		short := part[:hi]
		_, info := porcupine.CheckOperationsVerbose(model, short, time.Minute)
		dir := filepath.Dir(path)
		if err := porcupine.VisualizePath(model, info, filepath.Join(dir, "replay.html")); err != nil {
			t.Error(err)
		}
		r := &linRun{t: t}
		r.dumpHistory(filepath.Join(dir, "replay.txt"), short)
		last := short[len(short)-1]
		t.Fatalf("partition %s: illegal from its first %d operations; the last: client %d [%d, %d] %s (see replay.txt)",
			linParts[last.Input.(linInput).Part].name, len(short), last.ClientId, last.Call, last.Return,
			linDescribe(last.Input.(linInput), last.Output.(linOutput)))
	}
}

// checkGrants checks G1 across locks, which the per-partition model cannot
// see (see checkGrantOrder).
func (r *linRun) checkGrants(history []porcupine.Operation) {
	var grants []grantRec
	for _, op := range history {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if in.Op == linAcquire && !out.Unknown && out.Err == "" {
			grants = append(grants, grantRec{lock: linParts[in.Part].lock, token: out.Token, call: op.Call, ret: op.Return})
		}
	}
	checkGrantOrder(r.t, grants)
}

// linOpTimeout bounds one call; a call that times out has an unknown
// outcome. It is far above any answer time of a healthy server, so that
// timeouts come only from kills.
const linOpTimeout = 20 * time.Second

// linClient issues random operations one at a time on its own connection,
// reconnecting after the connection breaks.
type linClient struct {
	run *linRun
	id  int
	rng *rand.Rand
	c   *wire.Client

	// What this client has seen, to make plausible requests.
	lastRev map[string]uint64
	grants  [][]uint64 // per partition: tokens this client was granted
	holding int        // partition whose lock this client holds, or -1
	token   uint64     // the held lock's token
	// A lock this client walked away from without releasing it, and keeps
	// writing under like a paused holder that woke up: -1 for none.
	zombie      int
	zombieToken uint64
	// When the client, as if paused, wakes up to write under the lease it
	// walked away from, after the lease must have run out (G4); 0: not
	// paused.
	wakeAt int64
}

func (c *linClient) loop() {
	c.grants = make([][]uint64, len(linParts))
	c.holding, c.zombie = -1, -1
	defer c.close()
	for !c.run.done.Load() {
		c.do(c.run.ctx, c.pick())
	}
}

func (c *linClient) close() {
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
}

// connect dials the live incarnation; it reports false if the test is
// ending or the server could not be reached.
func (c *linClient) connect(ctx context.Context) bool {
	for c.c == nil {
		ctx, cancel := context.WithTimeout(ctx, startTimeout)
		var err error
		c.c, err = c.run.target.dial(ctx, c.rng)
		cancel()
		if err != nil && c.run.done.Load() {
			return false
		}
		if err != nil && errors.Is(err, context.DeadlineExceeded) {
			c.run.t.Errorf("client %d: no server to connect to: %v", c.id, err)
			return false
		}
		// A dial refused by an incarnation that just died: Up waits for the
		// next one.
	}
	return true
}

// prefix is what the partition's keys, and no other key of the workload,
// start with: a scan's.
func (p linPart) prefix() string {
	pre := p.keys[0]
	for _, k := range p.keys[1:] {
		for !strings.HasPrefix(k, pre) {
			pre = pre[:len(pre)-1]
		}
	}
	return pre
}

// linScanned puts the items of a scan of part in their places. The scan
// asked for more items than the partition has keys, so more must be
// false, and its items come in key order.
func linScanned(part linPart, items []fencekv.Entry, more bool) (linOutput, error) {
	var out linOutput
	odd := func(format string, args ...any) error {
		// An answer the workload cannot cause: reported as odd.
		return &fencekv.Error{Code: fencekv.CodeInternal, Message: fmt.Sprintf("scan of %q: ", part.prefix()) + fmt.Sprintf(format, args...)}
	}
	if more {
		return out, odd("more items with %d listed, of at most %d", len(items), len(part.keys))
	}
	for j, e := range items {
		i := slices.Index(part.keys, string(e.Key))
		if i < 0 || out.Items[i].Found {
			return out, odd("listed %q", e.Key)
		}
		if j > 0 && string(items[j-1].Key) >= string(e.Key) {
			return out, odd("listed %q after %q", e.Key, items[j-1].Key)
		}
		out.Items[i] = linItem{Found: true, Value: string(e.Value), Fence: uint64(e.Fence), Rev: uint64(e.Revision)}
	}
	return out, nil
}

// pick chooses the next operation.
func (c *linClient) pick() linInput {
	r := c.rng
	if c.holding >= 0 {
		p := c.holding
		switch x := r.IntN(100); {
		case x < 15:
			return linInput{Op: linRelease, Part: p, Token: c.token}
		case x < 20:
			return linInput{Op: linRenew, Part: p, Token: c.token}
		case x < 25:
			// Walk away: let the lease expire, and write under it later;
			// as a paused holder does, at once on waking up past the
			// lease's end: always on lock b, whose expired leases stay
			// unclaimed for a while, half the time on lock a.
			c.zombie, c.zombieToken = c.holding, c.token
			c.holding = -1
			if p == 1 || r.IntN(2) == 0 {
				c.wakeAt = c.run.now() + int64(linTTL+linExpirySlack) + r.Int64N(int64(400*time.Millisecond))
			}
		case x < 80:
			in := c.write(p)
			if in.Op != linGet && r.IntN(4) > 0 {
				in.Token, in.Held = c.token, true
				in.Strict = r.IntN(4) == 0
			}
			return in
		default:
			return c.write(p)
		}
	}
	if c.wakeAt > 0 {
		// The pause is the workload's, not a wait for the server.
		select {
		case <-time.After(time.Duration(c.wakeAt - c.run.now())):
		case <-c.run.ctx.Done():
		}
		c.wakeAt = 0
		for {
			if in := c.write(c.zombie); in.Op != linGet {
				in.Token, in.Held, in.Strict = c.zombieToken, true, false
				return in
			}
		}
	}
	if c.zombie >= 0 && r.IntN(4) == 0 {
		in := c.write(c.zombie)
		if in.Op != linGet {
			in.Token, in.Held, in.Strict = c.zombieToken, true, false
		}
		return in
	}
	switch x := r.IntN(100); {
	case x < 4:
		return linInput{Op: linLockInfo, Part: r.IntN(2)}
	case x < 8:
		return linInput{Op: linScan, Part: linScanPart}
	}
	if r.IntN(100) < 10 {
		// Lock a sees queued acquires (hand-off on release and expiry);
		// lock b only immediate ones, so an expired lease often stays
		// unclaimed for a while and its late holder hears lease_expired.
		p := 0
		if r.IntN(100) < 15 {
			p = 1
		}
		in := linInput{Op: linAcquire, Part: p}
		if p == 0 && r.IntN(2) == 0 {
			in.Wait = 50 + r.Int64N(250)
		}
		if r.IntN(100) < 50 {
			// A lock-delay, kept only if the lease runs out (not on a
			// release).
			in.Delay = 200 + r.Int64N(500)
		}
		return in
	}
	return c.write(r.IntN(len(linParts)))
}

// write picks a key operation on partition p, with a token the way the
// partition picks them.
func (c *linClient) write(p int) linInput {
	r := c.rng
	part := linParts[p]
	in := linInput{Part: p, Key: r.IntN(len(part.keys))}
	key := part.keys[in.Key]
	switch x := r.IntN(100); {
	case x < 30:
		in.Op = linGet
		return in
	case x < 55:
		in.Op = linPut
	case x < 70:
		in.Op = linCAS
		switch r.IntN(5) {
		case 0:
			in.Rev = 0
		case 1:
			in.Rev = c.lastRev[key] + 1
		default:
			in.Rev = c.lastRev[key]
		}
	case x < 90:
		in.Op = linIncr
		in.Delta = r.Int64N(7) - 2
	default:
		in.Op = linDelete
	}
	if in.Op == linPut || in.Op == linCAS {
		in.Value = strconv.Itoa(c.id*10_000_000 + r.IntN(10_000_000))
		if part.tokens == "window" && r.IntN(20) == 0 {
			in.Value = "x" + in.Value // incr on it: not_integer
		}
	}
	switch part.tokens {
	case "lock":
		// One of this client's recent grants, most likely released or
		// expired by now: half the time as a held write naming the lock,
		// which must be refused (not_holder, lease_expired) unless the
		// lease is still live (G4).
		if g := c.grants[p]; len(g) > 0 && r.IntN(5) > 0 {
			in.Token = g[len(g)-1-r.IntN(min(len(g), 3))]
			in.Held = in.Op != linGet && r.IntN(2) == 0
		}
	case "window":
		// A window of tokens that rises every 300ms: most writes are
		// accepted, a good share are stale.
		base := 1 + uint64(c.run.now()/int64(300*time.Millisecond))
		if r.IntN(6) > 0 {
			in.Token = base - 1 + uint64(r.IntN(3))
		}
	}
	if in.Token > 0 && r.IntN(4) == 0 {
		in.Strict = true
	}
	return in
}

// do runs in against the server and records it. It reports whether it
// got an answer: not if no server could be reached, if a cluster answered
// unavailable (not applied; then nothing is recorded), or if the outcome
// is unknown.
func (c *linClient) do(ctx context.Context, in linInput) bool {
	if !c.connect(ctx) {
		return false
	}
	part := linParts[in.Part]
	var key []byte
	if in.Op < linAcquire {
		key = []byte(part.keys[in.Key])
	}
	w := fencekv.WriteOptions{Token: fencekv.Token(in.Token), Strict: in.Strict}
	if in.Held {
		w.Lock = part.lock
	}
	var out linOutput
	var err error
	cctx, cancel := context.WithTimeout(ctx, linOpTimeout)
	in.Call = c.run.now()
	switch in.Op {
	case linGet:
		var e fencekv.Entry
		e, err = c.c.Get(cctx, key)
		out = linOutput{Found: e.Found, Value: string(e.Value), Fence: uint64(e.Fence), Rev: uint64(e.Revision)}
	case linPut:
		var res fencekv.WriteResult
		res, err = c.c.Put(cctx, key, []byte(in.Value), w)
		out = linOutput{Fence: uint64(res.Fence), Rev: uint64(res.Revision)}
	case linCAS:
		var res fencekv.WriteResult
		res, err = c.c.CAS(cctx, key, fencekv.Revision(in.Rev), []byte(in.Value), w)
		out = linOutput{Fence: uint64(res.Fence), Rev: uint64(res.Revision)}
	case linIncr:
		var res fencekv.WriteResult
		var n int64
		n, res, err = c.c.Incr(cctx, key, in.Delta, w)
		out = linOutput{N: n, Fence: uint64(res.Fence), Rev: uint64(res.Revision)}
	case linDelete:
		var res fencekv.WriteResult
		var deleted bool
		deleted, res, err = c.c.Delete(cctx, key, w)
		out = linOutput{Deleted: deleted, Fence: uint64(res.Fence), Rev: uint64(res.Revision)}
	case linAcquire:
		var l fencekv.Lease
		holder := fmt.Sprintf("lin client %d", c.id)
		l, err = c.c.Acquire(cctx, part.lock, linTTL, &fencekv.AcquireOptions{
			Holder: holder, Wait: time.Duration(in.Wait) * time.Millisecond, LockDelay: time.Duration(in.Delay) * time.Millisecond})
		out = linOutput{Token: uint64(l.Token)}
		if err == nil {
			c.run.sawHolder(out.Token, holder, "acquire of "+part.lock)
		}
	case linRelease:
		err = c.c.Release(cctx, part.lock, fencekv.Token(in.Token))
	case linRenew:
		_, err = c.c.Renew(cctx, part.lock, fencekv.Token(in.Token))
	case linLockInfo:
		var li fencekv.LockInfo
		li, err = c.c.LockInfo(cctx, part.lock)
		out = linOutput{Held: li.Held, Token: uint64(li.Token), Left: li.TTL > 0}
		if err == nil && li.Held {
			c.run.sawHolder(out.Token, li.Holder, "lock_info of "+part.lock)
		}
	case linScan:
		var items []fencekv.Entry
		var more bool
		items, more, err = c.c.Scan(cctx, fencekv.ScanOptions{Prefix: []byte(part.prefix())})
		if err == nil {
			out, err = linScanned(part, items, more)
		}
	}
	ret := c.run.now()
	cancel()

	var fe *fencekv.Error
	switch {
	case err == nil:
	case c.run.cluster && errors.As(err, &fe) && fe.Code == fencekv.CodeUnavailable && fe.Outcome != fencekv.OutcomeUnknown:
		// Not applied: as if never sent. Its value appears in no other
		// operation, so a read that saw it would fail the check. The node
		// may be cut off: try another.
		c.learn(in, linOutput{Unknown: true})
		c.close()
		c.run.mu.Lock()
		c.run.notApplied = append(c.run.notApplied, fmt.Sprintf("client %d [%d, %d] %s: %s (%v)", c.id, in.Call, ret,
			part.name, linDescribe(in, linOutput{Unknown: true}), err))
		c.run.mu.Unlock()
		c.run.ops.done()
		return false
	case c.run.cluster && errors.As(err, &fe) && fe.Code == fencekv.CodeUnavailable:
		// Outcome unknown: applied or not, at any time after the call.
		out, ret = linOutput{Unknown: true}, linInfinity
		c.close()
	case errors.As(err, &fe) && linExpected(in, fe.Code):
		out = linOutput{Err: string(fe.Code)}
		switch fe.Code {
		case fencekv.CodeStaleToken:
			out.Fact = uint64(fe.Fence)
		case fencekv.CodeCompareFailed:
			out.Fact = uint64(fe.Revision)
		}
	case errors.As(err, &fe):
		// A refusal this workload cannot cause: report it; the model
		// treats it as an unknown outcome so that the check still runs.
		c.run.mu.Lock()
		c.run.odd = append(c.run.odd, fmt.Sprintf("client %d: %s: %v", c.id, linDescribe(in, linOutput{Unknown: true}), err))
		c.run.mu.Unlock()
		out, ret = linOutput{Unknown: true}, linInfinity
	default:
		// The connection broke or the call timed out: the outcome is
		// unknown. A broken connection is replaced; a timed-out call's
		// connection is kept, since closing it could make the server drop
		// a queued acquire's grant on our behalf.
		out, ret = linOutput{Unknown: true}, linInfinity
		if !errors.Is(err, context.DeadlineExceeded) {
			c.close()
		}
	}
	in.Return = ret
	c.learn(in, out)

	c.run.mu.Lock()
	c.run.history = append(c.run.history, porcupine.Operation{ClientId: c.id, Input: in, Call: in.Call, Output: out, Return: ret})
	c.run.mu.Unlock()
	c.run.ops.done()
	return !out.Unknown
}

func linListed(out linOutput) int {
	n := 0
	for _, it := range out.Items {
		if it.Found {
			n++
		}
	}
	return n
}

// linExpected reports whether code is a refusal the workload can cause for
// in.
func linExpected(in linInput, code fencekv.Code) bool {
	write := in.Op != linGet && in.Op < linAcquire
	switch code {
	case fencekv.CodeStaleToken:
		return write
	case fencekv.CodeNotHolder, fencekv.CodeLeaseExpired:
		return write && in.Held || in.Op == linRelease || in.Op == linRenew
	case fencekv.CodeCompareFailed:
		return in.Op == linCAS
	case fencekv.CodeNotInteger:
		return in.Op == linIncr
	case fencekv.CodeLockHeld:
		return in.Op == linAcquire
	}
	return false
}

// learn updates what the client knows after an answer.
func (c *linClient) learn(in linInput, out linOutput) {
	if out.Unknown || in.Part >= len(c.grants) {
		if in.Op == linRelease && in.Part == c.holding {
			c.holding = -1
		}
		return
	}
	if in.Held && in.Part == c.zombie && out.Err == string(fencekv.CodeNotHolder) {
		c.zombie = -1 // someone else has the lock now
	}
	if in.Op < linAcquire {
		key := linParts[in.Part].keys[in.Key]
		switch {
		case out.Err == "" && in.Op != linDelete:
			c.lastRev[key] = out.Rev
		case out.Err == string(fencekv.CodeCompareFailed):
			c.lastRev[key] = out.Fact
		}
		return
	}
	switch {
	case in.Op == linAcquire && out.Err == "":
		c.grants[in.Part] = append(c.grants[in.Part], out.Token)
		c.holding, c.token = in.Part, out.Token
	case in.Op == linRelease, in.Op == linRenew && out.Err != "":
		c.holding = -1
	}
}

// TestLinScanned: a scan's answer that lists keys out of order, a key
// twice or outside the partition, or says more are left, is an odd
// answer; a right one puts each item in its key's place.
func TestLinScanned(t *testing.T) {
	part := linPart{name: "p", keys: []string{"lin/s/a", "lin/s/b"}}
	e := func(k string) fencekv.Entry {
		return fencekv.Entry{Key: []byte(k), Value: []byte("v" + k), Found: true, Fence: 3, Revision: 7}
	}
	out, err := linScanned(part, []fencekv.Entry{e("lin/s/a"), e("lin/s/b")}, false)
	if err != nil || !out.Items[0].Found || out.Items[1].Value != "vlin/s/b" || out.Items[1].Fence != 3 || out.Items[1].Rev != 7 {
		t.Fatalf("in order: %+v, %v", out, err)
	}
	if out, err := linScanned(part, nil, false); err != nil || out.Items[0].Found || out.Items[1].Found {
		t.Fatalf("empty: %+v, %v", out, err)
	}
	for name, tc := range map[string]struct {
		items []fencekv.Entry
		more  bool
	}{
		"out of order": {items: []fencekv.Entry{e("lin/s/b"), e("lin/s/a")}},
		"twice":        {items: []fencekv.Entry{e("lin/s/a"), e("lin/s/a")}},
		"outside":      {items: []fencekv.Entry{e("lin/s/c")}},
		"more":         {items: []fencekv.Entry{e("lin/s/a")}, more: true},
	} {
		var fe *fencekv.Error
		if _, err := linScanned(part, tc.items, tc.more); !errors.As(err, &fe) || fe.Code != fencekv.CodeInternal {
			t.Errorf("%s: %v; want an odd answer", name, err)
		}
	}
}
