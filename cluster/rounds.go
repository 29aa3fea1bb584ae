package cluster

import "sync"

// rounds shares one call among the callers that joined before it began:
// a caller waits for a round that starts after it joined, never one
// already in flight (which may have begun before it arrived, and so prove
// nothing about it), and every caller that joined while a round ran is
// served by the next. The leader's confirmation rounds (read.go) and a
// follower's read-index asks (followerread.go) are such calls.
type rounds[T any] struct {
	mu      sync.Mutex
	waiting []chan T // callers waiting for the next round
	running bool     // a goroutine runs rounds
}

// join registers a caller and returns the channel that receives the
// outcome of the next round to start. If no goroutine runs rounds, it
// starts one with spawn, which runs do round after round until no caller
// is left waiting.
func (r *rounds[T]) join(spawn func(func()), do func() T) <-chan T {
	ch := make(chan T, 1)
	r.mu.Lock()
	r.waiting = append(r.waiting, ch)
	if !r.running {
		r.running = true
		spawn(func() { r.run(do) })
	}
	r.mu.Unlock()
	return ch
}

func (r *rounds[T]) run(do func() T) {
	for {
		r.mu.Lock()
		batch := r.waiting
		r.waiting = nil
		if len(batch) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		out := do()
		for _, ch := range batch {
			ch <- out
		}
	}
}
