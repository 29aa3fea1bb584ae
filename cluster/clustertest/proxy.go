package clustertest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// Network faults without root: a TCP proxy in front of each node's raft
// listener, in the test process, as etcd's robustness tests put one in
// front of each member.
//
// A node listens for raft on a private address and advertises its
// proxy's address (serve --raft-advertise), so every raft connection to
// node Y is one that some node X opened to Y's proxy. The proxy tells
// which node X is from the first request on the connection: every raft
// RPC carries its sender's server ID in its header, and the first one is
// decoded (and forwarded unchanged). So each proxy knows, for each of its
// connections, both ends, and one table (Faults) says for every ordered
// pair of nodes what happens to the bytes from one to the other:
//
//   - on a connection X opened to Y, X's requests are the bytes X→Y and
//     Y's responses the bytes Y→X;
//   - so cutting X→Y stops X's requests to Y and X's answers to Y's
//     requests: nothing X says reaches Y, and Y may still talk to X (a
//     one-way fault). Cutting both directions between X and every other
//     node isolates X.
//
// What a link can do to its bytes (Link):
//
//   - Pass: forward them.
//   - Delay: forward each chunk d after it arrived, in order.
//   - Drop: discard them (a blackhole: the sender sees no error and no
//     answer, and times out). A connection that lost bytes never carries
//     another: it is closed when its link stops dropping, so no stream
//     ever resumes with a hole in it (TCP would not deliver one either).
//   - Stall: hold them (and past a buffer, stop reading, so the sender
//     blocks); when the link passes again they arrive, in order.
//
// Only raft goes through the proxies. Gossip (memberlist, TCP and UDP)
// and the client port, over which a node forwards requests to the leader
// it knows, stay connected: a node cut off from raft still looks alive to
// gossip (so it is not reaped), and it learns who leads only through
// raft, so once its view of the leader times out it holds requests and
// answers unavailable. A fault in the tests is therefore a raft
// partition, which is what decides elections, commits and reads.

// Mode is what a link does with its bytes.
type Mode int

// The modes of a link.
const (
	Pass Mode = iota
	Drop
	Stall
	Delay
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Drop:
		return "drop"
	case Stall:
		return "stall"
	case Delay:
		return "delay"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Link is what happens to the raft bytes one node sends another.
type Link struct {
	Mode  Mode
	Delay time.Duration // with Mode Delay
}

func (l Link) String() string {
	if l.Mode == Delay {
		return fmt.Sprintf("delay %v", l.Delay)
	}
	return l.Mode.String()
}

// Faults is the table of links between nodes, by node name, shared by
// every proxy of a cluster. A link not set passes. Safe for concurrent
// use; a change applies at once to the connections already open.
type Faults struct {
	mu     sync.Mutex
	links  map[[2]string]Link
	change chan struct{} // closed (and replaced) on every change
}

// NewFaults returns a table where every link passes.
func NewFaults() *Faults {
	return &Faults{links: map[[2]string]Link{}, change: make(chan struct{})}
}

// Set sets the link from one node to another.
func (f *Faults) Set(from, to string, l Link) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l.Mode == Pass {
		delete(f.links, [2]string{from, to})
	} else {
		f.links[[2]string{from, to}] = l
	}
	close(f.change)
	f.change = make(chan struct{})
}

// HealAll makes every link pass.
func (f *Faults) HealAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.links)
	close(f.change)
	f.change = make(chan struct{})
}

// Get returns the link from one node to another, and a channel closed at
// the next change of the table.
func (f *Faults) Get(from, to string) (Link, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.links[[2]string{from, to}], f.change
}

// String lists the links that do not pass.
func (f *Faults) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.links) == 0 {
		return "all links pass"
	}
	var b bytes.Buffer
	for k, l := range f.links {
		fmt.Fprintf(&b, "%s→%s %s; ", k[0], k[1], l)
	}
	return b.String()
}

// Proxy forwards raft connections to one node, applying the Faults
// between the node that opened each connection and the node behind it.
type Proxy struct {
	node   string // the node behind it
	target string // its private raft address
	faults *Faults
	ln     net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target, the
// raft address of node. Close stops it.
func NewProxy(node, target string, faults *Faults) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{node: node, target: target, faults: faults, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the address the proxy listens on: the node's advertised raft
// address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

// handle forwards one connection: it learns the sender from the first
// request, dials the node, and pipes both ways under the faults.
func (p *Proxy) handle(in net.Conn) {
	defer p.untrack(in)
	from, first, err := identify(in)
	if err != nil {
		return // not raft, or gone before its first request
	}
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return // the node is down: so is the connection
	}
	if !p.track(out) {
		return
	}
	defer p.untrack(out)
	dead := make(chan struct{})
	var once sync.Once
	abort := func() {
		once.Do(func() {
			close(dead)
			in.Close()
			out.Close()
		})
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(in, out, from, p.node, first, dead, abort) })
	wg.Go(func() { p.pipe(out, in, p.node, from, nil, dead, abort) })
	wg.Wait()
}

// identify reads the first raft request from c and returns its sender's
// server ID and every byte read, to be forwarded.
func identify(c net.Conn) (string, []byte, error) {
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	var got bytes.Buffer
	r := bufio.NewReader(io.TeeReader(c, &got))
	if _, err := r.ReadByte(); err != nil { // the RPC type
		return "", nil, err
	}
	// Every raft request embeds raft.RPCHeader, whose fields msgpack
	// encodes inline with the request's own.
	var hdr struct{ ID []byte }
	if err := codec.NewDecoder(r, &codec.MsgpackHandle{}).Decode(&hdr); err != nil {
		return "", nil, err
	}
	if len(hdr.ID) == 0 {
		return "", nil, errors.New("clustertest proxy: a raft request without a sender ID")
	}
	return string(hdr.ID), got.Bytes(), nil
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst under the link from→to; first is forwarded
// before anything read from src. abort closes both connections and
// dead.
func (p *Proxy) pipe(src, dst net.Conn, from, to string, first []byte, dead <-chan struct{}, abort func()) {
	q := make(chan chunk, 256)
	go func() {
		defer close(q)
		if len(first) > 0 {
			q <- chunk{first, time.Now()}
		}
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{b[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		// Unblock the reader (it may be sending on q) and let it end.
		abort()
		for range q {
		}
	}()
	poisoned := false // bytes were dropped: the stream has a hole
	for {
		l, change := p.faults.Get(from, to)
		if poisoned && l.Mode != Drop {
			return // never deliver after a hole: close the connection
		}
		var c chunk
		select {
		case b, ok := <-q:
			if !ok {
				return // src ended: so does the connection
			}
			c = b
		case <-change:
			continue
		case <-dead:
			return
		}
		if !p.deliver(dst, c, from, to, dead) {
			if l, _ := p.faults.Get(from, to); l.Mode != Drop {
				return // dst failed
			}
			poisoned = true
		}
	}
}

// deliver writes c to dst once the link from→to lets it: it reports
// false if c was dropped, dst failed or the connection is dead.
func (p *Proxy) deliver(dst net.Conn, c chunk, from, to string, dead <-chan struct{}) bool {
	for {
		l, change := p.faults.Get(from, to)
		switch l.Mode {
		case Stall:
			select {
			case <-change:
			case <-dead:
				return false
			}
			continue
		case Drop:
			return false
		case Delay:
			if wait := time.Until(c.at.Add(l.Delay)); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-change:
					t.Stop()
					continue // look at the link again
				case <-dead:
					t.Stop()
					return false
				}
			}
		}
		_, err := dst.Write(c.b)
		return err == nil
	}
}
