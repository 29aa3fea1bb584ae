package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
)

// TestQueuedAcquireCutDuringHandOff: a queued acquire on the leader whose
// context ends (SIGTERM, the client gone) after the hand-off took it from
// the queue is answered by the hand-off's outcome: unavailable with
// outcome unknown if the hand-off's is unknown, or if it was granted (and
// released again, nobody using it). It used to be answered with the
// context's error, which the wire answers as unavailable without an
// outcome: not applied, though the grant was applied, or may yet be by
// the next leader, leaving the lock held by nobody who knew.
func TestQueuedAcquireCutDuringHandOff(t *testing.T) {
	nodes := inProcessCluster(t, 1)
	l := leaderOf(t, nodes, nil)
	ctx, cancelAll := context.WithTimeout(context.Background(), time.Minute)
	defer cancelAll()
	for _, granted := range []bool{false, true} {
		first, err := l.Acquire(ctx, "L", 30*time.Second, &fencekv.AcquireOptions{Holder: "first"})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		answer := make(chan error, 1)
		go func() {
			_, err := l.Acquire(wctx, "L", 30*time.Second, &fencekv.AcquireOptions{Holder: "second", Wait: 30 * time.Second})
			answer <- err
		}()
		for l.queues.Waiting("L") != 1 {
			if ctx.Err() != nil {
				t.Fatal("the acquire is not queued")
			}
			time.Sleep(5 * time.Millisecond)
		}
		w := l.queues.Pop("L") // what release does: the hand-off takes the waiter
		cancel()               // and the waiting caller's context ends meanwhile
		if granted {
			// The hand-off as release makes it: the release and the
			// waiter's acquire in one entry.
			term, err := l.awaitReady(ctx)
			if err != nil {
				t.Fatal(err)
			}
			now := l.now()
			rs, err := l.props.applyGroup(
				state.Command{Op: state.OpRelease, Now: now, Term: term, Lease: state.LeaseRequest{Name: "L"}, Token: first.Token},
				state.Command{Op: state.OpAcquire, Now: now, Term: term, Lease: w.Req})
			if err != nil || rs[1].Err != nil {
				t.Fatalf("hand-off: %v, %v", err, rs)
			}
			w.Finish(rs[1].Grant, nil)
		} else {
			w.Finish(state.Grant{}, &fencekv.Error{Code: fencekv.CodeUnavailable, Outcome: fencekv.OutcomeUnknown, Message: "injected: the hand-off's outcome is unknown"})
		}
		err = <-answer
		var fe *fencekv.Error
		if !errors.As(err, &fe) || fe.Code != fencekv.CodeUnavailable || fe.Outcome != fencekv.OutcomeUnknown {
			t.Fatalf("granted %v: acquire cut short during the hand-off: %v; want unavailable with outcome unknown", granted, err)
		}
		if granted {
			// Nobody uses the grant: it is released again.
			for {
				in, err := l.LockInfo(ctx, "L")
				if err != nil {
					t.Fatal(err)
				}
				if !in.Held {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("the unused grant is not released: %+v", in)
				}
				time.Sleep(5 * time.Millisecond)
			}
		} else if err := l.Release(ctx, "L", first.Token); err != nil {
			t.Fatal(err)
		}
	}
}
