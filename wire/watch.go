package wire

import (
	"context"
	"fmt"
	"sync"

	"github.com/fencekv/fencekv"
)

// Watches on a connection: `watch` answers {watch_id} and then the server
// sends notifications [2, "watch", [{watch_id, events}]] as the changes
// become durable; `unwatch {watch_id}` stops one. A watcher that falls
// behind — its engine-side buffer fills, or the connection's unsent bytes
// are over the pending budget because the client does not read — is
// cancelled with [2, "watch_cancelled", [{watch_id, reason}]]; writers
// never wait for it.

// watchEngine is an engine that serves watches.
type watchEngine interface {
	Watch(ctx context.Context, o fencekv.WatchOptions) (*fencekv.Watcher, error)
}

// watches are a connection's watchers.
type watches struct {
	mu       sync.Mutex // guards next, all, starting
	next     uint64
	all      map[uint64]*fencekv.Watcher
	starting int            // watches being started: they count against the limit
	wg       sync.WaitGroup // one per watch's sender
}

// watch starts a watcher; its sender starts when the returned func is
// called, after the answer {watch_id} is queued, so that the client reads
// the id before any notification of it.
func (c *conn) watch(a *args, e *encoder) (start func(), err error) {
	we, ok := c.s.eng.(watchEngine)
	if !ok {
		return nil, &fencekv.Error{Code: fencekv.CodeUnknownMethod, Message: "this server has no watch"}
	}
	// The place is taken before the watcher is started, so that watches
	// started at once (pipelined requests are served concurrently) cannot
	// all pass the check.
	c.ws.mu.Lock()
	n := len(c.ws.all) + c.ws.starting
	if n >= c.s.cfg.MaxWatches {
		c.ws.mu.Unlock()
		return nil, &fencekv.Error{Code: fencekv.CodeLimitExceeded, Message: fmt.Sprintf("this connection has %d watches, the most it may have (--max-watches)", n)}
	}
	c.ws.starting++
	c.ws.mu.Unlock()
	reserved := true
	defer func() {
		if reserved { // Watch failed, or panicked
			c.ws.mu.Lock()
			c.ws.starting--
			c.ws.mu.Unlock()
		}
	}()
	w, err := we.Watch(c.base, fencekv.WatchOptions{Prefix: a.prefix, Locks: a.locks, StartRevision: fencekv.Revision(a.startRev)})
	if err != nil {
		return nil, err
	}
	c.ws.mu.Lock()
	c.ws.starting--
	reserved = false
	if c.ws.all == nil {
		c.ws.all = map[uint64]*fencekv.Watcher{}
	}
	c.ws.next++
	id := c.ws.next
	c.ws.all[id] = w
	c.ws.wg.Add(1)
	c.ws.mu.Unlock()
	e.EncodeMapLen(2)
	e.uint("watch_id", id)
	e.uint("revision", uint64(w.Revision()))
	// What the rights are checked against again before each batch.
	rights := &args{prefix: a.prefix, locks: a.locks}
	return func() { go c.sendEvents(id, w, rights) }, nil
}

// sendEvents writes a watcher's events as notifications until it ends.
// With auth, each batch goes only if the principal may still watch: one
// removed from the auth file, whose secret changed, or whose rights no
// longer cover the watch (a reload) has its watches cancelled.
func (c *conn) sendEvents(id uint64, w *fencekv.Watcher, rights *args) {
	defer c.ws.wg.Done()
	cancel := func(reason string) {
		w.Close()
		c.notify("watch_cancelled", func(e *encoder) {
			e.EncodeMapLen(2)
			e.uint("watch_id", id)
			e.str("reason", reason)
		})
	}
	for batch := range w.Events() {
		if c.pending.Load() > int64(c.s.cfg.MaxPendingBytes) && c.writerStuck() {
			cancel("the client does not read its notifications: over the pending budget")
			break
		}
		if c.s.cfg.Auth != nil {
			if _, ferr := c.permitted("watch", rights); ferr != nil {
				cancel("the principal may no longer watch: " + ferr.Message)
				break
			}
		}
		c.notify("watch", func(e *encoder) {
			e.EncodeMapLen(2)
			e.uint("watch_id", id)
			e.EncodeString("events")
			e.EncodeArrayLen(len(batch))
			for i := range batch {
				encodeEvent(e, &batch[i])
			}
		})
	}
	c.ws.mu.Lock()
	_, mine := c.ws.all[id]
	delete(c.ws.all, id)
	c.ws.mu.Unlock()
	if err := w.Err(); err != nil && mine {
		c.notify("watch_cancelled", func(e *encoder) {
			e.EncodeMapLen(2)
			e.uint("watch_id", id)
			e.str("reason", err.Error())
		})
	}
}

func encodeEvent(e *encoder, ev *fencekv.Event) {
	switch ev.Type {
	case "put":
		e.EncodeMapLen(5)
		e.str("type", ev.Type)
		e.bin("key", ev.Key)
		e.bin("value", ev.Value)
	case "delete":
		e.EncodeMapLen(4)
		e.str("type", ev.Type)
		e.bin("key", ev.Key)
	default:
		e.EncodeMapLen(4)
		e.str("type", ev.Type)
		e.bin("lock", []byte(ev.Lock))
		e.uint("token", uint64(ev.Token))
		e.uint("revision", uint64(ev.Revision))
		return
	}
	e.uint("fence", uint64(ev.Fence))
	e.uint("revision", uint64(ev.Revision))
}

// notify sends a notification [2, method, [params]] on the connection.
func (c *conn) notify(method string, params func(*encoder)) {
	e := encoderPool.Get().(*encoder)
	e.buf.Reset()
	e.EncodeArrayLen(3)
	e.EncodeUint(typeNotification)
	e.EncodeString(method)
	e.EncodeArrayLen(1)
	params(e)
	c.write(e, false, 0, false)
}

// unwatch stops one of the connection's watchers.
func (c *conn) unwatch(a *args, e *encoder) error {
	if err := need(a, fWatchID); err != nil {
		return err
	}
	c.ws.mu.Lock()
	w, ok := c.ws.all[a.watchID]
	delete(c.ws.all, a.watchID)
	c.ws.mu.Unlock()
	if !ok {
		return badRequest("no watch %d on this connection", a.watchID)
	}
	w.Close()
	e.EncodeMapLen(0)
	return nil
}

// closeWatches ends the connection's watchers and waits for their senders.
func (c *conn) closeWatches() {
	c.ws.mu.Lock()
	all := c.ws.all
	c.ws.all = nil
	c.ws.mu.Unlock()
	for _, w := range all {
		w.Close()
	}
	c.ws.wg.Wait()
}
