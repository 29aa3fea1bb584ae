package verify

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// inventory runs cfg.Clients clients that repeatedly take one lock, read a
// counter, pause (a fifth of the time for longer than the TTL), and update
// it: half the updates a fenced incr of one counter, half a read-modify-
// write held put of another. At the end each counter must equal exactly
// the number of its acknowledged updates: none lost, none applied twice,
// no stale write landed.
//
// The two kinds use two counters because only held writes make a
// read-modify-write safe: a fenced write from a client whose lease ran out
// is still accepted while the newer holder has not written yet, which is
// harmless for incr (it commutes) but would lose an update of a put that
// read the old value. With a Target, both counters are the target's fenced
// read-modify-writes (Target.Incr), which read after the token check in
// the same transaction.
func inventory(ctx context.Context, cfg Config, rep *Report) error {
	lock := rep.Prefix + "inventory"
	keys := [2]string{rep.Prefix + "incr-counter", rep.Prefix + "put-counter"}
	var (
		mu        sync.Mutex // guards rep's inventory fields, acked and unknown
		acked     [2]int64
		unknown   [2]int64 // updates whose outcome is unknown (a failover)
		firstErr  error
		remaining atomic.Int64
		granted   atomic.Uint64    // highest token granted so far
		written   [2]atomic.Uint64 // highest token acknowledged writing each counter
	)
	remaining.Store(int64(cfg.Updates))
	var wg sync.WaitGroup
	for w := 0; w < cfg.Clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := newConn(cfg.Addr, cfg.Dial)
			if err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
				return
			}
			defer c.Close()
			for remaining.Add(-1) >= 0 && ctx.Err() == nil {
				r, err := update(ctx, cfg, c, lock, keys, &granted, &written)
				mu.Lock()
				if err != nil {
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				rep.Updates++
				if r.acked {
					rep.Acked++
					acked[r.counter]++
				}
				if r.unknown {
					rep.Unknown++
					unknown[r.counter]++
				}
				if r.late {
					rep.LateAttempted++
					if !r.acked {
						rep.LateRefused++
					}
				}
				if r.acked && r.overtaken {
					rep.LateAccepted++
					rep.violate("inventory: a write with token %d was accepted after token %d had written %s", r.token, r.by, keys[r.counter])
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	c, err := newConn(cfg.Addr, cfg.Dial)
	if err != nil {
		return err
	}
	defer c.Close()
	for i, k := range keys {
		e, err := get(ctx, cfg, c, k)
		if err != nil {
			return err
		}
		var n int64
		if e.Found {
			if n, err = strconv.ParseInt(string(e.Value), 10, 64); err != nil {
				return fmt.Errorf("counter %s holds %q", k, e.Value)
			}
		}
		rep.Counter += n
		rep.Total += acked[i]
		switch {
		case unknown[i] == 0 && n != acked[i]:
			rep.violate("inventory: counter %s is %d but %d updates were acknowledged", k, n, acked[i])
		case n < acked[i] || n > acked[i]+unknown[i]:
			rep.violate("inventory: counter %s is %d but %d updates were acknowledged and %d had an unknown outcome", k, n, acked[i], unknown[i])
		}
	}
	if cfg.Target != nil {
		return cfg.Target.Delete(ctx, keys[0], keys[1])
	}
	return cleanup(ctx, c, lock, cfg.TTL, keys[0], keys[1])
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

type updated struct {
	counter   int           // which counter
	token     fencekv.Token // the writer's token
	acked     bool          // the update was acknowledged
	unknown   bool          // a failover left the update's outcome unknown
	late      bool          // sent after the lease ran out or a newer token was granted
	overtaken bool          // a newer token had written the counter before this write was sent
	by        fencekv.Token // that newer token
}

// update makes one lock-protected update. Through a failover it retries
// what it may: the acquire (taking a grant its holder name shows it got),
// reads, the held put (the same value again), the release; an incr whose
// outcome is unknown is not retried, and counts as unknown.
func update(ctx context.Context, cfg Config, c *conn, lock string, keys [2]string,
	granted *atomic.Uint64, written *[2]atomic.Uint64) (u updated, err error) {
	sent := time.Now()
	l, _, err := c.acquire(ctx, lock, cfg.TTL, fencekv.AcquireOptions{Wait: 20*cfg.TTL + 10*time.Second, Holder: "fencekv verify inventory " + randomID()})
	if err != nil {
		return u, fmt.Errorf("inventory acquire: %w", err)
	}
	u.token = l.Token
	raise(granted, uint64(l.Token))
	u.counter = rand.IntN(2)
	key := []byte(keys[u.counter])
	e, err := get(ctx, cfg, c, keys[u.counter])
	if err != nil {
		return u, err
	}
	// The pause: mostly short, a fifth of the time past the lease.
	pause := time.Duration(rand.Int64N(int64(cfg.TTL / 10)))
	if rand.IntN(5) == 0 {
		pause = cfg.TTL + cfg.TTL/2
	}
	select {
	case <-time.After(pause):
	case <-ctx.Done():
		return u, ctx.Err()
	}
	// A queued grant's lease starts no earlier than the request was sent,
	// so a write sent within the TTL of that is on a live lease.
	elapsed := time.Since(sent)
	newer := granted.Load() > uint64(l.Token)
	u.late = elapsed >= cfg.TTL || newer
	if w := written[u.counter].Load(); w > uint64(l.Token) {
		u.overtaken, u.by = true, fencekv.Token(w)
	}
	var unknown bool
	if cfg.Target != nil {
		// The target reads and writes after its token check, in one
		// transaction: both counters are fenced read-modify-writes.
		err = cfg.Target.Incr(ctx, keys[u.counter], 1, l.Token)
	} else if u.counter == 0 {
		unknown, err = c.do(ctx, true, func(cl *wire.Client) error {
			_, _, err := cl.Incr(ctx, key, 1, fencekv.WriteOptions{Token: l.Token})
			return err
		})
	} else {
		var n int64
		if e.Found {
			if n, err = strconv.ParseInt(string(e.Value), 10, 64); err != nil {
				return u, fmt.Errorf("counter holds %q", e.Value)
			}
		}
		unknown, err = c.do(ctx, false, func(cl *wire.Client) error {
			_, err := cl.Put(ctx, key, strconv.AppendInt(nil, n+1, 10), fencekv.WriteOptions{Token: l.Token, Lock: lock})
			return err
		})
	}
	var fe *fencekv.Error
	switch {
	case err == nil:
		u.acked = true
		raise(&written[u.counter], uint64(l.Token))
	case unknown && (errors.As(err, &fe) || errors.Is(err, context.DeadlineExceeded) || u.counter == 0):
		// The first attempt may have landed: the counter may or may not
		// count it.
		u.unknown = true
	case errors.As(err, &fe) && (fe.Code == fencekv.CodeStaleToken || fe.Code == fencekv.CodeLeaseExpired || fe.Code == fencekv.CodeNotHolder):
		// Refused although answered within half the lease of the grant
		// (counting any retries through a failover): the lease was cut
		// short.
		if answered := time.Since(sent); !newer && answered < cfg.TTL/2 {
			return u, fmt.Errorf("a write answered %v into a %v lease (token %d) was refused: %w", answered, cfg.TTL, l.Token, err)
		}
		u.late = true // it reached the server after its lease ran out
	default:
		return u, err
	}
	if err := release(ctx, c, lock, l.Token); err != nil && !errors.Is(err, fencekv.ErrNotHolder) && !errors.Is(err, fencekv.ErrLeaseExpired) {
		return u, err
	}
	return u, nil
}

// raise sets v to x if x is larger.
func raise(v *atomic.Uint64, x uint64) {
	for {
		cur := v.Load()
		if x <= cur || v.CompareAndSwap(cur, x) {
			return
		}
	}
}
