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
// read the old value.
func inventory(ctx context.Context, cfg Config, rep *Report) error {
	lock := rep.Prefix + "inventory"
	keys := [2]string{rep.Prefix + "incr-counter", rep.Prefix + "put-counter"}
	var (
		mu        sync.Mutex // guards rep's inventory fields and acked
		acked     [2]int64
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
			c, err := wire.DialWith(ctx, cfg.Addr, cfg.Dial)
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
	c, err := wire.DialWith(ctx, cfg.Addr, cfg.Dial)
	if err != nil {
		return err
	}
	defer c.Close()
	for i, k := range keys {
		e, err := c.Get(ctx, []byte(k))
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
		if n != acked[i] {
			rep.violate("inventory: counter %s is %d but %d updates were acknowledged", k, n, acked[i])
		}
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
	late      bool          // sent after the lease ran out or a newer token was granted
	overtaken bool          // a newer token had written the counter before this write was sent
	by        fencekv.Token // that newer token
}

// update makes one lock-protected update.
func update(ctx context.Context, cfg Config, c *wire.Client, lock string, keys [2]string,
	granted *atomic.Uint64, written *[2]atomic.Uint64) (u updated, err error) {
	sent := time.Now()
	l, err := c.Acquire(ctx, lock, cfg.TTL, &fencekv.AcquireOptions{Wait: 20*cfg.TTL + 10*time.Second, Holder: "fencekv verify inventory"})
	if err != nil {
		return u, fmt.Errorf("inventory acquire: %w", err)
	}
	u.token = l.Token
	raise(granted, uint64(l.Token))
	u.counter = rand.IntN(2)
	key := []byte(keys[u.counter])
	e, err := c.Get(ctx, key)
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
	if u.counter == 0 {
		_, _, err = c.Incr(ctx, key, 1, fencekv.WriteOptions{Token: l.Token})
	} else {
		var n int64
		if e.Found {
			if n, err = strconv.ParseInt(string(e.Value), 10, 64); err != nil {
				return u, fmt.Errorf("counter holds %q", e.Value)
			}
		}
		_, err = c.Put(ctx, key, strconv.AppendInt(nil, n+1, 10), fencekv.WriteOptions{Token: l.Token, Lock: lock})
	}
	var fe *fencekv.Error
	switch {
	case err == nil:
		u.acked = true
		raise(&written[u.counter], uint64(l.Token))
	case errors.As(err, &fe) && (fe.Code == fencekv.CodeStaleToken || fe.Code == fencekv.CodeLeaseExpired || fe.Code == fencekv.CodeNotHolder):
		if !newer && elapsed < cfg.TTL/2 {
			return u, fmt.Errorf("a write %v into a %v lease (token %d) was refused: %w", elapsed, cfg.TTL, l.Token, err)
		}
		u.late = true // it reached the server after its lease ran out
	default:
		return u, err
	}
	if rerr := c.Release(ctx, lock, l.Token); rerr != nil && !errors.Is(rerr, fencekv.ErrNotHolder) && !errors.Is(rerr, fencekv.ErrLeaseExpired) {
		return u, rerr
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
