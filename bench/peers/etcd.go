package peers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv/bench"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// ErrStale is returned by a driver's Put whose token is below the key's
// fence.
var ErrStale = errors.New("stale token")

// ErrHeld is returned by a driver's Acquire without a wait when the lock is
// held.
var ErrHeld = errors.New("lock held")

// DialEtcd returns a Dialer of the etcd cluster at endpoints (URLs): each
// Driver is a clientv3.Client of its own (one gRPC connection) with one
// session for its locks, whose lease TTL is the first Acquire's ttl. With
// several endpoints (a cluster's members) the Drivers are spread over
// them, one after another, each connected to its one member, as
// fencekv's are.
func DialEtcd(endpoints []string) bench.Dialer {
	var next atomic.Uint64
	return func(ctx context.Context) (bench.Driver, error) {
		ep := endpoints[(next.Add(1)-1)%uint64(len(endpoints))]
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{ep},
			DialTimeout: 5 * time.Second,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			return nil, err
		}
		// clientv3.New does not wait for the connection: make it now, so
		// that the first op does not pay for it.
		if _, err := c.Get(ctx, "bench/dial"); err != nil {
			c.Close()
			return nil, fmt.Errorf("etcd %v: %w", endpoints, err)
		}
		return &etcdDriver{c: c, held: make(map[string]*concurrency.Mutex)}, nil
	}
}

// etcdDriver is used by one goroutine at a time (bench.Driver's contract).
type etcdDriver struct {
	c    *clientv3.Client
	s    *concurrency.Session // made by the first Acquire
	held map[string]*concurrency.Mutex
}

var _ bench.Driver = (*etcdDriver)(nil)

func (d *etcdDriver) session(ttl time.Duration) (*concurrency.Session, error) {
	if d.s == nil {
		s, err := concurrency.NewSession(d.c, concurrency.WithTTL(max(1, int(ttl.Round(time.Second)/time.Second))))
		if err != nil {
			return nil, err
		}
		d.s = s
	}
	return d.s, nil
}

func (d *etcdDriver) Acquire(ctx context.Context, lock string, ttl, wait time.Duration) (uint64, error) {
	s, err := d.session(ttl)
	if err != nil {
		return 0, err
	}
	m := concurrency.NewMutex(s, lock)
	if wait == 0 {
		if err := m.TryLock(ctx); err != nil {
			if errors.Is(err, concurrency.ErrLocked) {
				return 0, ErrHeld
			}
			return 0, err
		}
	} else {
		wctx, cancel := context.WithTimeout(ctx, wait)
		err := m.Lock(wctx)
		cancel()
		if err != nil {
			return 0, err
		}
	}
	d.held[lock] = m
	// The revision the grant was made at: the lock key's create revision
	// when uncontended, else the revision at which the waiter saw its
	// turn. Either is above every earlier holder's token and fences, since
	// the earlier holder's key was deleted before it.
	return uint64(m.Header().Revision), nil
}

func (d *etcdDriver) Release(ctx context.Context, lock string, token uint64) error {
	m := d.held[lock]
	if m == nil {
		return fmt.Errorf("release %s: not held by this client", lock)
	}
	delete(d.held, lock)
	return m.Unlock(ctx)
}

// tokenText makes tokens compare as numbers do when etcd compares values
// as bytes.
func tokenText(t uint64) string { return fmt.Sprintf("%020d", t) }

func (d *etcdDriver) Put(ctx context.Context, key string, value []byte, token uint64) error {
	fence := "fence/" + key
	tok := tokenText(token)
	// If the fence is above the token, refuse (and read the fence for the
	// error); else write the value and raise the fence, in one Txn. A
	// value comparison on a missing key is false, so a key never fenced
	// is written.
	resp, err := d.c.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(fence), ">", tok)).
		Then(clientv3.OpGet(fence)).
		Else(clientv3.OpPut(key, string(value)), clientv3.OpPut(fence, tok)).
		Commit()
	if err != nil {
		return err
	}
	if resp.Succeeded {
		have := "?"
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			if f, err := strconv.ParseUint(string(kvs[0].Value), 10, 64); err == nil {
				have = strconv.FormatUint(f, 10)
			}
		}
		return fmt.Errorf("%w: token %d is below fence %s", ErrStale, token, have)
	}
	return nil
}

func (d *etcdDriver) Get(ctx context.Context, key string) ([]byte, bool, error) {
	resp, err := d.c.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return nil, false, err
	}
	return resp.Kvs[0].Value, true, nil
}

func (d *etcdDriver) Close() error {
	if d.s != nil {
		d.s.Close() // revokes the lease: frees any lock still held
	}
	return d.c.Close()
}
