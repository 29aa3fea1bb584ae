package clustertest

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Two raft network transports in this process, "a" and "b", with b
// behind a proxy: the proxy learns that a is calling, and the faults
// between a and b do what they say to real raft RPCs.

type proxyRig struct {
	faults *Faults
	proxy  *Proxy
	a, b   *raft.NetworkTransport
}

func newProxyRig(t *testing.T) *proxyRig {
	t.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Output: io.Discard})
	newTrans := func() *raft.NetworkTransport {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		tr, err := raft.NewTCPTransportWithLogger(addr, nil, 2, 2*time.Second, logger)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	r := &proxyRig{faults: NewFaults(), a: newTrans(), b: newTrans()}
	var err error
	r.proxy, err = NewProxy("b", string(r.b.LocalAddr()), r.faults)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.proxy.Close() })
	// b answers every AppendEntries with success, naming itself.
	go func() {
		for rpc := range r.b.Consumer() {
			rpc.Respond(&raft.AppendEntriesResponse{RPCHeader: raft.RPCHeader{ID: []byte("b")}, Term: 1, Success: true}, nil)
		}
	}()
	return r
}

// call sends one AppendEntries from a to b through the proxy and returns
// how long it took, or its error.
func (r *proxyRig) call() (time.Duration, error) {
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("a"), Addr: []byte(r.a.LocalAddr())}, Term: 1,
		Entries: []*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("x")}}}
	var resp raft.AppendEntriesResponse
	start := time.Now()
	err := r.a.AppendEntries("b", raft.ServerAddress(r.proxy.Addr()), req, &resp)
	if err == nil && !resp.Success {
		err = io.ErrUnexpectedEOF
	}
	return time.Since(start), err
}

func TestProxyFaults(t *testing.T) {
	r := newProxyRig(t)
	if _, err := r.call(); err != nil {
		t.Fatalf("through a passing proxy: %v", err)
	}

	// Delay both ways: the round trip takes at least twice the delay.
	r.faults.Set("a", "b", Link{Mode: Delay, Delay: 100 * time.Millisecond})
	r.faults.Set("b", "a", Link{Mode: Delay, Delay: 100 * time.Millisecond})
	if d, err := r.call(); err != nil || d < 200*time.Millisecond {
		t.Fatalf("delayed call: %v, %v; want at least 200ms", d, err)
	}
	r.faults.HealAll()

	// Drop a→b: a's request is lost, a times out (the transport's 2s I/O
	// deadline); a request whose answer b→a is dropped fails the same way.
	for _, dir := range [][2]string{{"a", "b"}, {"b", "a"}} {
		r.faults.Set(dir[0], dir[1], Link{Mode: Drop})
		if d, err := r.call(); err == nil {
			t.Fatalf("call with %s→%s dropped succeeded after %v", dir[0], dir[1], d)
		}
		r.faults.HealAll()
		if _, err := r.call(); err != nil {
			t.Fatalf("after healing %s→%s: %v", dir[0], dir[1], err)
		}
	}

	// A cut between other nodes changes nothing here.
	r.faults.Set("c", "b", Link{Mode: Drop})
	if _, err := r.call(); err != nil {
		t.Fatalf("with only c→b cut: %v", err)
	}
	r.faults.HealAll()

	// Stall a→b: the request is held, and arrives once the link passes.
	r.faults.Set("a", "b", Link{Mode: Stall})
	done := make(chan error, 1)
	go func() {
		_, err := r.call()
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a call over a stalled link returned: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	r.faults.HealAll()
	if err := <-done; err != nil {
		t.Fatalf("stalled call after healing: %v", err)
	}
}
