// Package fencekvtest holds test helpers for programs that embed fencekv
// or talk to it, and for fencekv's own tests:
//
//   - Serve, ServeEngine: a server in this process, on a fresh store or on
//     any engine, stopped when the test ends;
//   - Clock: a fake clock that moves only when told, so lease expiry is
//     driven by the test rather than by sleeping;
//   - Logs: a slog handler that keeps what is logged;
//   - Eventually: polling a condition with a deadline;
//   - Child, AsChild, Buffer: the test binary run again as a child process
//     that runs one test, and a buffer for what it writes;
//   - Build: a binary of the module, built once per test binary.
package fencekvtest

import (
	"sync"
	"time"

	"github.com/fencekv/fencekv"
)

// Clock is a fake fencekv.Clock. Its time moves only by Advance, which
// fires every timer that falls due. It is safe for concurrent use.
type Clock struct {
	mu     sync.Mutex // guards now, timers
	now    time.Time
	timers []*timer
}

var _ fencekv.Clock = (*Clock)(nil)

// NewClock returns a Clock at an arbitrary fixed instant.
func NewClock() *Clock {
	return &Clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and fires the timers that fall due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	var keep []*timer
	var fire []*timer
	for _, t := range c.timers {
		if !t.at.After(now) {
			fire = append(fire, t)
		} else {
			keep = append(keep, t)
		}
	}
	c.timers = keep
	c.mu.Unlock()
	for _, t := range fire {
		select {
		case t.c <- now:
		default:
		}
	}
}

// Timers is the number of timers waiting to fire.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// NewTimer returns a timer that fires when the clock reaches now + d.
func (c *Clock) NewTimer(d time.Duration) fencekv.Timer {
	t := &timer{clock: c, c: make(chan time.Time, 1)}
	c.mu.Lock()
	t.at = c.now.Add(d)
	if d <= 0 {
		t.c <- c.now
	} else {
		c.timers = append(c.timers, t)
	}
	c.mu.Unlock()
	return t
}

type timer struct {
	clock *Clock
	at    time.Time
	c     chan time.Time
}

func (t *timer) C() <-chan time.Time { return t.c }

func (t *timer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return true
		}
	}
	return false
}
