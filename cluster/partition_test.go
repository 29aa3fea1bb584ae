package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/wire"
)

// Network partitions of the raft traffic, through clustertest's fault
// proxies (real processes, no root). Gossip and the client port stay
// connected: see clustertest's package doc.

// getValue reads key through cl within d: its value and fence, or the
// error.
func getValue(ctx context.Context, cl *wire.Client, key string, d time.Duration) (fencekv.Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return cl.Get(ctx, []byte(key))
}

// TestLeaderIsolatedInMinority: the leader alone in a minority. The
// majority elects a new leader and takes writes; the old leader
// acknowledges nothing and answers no stale read; healed, it follows and
// has the majority's writes.
func TestLeaderIsolatedInMinority(t *testing.T) {
	c := clustertest.Start(t, bin(t), 3, &clustertest.Options{Proxy: true})
	ctx := ctxT(t, 2*time.Minute)
	old := c.Leader(t)
	ocl := c.Dial(t, old)
	if _, err := ocl.Put(ctx, []byte("k"), []byte("v1"), fencekv.WriteOptions{Token: 1}); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(old)
	if err != nil {
		t.Fatal(err)
	}
	oldTerm := st.Term

	c.Isolate(old)
	// A write sent to the isolated leader cannot reach a quorum: it must
	// not be acknowledged.
	pending := make(chan error, 1)
	go func() {
		_, err := ocl.Put(ctx, []byte("k"), []byte("from-minority"), fencekv.WriteOptions{Token: 2})
		pending <- err
	}()
	rest := c.Others(old)
	ncl := c.Dial(t, rest[0])
	eventually(t, "write through the majority", 30*time.Second, func() error {
		_, err := ncl.Put(ctx, []byte("k"), []byte("v2"), fencekv.WriteOptions{Token: 5})
		return err
	})
	leader := c.Leader(t)
	if leader == old {
		t.Fatalf("the isolated %s still leads", old.Name)
	}
	if st, err := c.Status(leader); err != nil || st.Term <= oldTerm {
		t.Fatalf("new leader %s: term %d, %v; want above %d", leader.Name, st.Term, err, oldTerm)
	}
	select {
	case err := <-pending:
		if err == nil {
			t.Fatal("the isolated leader acknowledged a write")
		}
		t.Logf("write sent to the isolated leader: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the isolated leader never answered the write")
	}
	// The minority answers no read (v1 would be stale): it holds the
	// read for a leader, then answers unavailable.
	e, err := getValue(ctx, ocl, "k", 10*time.Second)
	if err == nil {
		t.Fatalf("the isolated old leader answered a read: %q fence %d", e.Value, e.Fence)
	}
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeUnavailable {
		t.Fatalf("read on the isolated node: %v; want unavailable", err)
	}

	c.Heal()
	eventually(t, "the healed node reads the majority's write", 30*time.Second, func() error {
		e, err := getValue(ctx, ocl, "k", 5*time.Second)
		if err != nil {
			return err
		}
		if string(e.Value) != "v2" || e.Fence != 5 {
			return fmt.Errorf("k = %q fence %d; want v2 fence 5", e.Value, e.Fence)
		}
		return nil
	})
	e, err = getValue(ctx, ncl, "k", 10*time.Second)
	if err != nil || string(e.Value) != "v2" {
		t.Fatalf("k after healing = %q, %v; want v2 (the minority's write never lands)", e.Value, err)
	}
}

// TestFollowerCutOff: the leader keeps the majority while one follower
// is cut off. Writes go on; the cut-off follower answers no stale read;
// healed, it catches up.
func TestFollowerCutOff(t *testing.T) {
	c := clustertest.Start(t, bin(t), 3, &clustertest.Options{Proxy: true})
	ctx := ctxT(t, 2*time.Minute)
	leader := c.Leader(t)
	f := c.Others(leader)[0]
	lcl, fcl := c.Dial(t, leader), c.Dial(t, f)
	c.Isolate(f)
	last := 0
	deadline := time.Now().Add(3 * time.Second)
	for i := 1; time.Now().Before(deadline); i++ {
		// Every write through the leader is acknowledged: it keeps a
		// quorum with the other follower.
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := lcl.Put(wctx, []byte("k"), []byte(strconv.Itoa(i)), fencekv.WriteOptions{})
		cancel()
		if err != nil {
			t.Fatalf("write %d through the leader with a follower cut off: %v", i, err)
		}
		last = i
		// A read through the cut-off follower is the latest or refused.
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		e, err := fcl.Get(rctx, []byte("k"))
		cancel()
		if err == nil && string(e.Value) != strconv.Itoa(i) {
			t.Fatalf("stale read through the cut-off follower: %q after %d was acknowledged", e.Value, i)
		}
	}
	if st, err := c.Status(leader); err != nil || st.Role != "leader" {
		t.Errorf("leader %s with one follower cut off: %+v, %v", leader.Name, st, err)
	}
	c.Heal()
	want := strconv.Itoa(last)
	eventually(t, "the healed follower catches up", 30*time.Second, func() error {
		e, err := fcl.Get(fencekv.WithStaleReads(ctx), []byte("k"))
		if err == nil && string(e.Value) != want {
			err = fmt.Errorf("k = %q; want %s", e.Value, want)
		}
		return err
	})
	st, _ := c.Status(c.Leader(t))
	t.Logf("%d writes while %s was cut off; leader after healing: term %d", last, f.Name, st.Term)
}

// TestPartitionsHeal: writers on every node while, round after round, one
// node (the leader or a follower, by turns) is partitioned from the other
// two and the partition heals. Every acknowledged write is on every node
// at the end, and tokens issued after each round are above those before.
func TestPartitionsHeal(t *testing.T) {
	c := clustertest.Start(t, bin(t), 3, &clustertest.Options{Proxy: true})
	ctx := ctxT(t, 3*time.Minute)
	var (
		mu    sync.Mutex
		acked = map[string]int{}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w, nd := range c.Nodes {
		cl := c.Dial(t, nd)
		wg.Go(func() {
			// A write that failed may still be applied, late: one held
			// by a node cut off from the leader is forwarded once the
			// partition heals, after the writes the client went on to.
			// So after a failure the writer moves to a new key: on each
			// key only its last write's outcome is unknown, and the value
			// kept is at least the last acknowledged.
			gen := 0
			for i := 1; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("p/%d/%d", w, gen)
				wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				_, err := cl.Put(wctx, []byte(key), []byte(strconv.Itoa(i)), fencekv.WriteOptions{})
				cancel()
				if err != nil {
					gen++
					continue
				}
				mu.Lock()
				acked[key] = i
				mu.Unlock()
			}
		})
	}
	acl := c.Dial(t, c.Nodes[0])
	acquire := func() fencekv.Token {
		var l fencekv.Lease
		eventually(t, "acquire", 30*time.Second, func() error {
			var err error
			l, err = acl.Acquire(ctx, "p/lock", time.Second, nil)
			if err == nil {
				err = acl.Release(ctx, "p/lock", l.Token)
			}
			return err
		})
		return l.Token
	}
	prev := acquire()
	for round := range 4 {
		leader := c.Leader(t)
		victim := leader
		if round%2 == 1 {
			victim = c.Others(leader)[0]
		}
		c.Partition([]*clustertest.Node{victim}, c.Others(victim))
		time.Sleep(1500 * time.Millisecond) // the partition lasts past an election timeout
		c.Heal()
		tok := acquire()
		if tok <= prev {
			t.Fatalf("round %d: token %d after the partition healed; want above %d", round, tok, prev)
		}
		t.Logf("round %d: partitioned %s (leader: %v); token %d after healing", round, victim.Name, victim == leader, tok)
		prev = tok
	}
	close(stop)
	wg.Wait()
	for _, nd := range c.Nodes {
		cl := c.Dial(t, nd)
		mu.Lock()
		for key, v := range acked {
			eventually(t, key+" on "+nd.Name, 30*time.Second, func() error {
				e, err := cl.Get(fencekv.WithStaleReads(ctx), []byte(key))
				if err != nil {
					return err
				}
				if got, _ := strconv.Atoi(string(e.Value)); got < v {
					return fmt.Errorf("%s = %q; want at least the acknowledged %d", key, e.Value, v)
				}
				return nil
			})
		}
		mu.Unlock()
	}
}
