package wire

import "time"

// Running reports how many of the goroutines c started are running: the
// release of a late grant, WithLock's keeper and renewer, the interrupt of
// a reader whose context ended. Close waits for them all, so it is 0 once
// Close has returned.
func Running(c *Client) int { return int(c.running.Load()) }

// HoldEnding makes each goroutine that c starts from now on (the
// interrupts aside), once its work is done, send on arrived and wait until
// release is closed: a test can so hold them past Close and see that Close
// waits. Call it before the calls that start them.
func HoldEnding(c *Client, arrived chan<- struct{}, release <-chan struct{}) {
	c.ending = func() {
		arrived <- struct{}{}
		<-release
	}
}

// SetProbeIdle sets how long a connection must be idle before a call
// checks that the server has not closed it, until the test ends.
func SetProbeIdle(tb interface{ Cleanup(func()) }, d time.Duration) {
	old := probeIdle.Swap(int64(d))
	tb.Cleanup(func() { probeIdle.Store(old) })
}

// PeerClosed reports whether the server has closed (or reset) c's current
// connection, as far as this side can tell without reading.
func PeerClosed(c *Client) bool { return peerGone(c.cur.Load().raw) != nil }
