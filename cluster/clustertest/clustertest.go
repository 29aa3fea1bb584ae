// Package clustertest runs real `fencekv serve` cluster nodes on loopback
// for tests: it builds the binary, starts nodes on free ports with temp
// data dirs, and injects process faults (kill -9, SIGSTOP/SIGCONT,
// restart) and, with Options.Proxy, network faults between nodes' raft
// traffic (cuts, one-way or both ways, delays, partitions that heal; see
// proxy.go). Every process it starts is stopped by its PID when the test
// ends.
//
//	bin := clustertest.Build(t)
//	c := clustertest.Start(t, bin, 3, &clustertest.Options{Proxy: true})
//	leader := c.Leader(t)
//	c.Isolate(leader) // the leader alone in a minority
//	c.Heal()
//	c.Kill(leader)
package clustertest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// Build builds the fencekv binary into the test's temp dir and returns
// its path.
func Build(tb testing.TB) string {
	tb.Helper()
	return BuildInto(tb, tb.TempDir())
}

// BuildInto builds the fencekv binary into dir (for a binary shared by
// several tests) and returns its path. It finds the module from the
// working directory.
func BuildInto(tb testing.TB, dir string) string {
	tb.Helper()
	return BuildTags(tb, dir)
}

// BuildTags is BuildInto with build tags (e.g. "failpoints", for the
// disk faults of package diskfault).
func BuildTags(tb testing.TB, dir string, tags ...string) string {
	tb.Helper()
	root, err := moduleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(dir, "fencekv")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command(gobin, append(args, "./cmd/fencekv")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("clustertest: go build: %v\n%s", err, out)
	}
	return bin
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("clustertest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Node is one node of a test cluster.
type Node struct {
	Name   string
	Dir    string
	Client string // client address
	Raft   string // where it listens for raft
	// RaftAdvertise is the raft address the other nodes dial: its fault
	// proxy's, or "" when the cluster has none (they dial Raft).
	RaftAdvertise string
	Gossip        string
	HTTP          string   // /metrics, /healthz, /readyz
	Extra         []string // more serve flags

	mu  sync.Mutex // guards cmd, log, exited
	cmd *exec.Cmd
	log *syncBuffer
	// exited is closed when the running process has exited.
	exited chan struct{}
}

// Cluster is a set of nodes started by Start.
type Cluster struct {
	Bin   string
	Nodes []*Node
	// Faults says what happens to the raft traffic between each pair of
	// nodes; nil unless the cluster was started with Options.Proxy.
	Faults *Faults
	tb     testing.TB
	dial   *wire.DialOptions // TLS and credentials of the cluster's own clients
	extra  []string          // Options.Extra
	// nodeExtra is Options.NodeExtra.
	nodeExtra func(name string) []string
	env       func(name string) []string // Options.Env
}

// Options tune Start.
type Options struct {
	Extra []string // serve flags for every node (e.g. "--reap-after", "2s")
	// NodeExtra, if set, gives more serve flags for the node called name
	// (n0, n1, ...): its own certificate, for instance.
	NodeExtra func(name string) []string
	// Dial holds the TLS and credentials with which the cluster's helpers
	// (Dial, Leader, Status, WaitWritable) reach the nodes.
	Dial *wire.DialOptions
	// Order, if set, is the order the nodes start in (indexes), each
	// after the one before it answers; by default all start at once.
	Order []int
	// Env, if set, gives more environment variables (KEY=value) for the
	// node called name: its failpoints file (package diskfault), say.
	Env func(name string) []string
	// Proxy puts a fault proxy in front of each node's raft listener, for
	// network faults (Cut, Isolate, Partition, SetLink, Heal).
	Proxy bool
}

// Start starts n nodes that bootstrap one cluster (--bootstrap-expect n,
// each joining the others), and waits until a leader serves writes.
func Start(tb testing.TB, bin string, n int, o *Options) *Cluster {
	tb.Helper()
	c := &Cluster{Bin: bin, tb: tb}
	var extra []string
	var nodeExtra func(string) []string
	if o != nil {
		extra, nodeExtra, c.dial, c.env = o.Extra, o.NodeExtra, o.Dial, o.Env
		if o.Proxy {
			c.Faults = NewFaults()
		}
	}
	c.extra, c.nodeExtra = extra, nodeExtra
	for i := range n {
		name := fmt.Sprintf("n%d", i)
		c.Nodes = append(c.Nodes, c.newNode(name, c.flagsOf(name)))
	}
	tb.Cleanup(c.stopAll)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if o != nil && o.Order != nil {
		order = o.Order
	}
	for _, i := range order {
		nd := c.Nodes[i]
		c.launch(nd, []string{"--bootstrap-expect", fmt.Sprint(n), "--join", c.gossipList(nd)})
		if o != nil && o.Order != nil {
			c.waitAnswers(tb, nd)
		}
	}
	c.WaitWritable(tb, 30*time.Second)
	return c
}

// Seed starts a new cluster of n nodes from a data dir restored from a
// backup: prepare builds the first node's data dir (fencekv.Restore into
// the dir it is given); that node starts alone with --bootstrap-expect 1
// and seeds the cluster once it leads; the others start on empty dirs and
// join it. It returns once every node answers.
func Seed(tb testing.TB, bin string, n int, o *Options, prepare func(dir string)) *Cluster {
	tb.Helper()
	c := &Cluster{Bin: bin, tb: tb}
	if o != nil {
		c.extra, c.nodeExtra, c.dial = o.Extra, o.NodeExtra, o.Dial
	}
	first := c.newNode("n0", c.flagsOf("n0"))
	prepare(first.Dir)
	c.Nodes = append(c.Nodes, first)
	tb.Cleanup(c.stopAll)
	c.launch(first, []string{"--bootstrap-expect", "1"})
	c.WaitWritable(tb, 30*time.Second)
	for range n - 1 {
		c.waitAnswers(tb, c.Add(tb))
	}
	return c
}

// waitAnswers waits until nd answers status.
func (c *Cluster) waitAnswers(tb testing.TB, nd *Node) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := c.Status(nd); err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("clustertest: %s does not answer within 30s", nd.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// flagsOf is the serve flags Start's options give the node called name.
func (c *Cluster) flagsOf(name string) []string {
	flags := append([]string{}, c.extra...)
	if c.nodeExtra != nil {
		flags = append(flags, c.nodeExtra(name)...)
	}
	return flags
}

// newNode reserves addresses and a data dir for a node.
// newNode reserves addresses and a data dir for a node, and starts its
// fault proxy if the cluster has them.
func (c *Cluster) newNode(name string, extra []string) *Node {
	nd := &Node{
		Name:   name,
		Dir:    filepath.Join(c.tb.TempDir(), name),
		Client: FreeAddr(c.tb),
		Raft:   FreeAddr(c.tb),
		Gossip: FreeAddr(c.tb),
		HTTP:   FreeAddr(c.tb),
		Extra:  extra,
	}
	if c.Faults != nil {
		p, err := NewProxy(nd.Name, nd.Raft, c.Faults)
		if err != nil {
			c.tb.Fatalf("clustertest: proxy for %s: %v", name, err)
		}
		c.tb.Cleanup(func() { p.Close() })
		nd.RaftAdvertise = p.Addr()
	}
	return nd
}

// gossipList is every other node's gossip address.
func (c *Cluster) gossipList(except *Node) string {
	var as []string
	for _, nd := range c.Nodes {
		if nd != except {
			as = append(as, nd.Gossip)
		}
	}
	return strings.Join(as, ",")
}

// Add starts one more node that joins the running cluster.
func (c *Cluster) Add(tb testing.TB, extra ...string) *Node {
	tb.Helper()
	name := fmt.Sprintf("n%d", len(c.Nodes))
	nd := c.newNode(name, append(c.flagsOf(name), extra...))
	join := c.gossipList(nd)
	c.Nodes = append(c.Nodes, nd)
	c.launch(nd, []string{"--join", join})
	return nd
}

// FreeAddr returns a loopback address with a port free for TCP and UDP
// (memberlist uses both). The port is below the kernel's ephemeral range,
// so that no connection or listener on port 0, in this test or any other
// process, is given it between now and when the node binds it (and binds
// it again after a restart).
// A port it returned is never returned again in this process: until its
// node binds it, it looks free (two nodes of one cluster were once given
// the same port, one's client address the other's HTTP address). Tests
// that start nodes in-process use it too.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	lo, hi := fixedPorts()
	givenMu.Lock()
	defer givenMu.Unlock()
	for range 200 {
		port := lo + rand.IntN(hi-lo)
		if given[port] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		given[port] = true
		return addr
	}
	tb.Fatal("clustertest: no free port for TCP and UDP")
	return ""
}

var (
	givenMu sync.Mutex
	given   = map[int]bool{} // ports FreeAddr returned
)

// fixedPorts is the range FreeAddr picks from: below the ephemeral ports
// (/proc/sys/net/ipv4/ip_local_port_range; 32768 by default).
func fixedPorts() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 12000 {
				hi = n
			}
		}
	}
	return 10000, hi
}

// launch starts the node's process.
func (c *Cluster) launch(nd *Node, extra []string) {
	args := []string{"serve", "--node", nd.Name, "--data", nd.Dir, "--listen", nd.Client,
		"--raft", nd.Raft, "--gossip", nd.Gossip, "--http", nd.HTTP, "--log-level", "info"}
	if nd.RaftAdvertise != "" {
		args = append(args, "--raft-advertise", nd.RaftAdvertise)
	}
	args = append(args, nd.Extra...)
	args = append(args, extra...)
	cmd := exec.Command(c.Bin, args...)
	if c.env != nil {
		cmd.Env = append(os.Environ(), c.env(nd.Name)...)
	}
	buf := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		c.tb.Fatalf("clustertest: start %s: %v", nd.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	nd.mu.Lock()
	nd.cmd, nd.log, nd.exited = cmd, buf, exited
	nd.mu.Unlock()
}

// Restart starts a stopped (killed) node again with its data dir.
func (c *Cluster) Restart(nd *Node) {
	c.launch(nd, []string{"--join", c.gossipList(nd)})
}

// PID is the node's process ID (0 if never started).
func (nd *Node) PID() int {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil || nd.cmd.Process == nil {
		return 0
	}
	return nd.cmd.Process.Pid
}

// Log is what the node's current process has printed.
func (nd *Node) Log() string {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.log == nil {
		return ""
	}
	return nd.log.String()
}

func (nd *Node) signal(sig syscall.Signal) error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return fmt.Errorf("clustertest: %s is not running", nd.Name)
	}
	return nd.cmd.Process.Signal(sig)
}

// Kill kills the node with SIGKILL and waits for it to exit.
func (c *Cluster) Kill(nd *Node) {
	if err := nd.signal(syscall.SIGKILL); err != nil {
		c.tb.Fatal(err)
	}
	c.waitExit(nd)
}

// Stop stops the node gracefully (SIGTERM; a paused node is resumed
// first) and waits for it to exit.
func (c *Cluster) Stop(nd *Node) {
	nd.signal(syscall.SIGCONT)
	if err := nd.signal(syscall.SIGTERM); err != nil {
		c.tb.Fatal(err)
	}
	c.waitExit(nd)
}

func (c *Cluster) waitExit(nd *Node) {
	nd.mu.Lock()
	exited := nd.exited
	nd.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		nd.signal(syscall.SIGKILL)
		<-exited
		c.tb.Errorf("clustertest: %s did not exit within 30s", nd.Name)
	}
	nd.mu.Lock()
	nd.cmd = nil
	nd.mu.Unlock()
}

// Pause stops the node's process with SIGSTOP; Resume continues it.
func (c *Cluster) Pause(nd *Node) {
	if err := nd.signal(syscall.SIGSTOP); err != nil {
		c.tb.Fatal(err)
	}
}

// Resume continues a paused node (SIGCONT).
func (c *Cluster) Resume(nd *Node) {
	if err := nd.signal(syscall.SIGCONT); err != nil {
		c.tb.Fatal(err)
	}
}

// Running reports whether the node's process is running (or paused).
func (nd *Node) Running() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.cmd != nil
}

// stopAll stops every node still running, by PID; a test that failed
// gets each node's log.
func (c *Cluster) stopAll() {
	for _, nd := range c.Nodes {
		if nd.Running() {
			nd.signal(syscall.SIGCONT)
			nd.signal(syscall.SIGKILL)
			c.waitExit(nd)
		}
		if c.tb.Failed() {
			c.tb.Logf("--- log of %s ---\n%s", nd.Name, nd.Log())
		}
	}
}

// Dial connects a client to a node.
func (c *Cluster) Dial(tb testing.TB, nd *Node) *wire.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := wire.DialWith(ctx, nd.Client, c.dial)
	if err != nil {
		tb.Fatalf("clustertest: dial %s: %v", nd.Name, err)
	}
	tb.Cleanup(func() { cl.Close() })
	return cl
}

// Leader returns the node every running node agrees leads, waiting up to
// 30 seconds for one.
func (c *Cluster) Leader(tb testing.TB) *Node {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if nd := c.leader(); nd != nil {
			return nd
		}
		if time.Now().After(deadline) {
			tb.Fatal("clustertest: no leader within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) leader() *Node {
	var found *Node
	for _, nd := range c.Nodes {
		if !nd.Running() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := status(ctx, nd, c.dial)
		cancel()
		if err != nil {
			continue
		}
		if st.Role == "leader" {
			if found != nil {
				return nil // two say they lead: not settled yet
			}
			found = nd
		}
	}
	return found
}

// Status is what a node's status says of its role.
type Status struct {
	Role, Leader string
	Term         uint64
	Applied      uint64
}

func status(ctx context.Context, nd *Node, o *wire.DialOptions) (Status, error) {
	cl, err := wire.DialWith(ctx, nd.Client, o)
	if err != nil {
		return Status{}, err
	}
	defer cl.Close()
	st, err := cl.Status(ctx)
	return Status{Role: st.Role, Leader: st.Leader, Term: st.Term, Applied: st.AppliedIndex}, err
}

// Status reads a node's role, leader, term and applied index.
func (c *Cluster) Status(nd *Node) (Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return status(ctx, nd, c.dial)
}

// Others returns the running nodes other than nd.
func (c *Cluster) Others(nd *Node) []*Node {
	var out []*Node
	for _, o := range c.Nodes {
		if o != nd && o.Running() {
			out = append(out, o)
		}
	}
	return out
}

// WaitWritable waits until a write through some node is acknowledged.
func (c *Cluster) WaitWritable(tb testing.TB, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, nd := range c.Nodes {
			if !nd.Running() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			cl, err := wire.DialWith(ctx, nd.Client, c.dial)
			if err == nil {
				_, err = cl.Put(ctx, []byte("clustertest/ready"), []byte("1"), fencekv.WriteOptions{})
				cl.Close()
			}
			cancel()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			for _, nd := range c.Nodes {
				tb.Logf("--- log of %s ---\n%s", nd.Name, nd.Log())
			}
			tb.Fatalf("clustertest: no write acknowledged within %v", within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// SetLink sets what happens to the raft bytes from one node to another
// (see Link). The cluster must have been started with Options.Proxy.
func (c *Cluster) SetLink(from, to *Node, l Link) {
	if c.Faults == nil {
		c.tb.Fatal("clustertest: network faults need Options.Proxy")
	}
	c.Faults.Set(from.Name, to.Name, l)
}

// Cut drops everything from sends to (one way: to may still reach from).
func (c *Cluster) Cut(from, to *Node) { c.SetLink(from, to, Link{Mode: Drop}) }

// Isolate cuts nd off from every other node, both ways: a leader isolated
// is alone in a minority; a follower isolated is cut off from the leader
// and the rest.
func (c *Cluster) Isolate(nd *Node) {
	for _, o := range c.Nodes {
		if o != nd {
			c.Cut(nd, o)
			c.Cut(o, nd)
		}
	}
}

// Partition cuts every link, both ways, between nodes of different
// groups; links within a group are left as they are.
func (c *Cluster) Partition(groups ...[]*Node) {
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					c.Cut(a, b)
					c.Cut(b, a)
				}
			}
		}
	}
}

// Heal makes every link pass again.
func (c *Cluster) Heal() {
	if c.Faults != nil {
		c.Faults.HealAll()
	}
}

// syncBuffer collects a process's output; safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
