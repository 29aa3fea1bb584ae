package fencekvtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// TestCheckSemaphore: the checker passes a history that keeps to the
// limit (a permit's span ends at its release call, or at Sent+TTL if that
// is sooner: an expired permit's slot may be granted again) and fails one
// with a permit too many, a token granted twice, or tokens that do not
// rise with real time.
func TestCheckSemaphore(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	p := func(tok, sent, ack, rel int) fencekvtest.Permit {
		r := fencekvtest.Permit{Token: fencekv.Token(tok), TTL: time.Second, Sent: at(sent), Ack: at(ack)}
		if rel >= 0 {
			r.Release = at(rel)
		}
		return r
	}
	good := []fencekvtest.Permit{p(1, 0, 1, 100), p(2, 0, 2, 100), p(3, 0, 3, 100),
		p(4, 50, 100, 200), // granted as the others' release calls were made
		p(5, 150, 160, -1), // never released: its span ends at Sent+TTL
		p(6, 200, 201, 300), p(7, 200, 202, 300),
		p(8, 1000, 1160, 1200), // 5 ran out at 1150
	}
	if err := fencekvtest.CheckSemaphore(good, 3); err != nil {
		t.Fatalf("a good history: %v", err)
	}
	for _, tc := range []struct {
		name, want string
		ps         []fencekvtest.Permit
	}{
		{"four at once", "4 permits live", append(good[:3:3], p(4, 50, 99, 200))},
		{"a token twice", "granted twice", append(good[:3:3], p(2, 150, 151, 160))},
		{"tokens fall", "is not above", []fencekvtest.Permit{p(5, 0, 1, 10), p(4, 20, 21, 30)}},
		{"expired too late", "4 permits live", append(good[:5:5], p(9, 900, 1140, 1200), p(10, 900, 1140, 1200), p(11, 900, 1145, 1200))},
	} {
		err := fencekvtest.CheckSemaphore(tc.ps, 3)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v; want %q", tc.name, err, tc.want)
		}
	}
}

// TestRunSemaphore: the workload against a server in this process keeps
// to the limit and uses all of it.
func TestRunSemaphore(t *testing.T) {
	addr, _ := fencekvtest.Serve(t, nil)
	var clients []*wire.Client
	for range 8 {
		c, err := wire.Dial(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	ps, st := fencekvtest.RunSemaphore(ctx, clients, fencekvtest.SemWorkload{Name: "S", Limit: 3, TTL: 2 * time.Second, Hold: 5 * time.Millisecond, Wait: time.Second, Retries: time.Second})
	if err := fencekvtest.CheckSemaphore(ps, 3); err != nil {
		t.Fatal(err)
	}
	if len(ps) < 20 || st.Failed > 0 || st.Released != len(ps) {
		t.Fatalf("%d permits, stats %+v", len(ps), st)
	}
	if err := fencekvtest.CheckSemaphore(ps, 2); err == nil {
		t.Error("the history keeps to a limit of 2: the workload did not use all 3 permits")
	}
}
