// Package verify proves fencing against a live fencekv server: it injects
// real process pauses (SIGSTOP past the lease) and checks that the paused
// client's late writes are refused, and it runs an inventory workload whose
// final counters must equal exactly the acknowledged updates. `fencekv
// verify` runs it against a deployment, one server or a cluster's nodes
// (which may fail over while it runs; see conn.go); its tests run it in
// CI.
//
// A fencing implementation that has never seen a real stale write refused
// is unverified: every round here produces one.
package verify

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// Config says what to run. Zero fields take the defaults of Defaults.
type Config struct {
	Addr string // the server, host:port; or a cluster's nodes, comma-separated
	// Rounds is the number of pause-injection rounds; they alternate
	// between the stale-token and the expired-lease variants.
	Rounds int
	// TTL is the lease length the rounds and the inventory run use.
	TTL time.Duration
	// Clients is the number of inventory clients, and how many pause
	// rounds run at once.
	Clients int
	// Updates is the number of lock-protected updates the inventory run
	// attempts in all.
	Updates int
	// Client returns the command that runs one paused client: a process
	// that calls ClientMain with args. fencekv verify re-executes itself.
	Client func(args []string) *exec.Cmd
	// Progress, if set, receives a line per finished phase.
	Progress io.Writer
	// Dial holds the TLS and credentials of the verifier's connections
	// (nil: plain, none). The paused clients get theirs from Client.
	Dial *wire.DialOptions
	// Target, if set, is where the fenced writes go instead of fencekv's
	// keys (see Target); the paused clients must write to the same one
	// (ClientMainTarget).
	Target Target
}

// Defaults are the values a zero Config field takes.
var Defaults = Config{Rounds: 100, TTL: 2 * time.Second, Clients: 4, Updates: 200}

// Report is what a run found. Violations lists every broken guarantee; a
// correct server has none.
type Report struct {
	Prefix string // scratch keys and locks lived under this prefix

	Rounds        int // pause-injection rounds run
	StaleRefused  int // paused clients' writes refused with stale_token
	StaleAccepted int // paused clients' writes accepted after a newer write (a violation)
	HeldRefused   int // held writes after expiry refused (lease_expired)
	HeldAccepted  int // held writes after expiry accepted (a violation)
	HeldLate      int // of HeldRefused, refused not_holder: a late grant of the paused client's own acquire (an attempt of unknown outcome) held the lock

	Updates        int   // inventory updates attempted
	Acked          int   // inventory updates acknowledged
	Unknown        int   // inventory updates whose outcome is unknown (a cluster lost its leader while applying them)
	LateAttempted  int   // inventory writes sent after the writer's lease had run out or a newer token existed
	LateRefused    int   // of those, refused
	LateAccepted   int   // of those, accepted although a newer token had already written (a violation)
	Counter, Total int64 // final inventory counters, and the acknowledged updates they must equal (up to Unknown more)

	Violations []string
	Elapsed    time.Duration
}

// OK reports whether no guarantee was broken.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

func (r *Report) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// String renders the report for people.
func (r *Report) String() string {
	verdict := "PASS: no stale write was accepted"
	if !r.OK() {
		verdict = fmt.Sprintf("FAIL: %d violation(s)", len(r.Violations))
	}
	s := fmt.Sprintf(`fencekv verify (scratch prefix %s, %v)
pause injection: %d rounds with real SIGSTOP/SIGCONT
  stale-token writes after a newer holder wrote: %d refused, %d accepted
  held writes after the lease expired:           %d refused, %d accepted
inventory: %d updates attempted, %d acknowledged, %d with an unknown outcome (failover)
  late writes (lease run out or newer token granted): %d attempted, %d refused, %d accepted after a newer write
  counters: %d, acknowledged updates: %d
%s
`, r.Prefix, r.Elapsed.Round(time.Millisecond), r.Rounds, r.StaleRefused, r.StaleAccepted, r.HeldRefused, r.HeldAccepted,
		r.Updates, r.Acked, r.Unknown, r.LateAttempted, r.LateRefused, r.LateAccepted, r.Counter, r.Total, verdict)
	if r.HeldLate > 0 {
		s = strings.Replace(s, "\ninventory:", fmt.Sprintf("\n    (%d of those refused not_holder: a late grant of the client's own acquire, retried after a failover, held the lock)\ninventory:", r.HeldLate), 1)
	}
	for _, v := range r.Violations {
		s += "  - " + v + "\n"
	}
	return s
}

// Run runs the pause-injection rounds and the inventory run against
// cfg.Addr, then removes its scratch keys. It returns an error only when
// it could not run (no server, a client process failed); broken
// guarantees are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Rounds == 0 {
		cfg.Rounds = Defaults.Rounds
	}
	if cfg.TTL == 0 {
		cfg.TTL = Defaults.TTL
	}
	if cfg.Clients <= 0 {
		cfg.Clients = Defaults.Clients
	}
	if cfg.Updates == 0 {
		cfg.Updates = Defaults.Updates
	}
	if cfg.Client == nil {
		return nil, errors.New("verify: Config.Client is required")
	}
	start := time.Now()
	rep := &Report{Prefix: "verify/" + randomID() + "/"}
	c, err := newConn(cfg.Addr, cfg.Dial)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.call(ctx, func(cl *wire.Client) error {
		_, err := cl.Ping(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	if err := pauseRounds(ctx, cfg, c, rep); err != nil {
		return rep, err
	}
	progress(cfg, "pause injection: %d rounds, %d stale writes refused, %d held writes refused",
		rep.Rounds, rep.StaleRefused, rep.HeldRefused)
	if err := inventory(ctx, cfg, rep); err != nil {
		return rep, err
	}
	progress(cfg, "inventory: %d of %d updates acknowledged", rep.Acked, rep.Updates)
	rep.Elapsed = time.Since(start)
	return rep, nil
}

func progress(cfg Config, format string, args ...any) {
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, format+"\n", args...)
	}
}

func randomID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// pauseRounds runs cfg.Rounds rounds, cfg.Clients at a time.
func pauseRounds(ctx context.Context, cfg Config, c *conn, rep *Report) error {
	var mu sync.Mutex // guards rep and firstErr
	var firstErr error
	sem := make(chan struct{}, cfg.Clients)
	var wg sync.WaitGroup
	for i := 0; i < cfg.Rounds; i++ {
		sem <- struct{}{}
		mu.Lock()
		stop := firstErr != nil
		mu.Unlock()
		if stop || ctx.Err() != nil {
			<-sem
			break
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			o, err := pauseRound(ctx, cfg, c, rep.Prefix, i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("round %d: %w", i, err)
				}
				return
			}
			rep.Rounds++
			switch {
			case o.held && o.accepted:
				rep.HeldAccepted++
				rep.violate("round %d: a held write with token %d was accepted after its lease expired", i, o.token)
			case o.held:
				rep.HeldRefused++
				if o.late != 0 {
					rep.HeldLate++
				}
			case o.accepted:
				rep.StaleAccepted++
				rep.violate("round %d: a write with token %d was accepted after token %d wrote", i, o.token, o.newer)
			default:
				rep.StaleRefused++
			}
		}(i)
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// awaitExpiry polls until lock is no longer held (its lease ran out on the
// server), or the deadline passes.
func awaitExpiry(ctx context.Context, c *conn, lock string, ttl time.Duration) error {
	deadline := time.Now().Add(10*ttl + 5*time.Second)
	poll := max(ttl/20, 5*time.Millisecond)
	for {
		in, err := c.lockInfo(ctx, lock)
		if err != nil {
			return err
		}
		if !in.Held {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lock %q still held %v after its TTL of %v", lock, time.Since(deadline.Add(-10*ttl-5*time.Second)), ttl)
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// cleanup deletes key with a fresh grant of lock (above every token that
// wrote it), then releases the lock.
func cleanup(ctx context.Context, c *conn, lock string, ttl time.Duration, keys ...string) error {
	l, _, err := c.acquire(ctx, lock, ttl, fencekv.AcquireOptions{Wait: 10*ttl + 5*time.Second, Holder: "fencekv verify cleanup " + randomID()})
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	for _, k := range keys {
		if err := c.call(ctx, func(cl *wire.Client) error {
			_, _, err := cl.Delete(ctx, []byte(k), fencekv.WriteOptions{Token: l.Token, Lock: lock})
			return err
		}); err != nil {
			return fmt.Errorf("cleanup of %q: %w", k, err)
		}
	}
	return release(ctx, c, lock, l.Token)
}

// release releases lock through failovers: a release retried after one
// whose outcome is unknown may find the lock already released.
func release(ctx context.Context, c *conn, lock string, token fencekv.Token) error {
	unknown, err := c.do(ctx, false, func(cl *wire.Client) error { return cl.Release(ctx, lock, token) })
	if unknown && (errors.Is(err, fencekv.ErrNotHolder) || errors.Is(err, fencekv.ErrLeaseExpired)) {
		return nil
	}
	return err
}
