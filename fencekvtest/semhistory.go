package fencekvtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// A semaphore history: what clients saw of the permits of one semaphore,
// and a checker of it (CheckSemaphore), for tests that run a workload
// across faults (a server killed and restarted, a cluster's leader lost).

// Permit is one granted permit as its client saw it.
type Permit struct {
	Worker  int
	Token   fencekv.Token
	TTL     time.Duration
	Sent    time.Time // the acquire was sent
	Ack     time.Time // its grant came back
	Release time.Time // release was called; zero if it never was
}

// end is the latest moment the permit is surely still live on the server:
// when release was called, or, if earlier, when its lease could first run
// out (the server measures the TTL from a moment after Sent, and a restart
// or a new leader gives it its full TTL again: never sooner).
func (p Permit) end() time.Time {
	out := p.Sent.Add(p.TTL)
	if !p.Release.IsZero() && p.Release.Before(out) {
		out = p.Release
	}
	return out
}

// CheckSemaphore checks a history of permits of one semaphore of limit:
//   - at no moment are more than limit permits live, a permit counting over
//     [Ack, end): from when its holder knew it had it until it called
//     release or its lease could first have run out (end). These are
//     within the server's own spans, so a server that keeps to the limit
//     never fails the check, and one that grants a permit too many while
//     its clients still hold theirs does;
//   - every token is unique;
//   - tokens rise with real time: a grant acknowledged before another
//     acquire was sent has the lower token.
func CheckSemaphore(ps []Permit, limit int) error {
	seen := make(map[fencekv.Token]int, len(ps))
	for i, p := range ps {
		if j, dup := seen[p.Token]; dup {
			return fmt.Errorf("token %d granted twice: to worker %d and worker %d", p.Token, ps[j].Worker, p.Worker)
		}
		seen[p.Token] = i
		if p.Ack.Before(p.Sent) {
			return fmt.Errorf("token %d: acknowledged at %v, before it was sent at %v", p.Token, p.Ack, p.Sent)
		}
	}
	// Overlap: sweep the starts and ends in time order, an end before a
	// start at the same instant (half-open spans).
	type edge struct {
		at    time.Time
		delta int
		i     int
	}
	var edges []edge
	for i, p := range ps {
		if e := p.end(); e.After(p.Ack) {
			edges = append(edges, edge{p.Ack, +1, i}, edge{e, -1, i})
		}
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	live := map[int]bool{}
	for _, e := range edges {
		if e.delta < 0 {
			delete(live, e.i)
			continue
		}
		live[e.i] = true
		if len(live) > limit {
			var toks []fencekv.Token
			for i := range live {
				toks = append(toks, ps[i].Token)
			}
			slices.Sort(toks)
			return fmt.Errorf("%d permits live at %v (limit %d): tokens %v", len(live), e.at, limit, toks)
		}
	}
	// Real-time order: sorted by Ack, the largest token acknowledged
	// before each acquire was sent must be below its token.
	byAck := slices.Clone(ps)
	slices.SortFunc(byAck, func(a, b Permit) int { return a.Ack.Compare(b.Ack) })
	bySent := slices.Clone(ps)
	slices.SortFunc(bySent, func(a, b Permit) int { return a.Sent.Compare(b.Sent) })
	var top Permit
	j := 0
	for _, p := range bySent {
		for j < len(byAck) && byAck[j].Ack.Before(p.Sent) {
			if byAck[j].Token > top.Token {
				top = byAck[j]
			}
			j++
		}
		if top.Token >= p.Token && top.Token != 0 {
			return fmt.Errorf("token %d (sent at %v) is not above token %d, acknowledged before it at %v", p.Token, p.Sent, top.Token, top.Ack)
		}
	}
	return nil
}

// SemWorkload tunes RunSemaphore.
type SemWorkload struct {
	Name    string        // the semaphore
	Limit   int           // its permits
	TTL     time.Duration // each permit's lease
	Hold    time.Duration // a permit is held for up to this long (random), then released
	Wait    time.Duration // how long an acquire waits in line
	Retries time.Duration // a release that fails with the connection is tried again for this long
	// Granted, if set, counts the grants as they come (for a test to wait
	// for progress before and after a fault).
	Granted *atomic.Int64
}

// SemStats counts what a workload's calls met.
type SemStats struct {
	Granted, Full, Failed, Released, ReleaseRefused, ReleaseLost int
}

// RunSemaphore runs one worker per client until ctx ends, each acquiring a
// permit of w.Name (limit w.Limit), holding it a while and releasing it,
// again and again, and returns every permit granted, as the clients saw
// it, for CheckSemaphore. A call that fails with the connection or the
// server's availability (a server down, no leader) is tried again after a
// short pause; those are counted in the stats, not failures.
func RunSemaphore(ctx context.Context, clients []*wire.Client, w SemWorkload) ([]Permit, SemStats) {
	var (
		mu    sync.Mutex
		out   []Permit
		stats SemStats
		wg    sync.WaitGroup
	)
	count := func(f func(*SemStats)) {
		mu.Lock()
		f(&stats)
		mu.Unlock()
	}
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for n := 0; ctx.Err() == nil; n++ {
				p := Permit{Worker: i, TTL: w.TTL, Sent: time.Now()}
				l, err := c.Acquire(ctx, w.Name, w.TTL, &fencekv.AcquireOptions{
					Limit: w.Limit, Wait: w.Wait, Holder: fmt.Sprintf("w%d.%d", i, n)})
				p.Ack = time.Now()
				switch {
				case err != nil && ctx.Err() != nil:
					return // the workload's end
				case err == nil:
					count(func(s *SemStats) { s.Granted++ })
					if w.Granted != nil {
						w.Granted.Add(1)
					}
				case errors.Is(err, fencekv.ErrLockHeld):
					count(func(s *SemStats) { s.Full++ })
					continue
				default:
					count(func(s *SemStats) { s.Failed++ })
					pause(ctx, 20*time.Millisecond)
					continue
				}
				p.Token = l.Token
				if w.Hold > 0 {
					pause(ctx, time.Duration(rng.Int64N(int64(w.Hold))))
				}
				p.Release = time.Now()
				mu.Lock()
				out = append(out, p)
				mu.Unlock()
				deadline := time.Now().Add(w.Retries)
				for {
					rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
					err := c.Release(rctx, w.Name, l.Token)
					cancel()
					var fe *fencekv.Error
					switch {
					case err == nil:
						count(func(s *SemStats) { s.Released++ })
					case errors.As(err, &fe) && fe.Code != fencekv.CodeUnavailable && fe.Code != fencekv.CodeNotLeader:
						count(func(s *SemStats) { s.ReleaseRefused++ }) // it ran out meanwhile
					case time.Now().Before(deadline):
						pause(context.WithoutCancel(ctx), 20*time.Millisecond)
						continue
					default:
						count(func(s *SemStats) { s.ReleaseLost++ }) // it runs out on the server
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	return out, stats
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
