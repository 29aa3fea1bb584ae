// Command locked-service is an example of a Go service that does its work
// under a fencekv lock, with the wire client's WithLock helper.
//
// Run several copies against one server (or cluster). Only one at a time
// holds the lock "examples/billing" and runs a billing pass. Each pass
// writes with held writes: the lease's token and the lock's name. So a
// copy that stalls past its lease (a GC pause, a suspended VM) cannot land
// its late writes: the store refuses them with lease_expired, or
// stale_token once another copy has written.
//
//	go run ./examples/locked-service -addr 127.0.0.1:7420
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

func main() {
	addrs := flag.String("addr", "127.0.0.1:7420", "fencekv server, or a cluster's nodes, comma-separated")
	lock := flag.String("lock", "examples/billing", "the lock to hold while working")
	ttl := flag.Duration("ttl", 10*time.Second, "the lease; WithLock renews it")
	every := flag.Duration("every", 2*time.Second, "pause between passes")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	c, err := wire.DialCluster(ctx, strings.Split(*addrs, ","), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	for ctx.Err() == nil {
		// WithLock waits for the lock, runs the function while it renews
		// the lease, cancels the function's context if the lease may be
		// lost, and releases the lock after.
		err := c.WithLock(ctx, *lock, *ttl, &wire.LockOptions{AcquireOptions: fencekv.AcquireOptions{Wait: time.Minute}},
			func(ctx context.Context, l fencekv.Lease) error {
				return billingPass(ctx, c, l)
			})
		switch {
		case err == nil:
		case errors.Is(err, wire.ErrLeaseLost):
			log.Printf("lease lost during the pass; its late writes, if any, were refused")
		case errors.Is(err, fencekv.ErrLockHeld):
			log.Printf("another copy holds %s; trying again", *lock)
		case ctx.Err() != nil:
			return
		default:
			log.Printf("pass failed: %v", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(*every):
		}
	}
}

// billingPass is one unit of work done under the lease l. Every write is
// a held write: fenced by l.Token and accepted only while l is held.
func billingPass(ctx context.Context, c *wire.Client, l fencekv.Lease) error {
	held := fencekv.WriteOptions{Token: l.Token, Lock: l.Name}
	n, _, err := c.Incr(ctx, []byte("examples/billing/passes"), 1, held)
	if err != nil {
		return fmt.Errorf("count the pass: %w", err)
	}
	host, _ := os.Hostname()
	msg := fmt.Sprintf("pass %d by %s (pid %d) with token %d at %s", n, host, os.Getpid(), l.Token, time.Now().UTC().Format(time.RFC3339))
	if _, err := c.Put(ctx, []byte("examples/billing/last"), []byte(msg), held); err != nil {
		if errors.Is(err, fencekv.ErrStaleToken) || errors.Is(err, fencekv.ErrLeaseExpired) {
			// Someone newer holds the lock: stop, and never retry this
			// write with this token.
			return fmt.Errorf("refused by fencing: %w", err)
		}
		return err
	}
	log.Print(msg)
	return nil
}
