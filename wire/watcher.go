package wire

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// Watcher follows a watch over its own connection, and survives a
// reconnect: when the connection drops, or the server cancels the watch
// because this side fell behind, it dials again (with backoff, across its
// addresses) and resumes from the last revision it delivered, skipping the
// events of that revision it had already delivered. The caller sees every
// change once, in revision order, with no gap — unless the server no
// longer keeps the revision to resume from: then Events is closed and Err
// is the compacted refusal (watch again from now, after re-reading the
// state).
type Watcher struct {
	addrs []string
	o     fencekv.WatchOptions
	ch    chan []fencekv.Event
	dial  func(ctx context.Context, addr string) (net.Conn, error)
	creds *DialOptions // User and Secret, if set, authenticate each connection

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the watcher's goroutine ends

	// Owned by the goroutine: where to resume.
	lastRev fencekv.Revision // revision of the last event delivered (or the start revision - 1)
	seen    int              // events of lastRev delivered

	mu  sync.Mutex // guards err
	err error
}

// Watch starts a watcher on the servers at addrs (any node of a cluster;
// it moves to another when one fails). The first connection is made before
// Watch returns; a refusal then (such as compacted) is returned.
func Watch(ctx context.Context, addrs []string, o fencekv.WatchOptions) (*Watcher, error) {
	return WatchWith(ctx, addrs, o, nil)
}

// WatchWith is Watch with TLS and credentials (see DialOptions): every
// connection it makes is dialed with d.TLS and, if d.User is set,
// authenticated before the watch starts.
func WatchWith(ctx context.Context, addrs []string, o fencekv.WatchOptions, d *DialOptions) (*Watcher, error) {
	if len(addrs) == 0 {
		return nil, errors.New("wire: watch: no address")
	}
	if d == nil {
		d = &DialOptions{}
	}
	w := &Watcher{addrs: addrs, o: o, ch: make(chan []fencekv.Event, 64), done: make(chan struct{}), creds: d}
	w.dial = func(ctx context.Context, addr string) (net.Conn, error) {
		if d.TLS != nil {
			cfg := d.TLS.Clone()
			cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
			td := tls.Dialer{Config: cfg}
			return td.DialContext(ctx, "tcp", addr)
		}
		var nd net.Dialer
		return nd.DialContext(ctx, "tcp", addr)
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	if o.StartRevision > 0 {
		w.lastRev = o.StartRevision - 1
	}
	nc, dec, err := w.connect(ctx, 0, o.StartRevision)
	if err != nil {
		w.cancel()
		return nil, err
	}
	go w.run(nc, dec)
	return w, nil
}

// Events delivers batches of events in revision order. It is closed when
// the watcher ends (Close, or an error: see Err).
func (w *Watcher) Events() <-chan []fencekv.Event { return w.ch }

// Err is why the watcher ended, or nil.
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close stops the watcher and waits for its goroutine. It is safe to call
// more than once.
func (w *Watcher) Close() error {
	w.cancel()
	<-w.done
	return nil
}

// connect dials addrs[i] (or the next that answers) and starts the watch
// from start (0: from now). For a watch from now it records the server's
// revision at start, so a later resume starts right after it.
func (w *Watcher) connect(ctx context.Context, i int, start fencekv.Revision) (net.Conn, *msgpack.Decoder, error) {
	var errs []error
	for k := range w.addrs {
		addr := w.addrs[(i+k)%len(w.addrs)]
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		nc, err := w.dial(dctx, addr)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// The first answer comes at once, unless auth's bcrypt check
		// queues: with other nodes to go to, one that does not answer
		// soon (stopped, hung: its kernel still accepts) is passed over.
		within := 10 * time.Second
		if len(w.addrs) > 1 && w.creds.User == "" {
			within = w.creds.withDefaults().DialTimeout
		}
		dec, rev, err := startWatch(nc, w.o, start, w.creds, within)
		if err != nil {
			nc.Close()
			var fe *fencekv.Error
			if errors.As(err, &fe) && !nodeRefusal(fe) {
				return nil, nil, err // a refusal: every node would say the same
			}
			errs = append(errs, err)
			continue
		}
		if start == 0 && w.lastRev == 0 && w.seen == 0 {
			w.lastRev = rev // nothing delivered yet: resume after the start
		}
		return nc, dec, nil
	}
	return nil, nil, fmt.Errorf("wire: watch: no server answered: %w", errors.Join(errs...))
}

// nodeRefusal reports whether a watch's refusal is this node's own (at its
// watcher limit, or shutting down): another node may take the watch. Any
// other refusal (permission_denied, compacted, bad_request) every node
// would give.
func nodeRefusal(fe *fencekv.Error) bool {
	return fe.Code == fencekv.CodeLimitExceeded || fe.Code == fencekv.CodeUnavailable
}

// startWatch authenticates nc if creds name a user, sends the watch
// request, and reads the answers.
func startWatch(nc net.Conn, o fencekv.WatchOptions, start fencekv.Revision, creds *DialOptions, within time.Duration) (*msgpack.Decoder, fencekv.Revision, error) {
	params := map[string]any{"prefix": o.Prefix, "locks": o.Locks}
	if start > 0 {
		params["start_revision"] = uint64(start)
	}
	nc.SetDeadline(time.Now().Add(within))
	dec := msgpack.NewDecoder(bufio.NewReader(nc))
	send := func(msg []any) error {
		b, err := msgpack.Marshal(msg)
		if err == nil {
			_, err = nc.Write(b)
		}
		return err
	}
	if creds.User != "" {
		// Authenticate first, and wait for it: requests on a connection
		// may be served concurrently.
		if err := send([]any{0, 0, "auth", []any{map[string]any{"name": creds.User, "secret": creds.Secret}}}); err != nil {
			return nil, 0, err
		}
		if _, err := readAnswer(dec, func(dec *msgpack.Decoder, _ string) error { return dec.Skip() }); err != nil {
			return nil, 0, fmt.Errorf("wire: authenticate as %q: %w", creds.User, err)
		}
	}
	if err := send([]any{0, 1, "watch", []any{params}}); err != nil {
		return nil, 0, err
	}
	var rev uint64
	if _, err := readAnswer(dec, func(dec *msgpack.Decoder, k string) error {
		if k == "revision" {
			return decodeTo(dec, &rev)
		}
		return dec.Skip()
	}); err != nil {
		return nil, 0, err
	}
	nc.SetDeadline(time.Time{})
	return dec, fencekv.Revision(rev), nil
}

// readAnswer reads one response [1, msgid, error, result], calling field
// for each field of a map result.
func readAnswer(dec *msgpack.Decoder, field func(*msgpack.Decoder, string) error) (uint32, error) {
	if n, err := dec.DecodeArrayLen(); err != nil || n != 4 {
		return 0, fmt.Errorf("wire: watch: bad answer (%d elements): %v", n, err)
	}
	if _, err := dec.DecodeInt(); err != nil { // type 1
		return 0, err
	}
	msgid, err := dec.DecodeUint32()
	if err != nil {
		return 0, err
	}
	ferr, err := decodeError(dec)
	if err != nil {
		return msgid, err
	}
	if ferr != nil {
		dec.Skip()
		return msgid, ferr
	}
	return msgid, eachField(dec, field)
}

// run reads notifications and delivers events, reconnecting as needed.
func (w *Watcher) run(nc net.Conn, dec *msgpack.Decoder) {
	defer close(w.done)
	defer close(w.ch)
	stop := context.AfterFunc(w.ctx, func() { nc.Close() })
	defer func() { stop() }()
	backoff := 50 * time.Millisecond
	next := 1
	for {
		err := w.read(dec)
		nc.Close()
		if w.ctx.Err() != nil {
			return
		}
		var fe *fencekv.Error
		if errors.As(err, &fe) {
			w.fail(err)
			return
		}
		// Reconnect and resume from the last revision delivered.
		for {
			select {
			case <-w.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			var cerr error
			nc, dec, cerr = w.connect(w.ctx, next, w.resumeFrom())
			next++
			if cerr == nil {
				break
			}
			if errors.As(cerr, &fe) {
				w.fail(cerr)
				return
			}
		}
		stop()
		stop = context.AfterFunc(w.ctx, func() { nc.Close() })
		backoff = 50 * time.Millisecond
	}
}

// resumeFrom is the revision to watch again from: the last one delivered
// (its already delivered events are skipped), or the one after the start
// if nothing was delivered.
func (w *Watcher) resumeFrom() fencekv.Revision {
	if w.seen == 0 {
		return w.lastRev + 1
	}
	return w.lastRev
}

func (w *Watcher) fail(err error) {
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
}

// read delivers the connection's notifications until it fails; a
// watch_cancelled notification ends it too (to resume).
func (w *Watcher) read(dec *msgpack.Decoder) error {
	skip := w.seen // events of lastRev to skip after a resume
	skipRev := w.lastRev
	for {
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		if n != 3 {
			for range n {
				dec.Skip()
			}
			continue // a response: not expected on this connection
		}
		if _, err := dec.DecodeInt(); err != nil {
			return err
		}
		method, err := dec.DecodeString()
		if err != nil {
			return err
		}
		if _, err := dec.DecodeArrayLen(); err != nil {
			return err
		}
		if method == "watch_cancelled" {
			dec.Skip()
			return errors.New("wire: watch cancelled by the server")
		}
		var batch []fencekv.Event
		err = eachField(dec, func(dec *msgpack.Decoder, k string) error {
			if k != "events" {
				return dec.Skip()
			}
			m, err := dec.DecodeArrayLen()
			if err != nil {
				return err
			}
			for range m {
				var e fencekv.Event
				if err := decodeEvent(dec, &e); err != nil {
					return err
				}
				if e.Revision < skipRev || e.Revision == skipRev && skip > 0 {
					if e.Revision == skipRev {
						skip--
					}
					continue // delivered before the reconnect
				}
				batch = append(batch, e)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(batch) == 0 {
			continue
		}
		for _, e := range batch {
			if e.Revision != w.lastRev {
				w.lastRev, w.seen = e.Revision, 0
			}
			w.seen++
		}
		select {
		case w.ch <- batch:
		case <-w.ctx.Done():
			return w.ctx.Err()
		}
	}
}

func decodeEvent(dec *msgpack.Decoder, e *fencekv.Event) error {
	return eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
		switch k {
		case "type":
			e.Type, err = dec.DecodeString()
		case "key":
			e.Key, err = dec.DecodeBytes()
		case "value":
			e.Value, err = dec.DecodeBytes()
		case "fence":
			err = decodeTo(dec, (*uint64)(&e.Fence))
		case "revision":
			err = decodeTo(dec, (*uint64)(&e.Revision))
		case "lock":
			var b []byte
			b, err = dec.DecodeBytes()
			e.Lock = string(b)
		case "token":
			err = decodeTo(dec, (*uint64)(&e.Token))
		default:
			err = dec.Skip()
		}
		return err
	})
}
