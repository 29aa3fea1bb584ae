package fencekv

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fencekv/fencekv/state"
)

// The refusal log: every fenced write the store refused (stale_token,
// not_holder, lease_expired) is remembered, in a bounded ring, with what is
// needed to see what happened: when, which key (and lock), the token the
// writer presented, the fence or the current holder's token that beat it,
// the lock and holder name that token was granted to (when this node still
// knows), and the client's address. It is the record of every zombie write
// fencing stopped; without it fencing works silently.

// Refusal is one refused fenced write.
type Refusal struct {
	Seq    uint64    // position in the log, from 1; Refusals(since) returns those after since
	Time   time.Time // wall clock of the node that took the request
	Code   Code      // stale_token, not_holder or lease_expired
	Op     string    // put, delete, cas, incr, txn
	Key    []byte    // for a txn, the key whose fence refused it (none if its lock did)
	Lock   string    // the lock a held write named, if any
	Token  Token     // the token the write presented
	Fence  Token     // stale_token: the key's fence
	Holder Token     // not_holder: the lock's current holder's token (0: free)
	// GrantedLock and GrantedHolder say whom Token was granted to, when
	// this node still remembers the grant.
	GrantedLock   string
	GrantedHolder string
	Client        string // the client's address, "" if unknown
}

// RefusalLog keeps the latest refusals. It is safe for concurrent use.
type RefusalLog struct {
	log *slog.Logger

	mu    sync.Mutex // guards the rest
	ring  []Refusal
	n     int // refusals held (at most len(ring))
	seq   uint64
	byKey map[Code]uint64

	warned     time.Time // last warn line
	suppressed int       // refusals not logged since
}

// refusalWarnEvery rate-limits the warn line per refusal: at most one a
// second, with the count of the ones in between.
const refusalWarnEvery = time.Second

// NewRefusalLog returns a log that keeps the last size refusals (at least
// one) and writes a rate-limited warn line for each to log (nil: none).
func NewRefusalLog(size int, log *slog.Logger) *RefusalLog {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RefusalLog{log: log, ring: make([]Refusal, max(size, 1)), byKey: map[Code]uint64{}}
}

// isFenceRefusal reports whether err refused a write for its token.
func fenceRefusal(err error) (*Error, bool) {
	var e *Error
	if !errors.As(err, &e) {
		return nil, false
	}
	switch e.Code {
	case CodeStaleToken, CodeNotHolder, CodeLeaseExpired:
		return e, true
	}
	return nil, false
}

// Note records c's refusal err, if it is a fencing refusal. grants says
// whom a token was granted to.
func (l *RefusalLog) Note(ctx context.Context, c *state.Command, err error, grants func(Token) (string, string, bool)) {
	e, ok := fenceRefusal(err)
	if !ok || l == nil {
		return
	}
	r := Refusal{
		Time:   time.Now(),
		Code:   e.Code,
		Op:     c.Op.String(),
		Key:    append([]byte(nil), c.Key...),
		Lock:   c.Lock,
		Token:  c.Write.Token,
		Client: ClientAddr(ctx),
	}
	if len(r.Key) == 0 && e.Key != "" {
		r.Key = []byte(e.Key) // a txn: the key whose fence refused it
	}
	switch e.Code {
	case CodeStaleToken:
		r.Fence = e.Fence
	case CodeNotHolder:
		r.Holder = e.Token
	}
	if grants != nil && r.Token != 0 {
		r.GrantedLock, r.GrantedHolder, _ = grants(r.Token)
	}
	l.mu.Lock()
	l.seq++
	r.Seq = l.seq
	l.ring[int((r.Seq-1)%uint64(len(l.ring)))] = r
	l.n = min(l.n+1, len(l.ring))
	l.byKey[r.Code]++
	warn := time.Since(l.warned) >= refusalWarnEvery
	suppressed := l.suppressed
	if warn {
		l.warned, l.suppressed = r.Time, 0
	} else {
		l.suppressed++
	}
	l.mu.Unlock()
	if warn {
		l.log.Warn("fencing refused a write", "code", string(r.Code), "op", r.Op, "key", string(r.Key), "lock", r.Lock,
			"token", uint64(r.Token), "fence", uint64(r.Fence), "holder_token", uint64(r.Holder),
			"granted_lock", r.GrantedLock, "granted_holder", r.GrantedHolder, "client", r.Client,
			"not_logged_since_last", suppressed)
	}
}

// Since returns up to limit refusals after seq, oldest first, and the
// sequence number of the latest refusal. Refusals that fell out of the
// ring are gone: the first returned may be well after seq+1.
func (l *RefusalLog) Since(seq uint64, limit int) ([]Refusal, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.seq - uint64(l.n) + 1 // oldest held
	from := max(seq+1, first)
	var out []Refusal
	for s := from; s <= l.seq && len(out) < limit; s++ {
		out = append(out, l.ring[int((s-1)%uint64(len(l.ring)))])
	}
	return out, l.seq
}

// Counts returns how many refusals of each code were noted since start.
func (l *RefusalLog) Counts() map[Code]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[Code]uint64, len(l.byKey))
	for k, v := range l.byKey {
		out[k] = v
	}
	return out
}

type clientKey struct{}

// WithClient returns a context that carries the client's address, for
// the refusal log. The wire server sets it on every request.
func WithClient(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, clientKey{}, addr)
}

// ClientAddr returns the client address ctx carries, or "".
func ClientAddr(ctx context.Context) string {
	s, _ := ctx.Value(clientKey{}).(string)
	return s
}
