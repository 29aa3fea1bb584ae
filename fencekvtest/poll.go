package fencekvtest

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds, failing the test (with what it
// waited for) if it does not within the given time. It is for a wait on
// another goroutine, process or the real clock that offers nothing to wait
// on but its effects; never a stand-in for a fake clock. It polls every
// millisecond at first, then less often, up to every 10ms.
func Eventually(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
}
