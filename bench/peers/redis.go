package peers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv/bench"
	"github.com/redis/go-redis/v9"
)

// Lua scripts: each runs atomically, and its writes reach the append-only
// file as one transaction (with appendfsync always, fsynced before the
// reply).
var (
	// KEYS[1] lock, KEYS[2] token counter; ARGV[1] holder, ARGV[2] TTL in
	// ms. Returns the new token, or 0 if the lock is held (writing
	// nothing).
	redisAcquire = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0`)

	// KEYS[1] lock; ARGV[1] holder. Deletes the lock only if the holder
	// still has it.
	redisRelease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

	// KEYS[1] a hash: field v the value, f the fence; ARGV[1] value,
	// ARGV[2] token. Refuses a token below the fence, else writes both.
	redisPut = redis.NewScript(`
local f = tonumber(redis.call('HGET', KEYS[1], 'f') or '0')
if tonumber(ARGV[2]) < f then
  return redis.error_reply('STALE ' .. f)
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'f', ARGV[2])
return 1`)
)

// redisTokens is the counter every grant's token comes from: one sequence
// for all locks, as fencekv has.
const redisTokens = "bench/tokens"

// Backoff of a waiting acquire: it polls, first after backoffMin, doubling
// up to backoffMax, each sleep jittered between half and all of it.
const (
	backoffMin = time.Millisecond
	backoffMax = 16 * time.Millisecond
)

var redisClients atomic.Uint64

// DialRedis returns a Dialer of the Redis server at addr (host:port): each
// Driver is a go-redis client with a pool of exactly one connection.
func DialRedis(addr string) bench.Dialer {
	return func(ctx context.Context) (bench.Driver, error) {
		c := redis.NewClient(&redis.Options{
			Addr:            addr,
			PoolSize:        1,
			MaxActiveConns:  1,
			DisableIdentity: true, // CLIENT SETINFO is Redis 7.2+
		})
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close()
			return nil, fmt.Errorf("redis %s: %w", addr, err)
		}
		id := redisClients.Add(1)
		return &redisDriver{
			c:      c,
			id:     strconv.FormatUint(id, 10) + "-" + strconv.FormatUint(rand.Uint64(), 36),
			rng:    rand.New(rand.NewPCG(rand.Uint64(), id)),
			holder: make(map[string]string),
		}, nil
	}
}

// redisDriver is used by one goroutine at a time (bench.Driver's contract).
type redisDriver struct {
	c      *redis.Client
	id     string // this client, in holder values
	grants uint64 // makes each grant's holder value unique
	rng    *rand.Rand
	holder map[string]string // lock → holder value of our grant
}

var _ bench.Driver = (*redisDriver)(nil)

func (d *redisDriver) Acquire(ctx context.Context, lock string, ttl, wait time.Duration) (uint64, error) {
	d.grants++
	holder := d.id + ":" + strconv.FormatUint(d.grants, 10)
	keys := []string{lock, redisTokens}
	ms := max(1, ttl.Milliseconds())
	deadline := time.Now().Add(wait)
	backoff := backoffMin
	for {
		t, err := redisAcquire.Run(ctx, d.c, keys, holder, ms).Uint64()
		if err != nil {
			return 0, err
		}
		if t != 0 {
			d.holder[lock] = holder
			return t, nil
		}
		if wait == 0 {
			return 0, ErrHeld
		}
		sleep := backoff/2 + time.Duration(d.rng.Int64N(int64(backoff/2)+1))
		if time.Now().Add(sleep).After(deadline) {
			return 0, fmt.Errorf("%w after waiting %v", ErrHeld, wait)
		}
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		backoff = min(2*backoff, backoffMax)
	}
}

func (d *redisDriver) Release(ctx context.Context, lock string, token uint64) error {
	holder, ok := d.holder[lock]
	if !ok {
		return fmt.Errorf("release %s: not held by this client", lock)
	}
	delete(d.holder, lock)
	return redisRelease.Run(ctx, d.c, []string{lock}, holder).Err()
}

func (d *redisDriver) Put(ctx context.Context, key string, value []byte, token uint64) error {
	err := redisPut.Run(ctx, d.c, []string{key}, value, token).Err()
	if err != nil && strings.HasPrefix(err.Error(), "STALE") {
		return fmt.Errorf("%w: token %d is below fence %s", ErrStale, token, strings.TrimPrefix(err.Error(), "STALE "))
	}
	return err
}

func (d *redisDriver) Get(ctx context.Context, key string) ([]byte, bool, error) {
	v, err := d.c.HGet(ctx, key, "v").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	return v, err == nil, err
}

func (d *redisDriver) Close() error { return d.c.Close() }
