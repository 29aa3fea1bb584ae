package wire_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// The client has no reader goroutine: a waiting caller reads the
// connection itself and hands the reading on (see wire.Client). These
// tests aim at the hand-over: callers whose contexts end while they read
// or while the reading is being handed to them.

// TestClientCancelStorm shares one client between goroutines whose calls
// often end by context mid-flight, the reader's among them. Every call that
// succeeds must have got its own answer, and the client must stay usable.
func TestClientCancelStorm(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.Addr)
	const workers, each = 12, 150
	var wg sync.WaitGroup
	var cancelled sync.Map
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			key := b(fmt.Sprintf("storm/%d", w))
			ctr := b(fmt.Sprintf("storm/ctr/%d", w))
			lastCount := -1 // the last counter value an incr returned: the next is higher
			n := 0
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(400))*time.Microsecond)
				if rng.IntN(3) == 0 {
					ctx, cancel = context.WithCancel(context.Background())
				}
				_, err := c.Put(ctx, key, b(fmt.Sprintf("%d:%d", w, i)), fencekv.WriteOptions{})
				switch {
				case err == nil:
				case errors.Is(err, context.DeadlineExceeded):
					n++
				default:
					t.Errorf("worker %d put: %v", w, err)
				}
				// A put cut short here may still be applied, even after
				// a later one (pipelined writes are not ordered), so the
				// value read is any this worker wrote, never another's.
				if e, err := c.Get(ctx, key); err == nil && e.Found {
					who, v, _ := strings.Cut(string(e.Value), ":")
					got, _ := strconv.Atoi(v)
					if who != strconv.Itoa(w) || got > i {
						t.Errorf("worker %d (wrote up to %d) read %q: another call's answer", w, i, e.Value)
					}
				}
				if v, _, err := c.Incr(ctx, ctr, 1, fencekv.WriteOptions{}); err == nil {
					if int(v) <= lastCount {
						t.Errorf("worker %d: incr returned %d after %d", w, v, lastCount)
					}
					lastCount = int(v)
				}
				cancel()
			}
			cancelled.Store(w, n)
		})
	}
	wg.Wait()
	total := 0
	cancelled.Range(func(_, v any) bool { total += v.(int); return true })
	if total == 0 {
		t.Logf("no put was cut short by its context; the storm tested little")
	}
	// Still usable, by every caller pattern.
	ctx := context.Background()
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("ping after the storm: %v", err)
	}
	for w := range workers {
		if _, err := c.Put(ctx, b(fmt.Sprintf("storm/%d", w)), b("end"), fencekv.WriteOptions{}); err != nil {
			t.Fatalf("put after the storm: %v", err)
		}
	}
}

// lockHeld starts a server (edit as for startServer) on which one client,
// holder, holds lock "L" with lease l.
func lockHeld(t *testing.T, edit func(*fencekv.Options, *wire.Config)) (ts *testServer, holder *wire.Client, l fencekv.Lease) {
	t.Helper()
	ts = startServer(t, edit)
	holder = dial(t, ts.Addr)
	l, err := holder.Acquire(context.Background(), "L", 10*time.Second, nil)
	ok(t, err)
	return ts, holder, l
}

// abandonAcquire queues an acquire of name on c and gives up while it
// waits: its context is cancelled, and Acquire must return then. The
// acquire stays queued on the server, for a minute.
func abandonAcquire(t *testing.T, c *wire.Client, name string) {
	t.Helper()
	// Cancelled, not a deadline: Acquire would shorten the server-side
	// wait to a deadline, and the server would answer in time.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.Acquire(ctx, name, 5*time.Second, &fencekv.AcquireOptions{Wait: time.Minute})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("queued acquire past its context = %v; want Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("acquire returned %v after its context ended", d)
	}
}

// TestClientReaderInterrupted: a lone caller reading its own queued
// acquire returns at its context's end, the connection stays in step, and
// the grant that comes later is released by the client.
func TestClientReaderInterrupted(t *testing.T) {
	ts, holder, l := lockHeld(t, nil)
	c := dial(t, ts.Addr)
	ctx := context.Background()
	abandonAcquire(t, c, "L")
	// The stream is intact: calls on the same client are answered, and
	// with their own answers.
	for i := range 10 {
		if _, err := c.Put(ctx, b("k"), b(fmt.Sprint(i)), fencekv.WriteOptions{}); err != nil {
			t.Fatalf("put after the interrupted read: %v", err)
		}
		e, err := c.Get(ctx, b("k"))
		if err != nil || string(e.Value) != fmt.Sprint(i) {
			t.Fatalf("get = %q, %v; want %d", e.Value, err, i)
		}
	}
	lateGrantReleased(t, ts, holder, l, l.Token)
}

// lateGrantReleased checks that an abandoned acquire of "L" is still
// queued on the server (the wait there is a minute), then has holder
// release l, and waits for the client to release the grant that follows,
// whose token is above after.
func lateGrantReleased(t *testing.T, ts *testServer, holder *wire.Client, l fencekv.Lease, after fencekv.Token) {
	t.Helper()
	ctx := context.Background()
	if n := waiters(t, ts.DB, "L"); n != 1 {
		t.Fatalf("%d waiters; want the abandoned acquire", n)
	}
	ok(t, holder.Release(ctx, "L", l.Token))
	eventually(t, 10*time.Second, "the late grant to be released", func() bool {
		in, err := ts.DB.LockInfo(ctx, "L")
		return err == nil && !in.Held && in.Waiters == 0
	})
	if st, err := ts.DB.Status(ctx); err != nil || st.LastToken <= after {
		t.Fatalf("status %+v, %v: want a grant after token %d", st, err, after)
	}
}

// TestClientHandOverUnderCancel has one caller read for a long time (a
// queued acquire) while others come and go, some cut short: the reading
// passes between them without losing an answer.
func TestClientHandOverUnderCancel(t *testing.T) {
	ts, holder, l := lockHeld(t, nil)
	c := dial(t, ts.Addr)
	ctx := context.Background()
	granted := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "L", 5*time.Second, &fencekv.AcquireOptions{Wait: time.Minute})
		granted <- err
	}()
	eventually(t, 10*time.Second, "the acquire to queue", func() bool { return waiters(t, ts.DB, "L") == 1 })
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 100 {
				cctx, cancel := context.WithTimeout(ctx, time.Duration(i%5)*50*time.Microsecond)
				if i%2 == 0 {
					cctx, cancel = context.WithCancel(ctx)
				}
				v, err := c.Ping(cctx)
				cancel()
				if err == nil && v != fencekv.Version {
					t.Errorf("worker %d: ping answered %q", w, v)
				}
			}
		})
	}
	wg.Wait()
	ok(t, holder.Release(ctx, "L", l.Token))
	select {
	case err := <-granted:
		ok(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the queued acquire was granted on the server but its caller never heard")
	}
}

// TestClientSharedContext: a context passed call after call (the common
// case, whose watch the client keeps) still interrupts the reader when it
// ends, and a later call with another context is served.
func TestClientSharedContext(t *testing.T) {
	ts, holder, l := lockHeld(t, nil)
	c := dial(t, ts.Addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 5 {
		if _, err := c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := c.Acquire(ctx, "L", 5*time.Second, &fencekv.AcquireOptions{Wait: time.Minute}); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire as its context ends = %v; want Canceled", err)
	}
	if _, err := c.Ping(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("ping with an ended context = %v; want Canceled", err)
	}
	if v, err := c.Ping(context.Background()); err != nil || v != fencekv.Version {
		t.Fatalf("ping after = %q, %v", v, err)
	}
	ok(t, holder.Release(context.Background(), "L", l.Token))
}

// clientGoroutines returns the stacks of the goroutines, other than the
// caller's, running code of a wire.Client, however they were started. The
// package's tests do not run in parallel, so after a test's client calls
// have returned, any such goroutine is one the client left behind.
func clientGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var left []string
	for _, g := range strings.Split(string(buf), "\n\n")[1:] { // the caller's first
		if strings.Contains(g, "fencekv/wire.(*Client)") {
			left = append(left, g)
		}
	}
	return left
}

// closeAndCheck closes c and fails the test if a goroutine of the client
// is still running when Close has returned: Close waits for them.
func closeAndCheck(t *testing.T, c *wire.Client) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if n := wire.Running(c); n != 0 {
		t.Errorf("%d goroutines of the client still running after Close returned", n)
	}
	if left := clientGoroutines(); len(left) > 0 {
		t.Errorf("%d goroutines in client code after Close returned:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}

// holdGoroutines holds the goroutines c starts from now on as they end
// (see wire.HoldEnding), until the test ends at the latest. closeHeld then
// closes c and checks that Close waits for n of them: it has not returned
// while they are held, and returns, leaving none running, once they are
// let go.
func holdGoroutines(t *testing.T, c *wire.Client) (closeHeld func(t *testing.T, n int)) {
	arrived, release := make(chan struct{}, 16), make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before dial's Close, which would wait for them
	wire.HoldEnding(c, arrived, release)
	return func(t *testing.T, n int) {
		t.Helper()
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		for i := range n {
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatalf("%d of %d goroutines of the client ended their work after Close", i, n)
			}
		}
		// Each is held now; a Close that did not wait for them would
		// return at once.
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while %d goroutines of the client were still running", err, wire.Running(c))
		case <-time.After(50 * time.Millisecond):
		}
		letGo()
		select {
		case err := <-closed:
			if err != nil {
				t.Fatalf("close: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return once the client's goroutines were let go")
		}
		if r := wire.Running(c); r != 0 {
			t.Errorf("%d goroutines of the client still running after Close returned", r)
		}
		if left := clientGoroutines(); len(left) > 0 {
			t.Errorf("%d goroutines in client code after Close returned:\n%s", len(left), strings.Join(left, "\n\n"))
		}
	}
}

// TestClientCloseWaitsForLateGrant: a queued acquire whose caller gave up
// leaves a goroutine waiting for the grant, to release it; Close ends that
// wait and returns only once the goroutine has ended. Close stays
// idempotent.
func TestClientCloseWaitsForLateGrant(t *testing.T) {
	ts, holder, l := lockHeld(t, nil)
	c := dial(t, ts.Addr)
	closeHeld := holdGoroutines(t, c)
	ctx := context.Background()
	abandonAcquire(t, c, "L")
	if n := wire.Running(c); n < 1 {
		t.Fatalf("%d goroutines of the client after the acquire gave up; want the one waiting for the grant", n)
	}
	closeHeld(t, 1)
	for range 2 {
		if err := c.Close(); err != nil {
			t.Fatalf("Close again = %v; want nil", err)
		}
	}
	if _, err := c.Ping(ctx); !errors.Is(err, wire.ErrClientClosed) {
		t.Fatalf("ping after Close = %v; want ErrClientClosed", err)
	}
	// The closed connection's queued acquire is gone with it; the holder
	// keeps the lock.
	eventually(t, 10*time.Second, "the closed client's acquire to leave the queue", func() bool { return waiters(t, ts.DB, "L") == 0 })
	in, err := holder.LockInfo(ctx, "L")
	if err != nil || !in.Held || in.Token != l.Token {
		t.Fatalf("lock_info after the waiter closed = %+v, %v; want still held with token %d", in, err, l.Token)
	}
}

// TestClientLateGrantReleasedByAnotherReader: the caller gives up while
// another call holds the read side; the grant that comes later is read by
// that call, and the client's goroutine still releases it, then ends.
func TestClientLateGrantReleasedByAnotherReader(t *testing.T) {
	ts, holder, l := lockHeld(t, nil)
	c := dial(t, ts.Addr)
	ctx := context.Background()
	m, err := holder.Acquire(ctx, "M", 10*time.Second, nil)
	ok(t, err)
	// A queued acquire of M, waiting on its own context: the reader.
	reader := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "M", 5*time.Second, &fencekv.AcquireOptions{Wait: time.Minute})
		reader <- err
	}()
	eventually(t, 10*time.Second, "the acquire of M to queue", func() bool { return waiters(t, ts.DB, "M") == 1 })
	abandonAcquire(t, c, "L")
	lateGrantReleased(t, ts, holder, l, m.Token)
	eventually(t, 10*time.Second, "the client's goroutine to end after the release", func() bool { return wire.Running(c) == 0 })
	// The reader was not disturbed: its own grant comes when M is free.
	ok(t, holder.Release(ctx, "M", m.Token))
	select {
	case err := <-reader:
		ok(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the queued acquire of M was never answered")
	}
	closeAndCheck(t, c)
}

// TestClientUnencodableParams: a call whose params cannot be encoded is
// refused before anything of it is sent, with the encoder's error, while
// calls of other goroutines are queued on the same connection around it:
// theirs still leave whole and get their own answers, and the connection
// is not broken.
func TestClientUnencodableParams(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.Addr)
	ctx := context.Background()
	const workers, each = 6, 150
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				key := []byte(fmt.Sprintf("enc/%d/%d", w, i%10))
				val := []byte(fmt.Sprintf("v%d-%d", w, i))
				if _, err := c.Put(ctx, key, val, fencekv.WriteOptions{}); err != nil {
					errs <- fmt.Errorf("put %s: %w", key, err)
					return
				}
				e, err := c.Get(ctx, key)
				if err != nil || string(e.Value) != string(val) {
					errs <- fmt.Errorf("get %s = %q, %v; want %q", key, e.Value, err, val)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range each {
			err := c.Call(ctx, "put", map[string]any{"key": "k", "value": make(chan int)}, nil)
			var ce *wire.ConnError
			if err == nil || errors.As(err, &ce) || errors.Is(err, fencekv.ErrBadRequest) {
				errs <- fmt.Errorf("unencodable call: %v, want the encoder's error", err)
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if e, err := c.Get(ctx, []byte("k")); err != nil || e.Found {
		t.Fatalf("get k after the refused puts = %+v, %v; want not found", e, err)
	}
}
