package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
)

// Membership by gossip. Each node publishes its name and addresses (and
// whether it has raft state) in its memberlist metadata. A new cluster
// bootstraps once BootstrapExpect servers without state see each other
// (every one of them bootstraps the same configuration, as Consul does).
// After that the leader adds to the raft configuration every server it
// sees by gossip, and removes one that gossip has found dead for longer
// than ReapAfter, as long as the servers still alive keep a quorum.

// goneNode is a node gossip has found dead or left, and since when.
type goneNode struct {
	since time.Time
	state string
}

// nodeMeta is what a node tells the others about itself.
type nodeMeta struct {
	Client string `json:"client"`
	Raft   string `json:"raft"`
	Gossip string `json:"gossip"`
	State  bool   `json:"state"` // it has raft state (bootstrapped, or joined a cluster)
	// Leaving: it is shutting down (SIGTERM) and leaves gossip next.
	Leaving bool `json:"leaving,omitempty"`
}

// members is memberlist's delegate: it serves this node's metadata and
// keeps what it learns of the others.
type members struct {
	n    *Node
	mu   sync.Mutex          // guards self, all, gone
	self nodeMeta            // this node's metadata
	all  map[string]nodeMeta // by node name, every node seen (alive or not)
	gone map[string]goneNode // nodes gossip has found dead or left
	kick chan struct{}       // a change the bootstrap and reconcile loops look at
	// joined is closed once a member listed in Join has answered.
	joined chan struct{}
}

var (
	_ memberlist.Delegate      = (*members)(nil)
	_ memberlist.EventDelegate = (*members)(nil)
)

func (d *members) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, _ := json.Marshal(d.self)
	if len(b) > limit {
		return nil
	}
	return b
}

func (d *members) NotifyMsg([]byte)                           {}
func (d *members) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *members) LocalState(join bool) []byte                { return nil }
func (d *members) MergeRemoteState(buf []byte, join bool)     {}

func (d *members) NotifyJoin(node *memberlist.Node)   { d.update(node, "alive") }
func (d *members) NotifyUpdate(node *memberlist.Node) { d.update(node, "alive") }

// NotifyLeave is called for a node that left or was found dead. The node
// it is given still says alive either way (memberlist v0.6 sets the state
// of its own record only): one that left said it was leaving first.
func (d *members) NotifyLeave(node *memberlist.Node) {
	state := "dead"
	var m nodeMeta
	if node.State == memberlist.StateLeft || json.Unmarshal(node.Meta, &m) == nil && m.Leaving {
		state = "left"
	}
	d.update(node, state)
}

func (d *members) update(node *memberlist.Node, state string) {
	alive := state == "alive"
	var m nodeMeta
	if err := json.Unmarshal(node.Meta, &m); err != nil {
		d.n.log.Debug("gossip: a member without fencekv metadata", "member", node.Name, "err", err)
		return
	}
	d.n.log.Debug("gossip: member changed", "member", node.Name, "state", state)
	d.mu.Lock()
	d.all[node.Name] = m
	if alive {
		delete(d.gone, node.Name)
	} else if g, ok := d.gone[node.Name]; !ok {
		d.gone[node.Name] = goneNode{time.Now(), state}
	} else {
		g.state = state
		d.gone[node.Name] = g
	}
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// meta returns what gossip knows of a node.
func (d *members) meta(name string) (nodeMeta, bool) {
	if d == nil {
		return nodeMeta{}, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if name == d.n.cfg.Name {
		return d.self, true
	}
	m, ok := d.all[name]
	return m, ok
}

// startGossip starts memberlist on the gossip address, joins the given
// members (retrying in the background until one answers), and starts the
// bootstrap loop if the node has no raft state.
func (n *Node) startGossip() error {
	host, port, err := net.SplitHostPort(n.cfg.GossipAddr)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("cluster: gossip port %q: %w", port, err)
	}
	hasState, err := raft.HasExistingState(n.logs, n.store, nopSnapshots{})
	if err != nil {
		return err
	}
	n.mdel = &members{
		n:      n,
		self:   nodeMeta{Client: n.cfg.ClientAddr, Raft: n.cfg.raftAdvertise(), Gossip: n.cfg.GossipAddr, State: hasState},
		all:    map[string]nodeMeta{},
		gone:   map[string]goneNode{},
		kick:   make(chan struct{}, 1),
		joined: make(chan struct{}),
	}
	mc := memberlist.DefaultLANConfig()
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		mc = memberlist.DefaultLocalConfig()
	}
	mc.Name = n.cfg.Name
	mc.BindAddr, mc.BindPort = host, p
	mc.AdvertiseAddr, mc.AdvertisePort = host, p
	mc.Delegate = n.mdel
	mc.Events = n.mdel
	mc.Logger = log.New(slogWriter{n.log.With("component", "gossip")}, "", 0) // no timestamp of its own
	if len(n.cfg.GossipKey) > 0 {
		// Encrypts and authenticates every gossip message (AES-GCM);
		// a member without the key can neither join nor be heard.
		mc.SecretKey = n.cfg.GossipKey
	}
	n.ml, err = memberlist.Create(mc)
	if err != nil {
		return fmt.Errorf("cluster: gossip: %w", err)
	}
	if len(n.cfg.Join) > 0 {
		n.wg.Go(n.joinLoop)
	}
	if !hasState && n.cfg.BootstrapExpect > 0 {
		n.wg.Go(n.bootstrapLoop)
	}
	if !hasState {
		n.wg.Go(n.advertiseState)
	}
	return nil
}

// advertiseState tells gossip once a node that started without raft state
// has some (it was added, and its leader sent it entries), so that no
// node that lost its data dir takes the cluster for a new one, and
// bootstraps another, because the members it sees all say they have none.
func (n *Node) advertiseState() {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		if n.raft.LastIndex() == 0 {
			continue
		}
		n.hasState()
		return
	}
}

// hasState tells gossip that this node has raft state, if it has not yet.
func (n *Node) hasState() {
	n.mdel.mu.Lock()
	had := n.mdel.self.State
	n.mdel.self.State = true
	n.mdel.mu.Unlock()
	if had {
		return
	}
	if err := n.ml.UpdateNode(time.Second); err != nil {
		n.log.Warn("gossip update", "err", err)
	}
}

// nopSnapshots lets raft.HasExistingState look at the log and term only.
type nopSnapshots struct{ raft.SnapshotStore }

func (nopSnapshots) List() ([]*raft.SnapshotMeta, error) { return nil, nil }

// A join that no member answers is logged at warn after joinWarnAfter,
// and every joinWarnEvery after that (variables for tests).
var (
	joinWarnAfter = 10 * time.Second
	joinWarnEvery = 30 * time.Second
)

// joinLoop joins the listed members, retrying until one answers.
func (n *Node) joinLoop() {
	backoff := 100 * time.Millisecond
	began, warned := time.Now(), time.Time{}
	for {
		k, err := n.ml.Join(n.cfg.Join)
		if k > 0 {
			n.log.Info("joined the cluster's gossip", "via", n.cfg.Join, "answered", k)
			close(n.mdel.joined)
			return
		}
		// The others may start later; a wrong --join never answers.
		if time.Since(began) >= joinWarnAfter && time.Since(warned) >= joinWarnEvery {
			warned = time.Now()
			n.log.Warn("no member listed in --join answers yet; still trying (is --join right?)", "join", n.cfg.Join,
				"for", time.Since(began).Round(time.Second), "err", err)
		} else {
			n.log.Debug("join: no member answered yet; retrying", "err", err, "in", backoff)
		}
		select {
		case <-n.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// bootstrapLoop bootstraps the raft configuration once BootstrapExpect
// servers, none of them with state, see each other.
func (n *Node) bootstrapLoop() {
	if len(n.cfg.Join) > 0 {
		// Not before the members listed answer: on its own, a node
		// sees only itself, and one that lost its data dir would
		// bootstrap a cluster of its own (with --bootstrap-expect 1),
		// in a term its old self had led.
		select {
		case <-n.mdel.joined:
		case <-n.stop:
			return
		}
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-n.mdel.kick:
		case <-tick.C:
		}
		if n.raft.Leader() != "" {
			return // joined a cluster that already runs
		}
		var servers []raft.Server
		fresh := true
		n.mdel.mu.Lock()
		for _, m := range n.mdel.all { // dead ones too: they had state
			fresh = fresh && !m.State
		}
		n.mdel.mu.Unlock()
		for _, node := range n.ml.Members() {
			if node.State != memberlist.StateAlive {
				continue
			}
			m, ok := n.mdel.meta(node.Name)
			if !ok {
				continue
			}
			fresh = fresh && !m.State
			servers = append(servers, raft.Server{ID: raft.ServerID(node.Name), Address: raft.ServerAddress(m.Raft), Suffrage: raft.Voter})
		}
		if !fresh {
			n.log.Info("a member already has raft state: waiting to be added, not bootstrapping")
			return
		}
		if len(servers) < n.cfg.BootstrapExpect {
			continue
		}
		slices.SortFunc(servers, func(a, b raft.Server) int { return strings.Compare(string(a.ID), string(b.ID)) })
		err := n.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
		if err != nil && err != raft.ErrCantBootstrap {
			n.log.Error("bootstrap", "err", err)
			continue
		}
		if err == nil {
			n.votes.bootstrapped() // not on ErrCantBootstrap: it had state already
		}
		n.log.Info("bootstrapped the cluster", "servers", len(servers))
		n.hasState()
		return
	}
}

// reconcileLoop runs on the leader: it adds the servers gossip sees and
// raft does not have, and reaps the ones gossip has found gone for longer
// than ReapAfter.
func (n *Node) reconcileLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		n.reconcile()
		select {
		case <-ctx.Done():
			return
		case <-n.mdel.kick:
		case <-tick.C:
		}
	}
}

func (n *Node) reconcile() {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	cfg := f.Configuration()
	inRaft := map[string]raft.Server{}
	for _, s := range cfg.Servers {
		inRaft[string(s.ID)] = s
	}
	alive := map[string]bool{}
	for _, node := range n.ml.Members() {
		if node.State != memberlist.StateAlive {
			continue
		}
		alive[node.Name] = true
		m, ok := n.mdel.meta(node.Name)
		if !ok {
			continue
		}
		s, ok := inRaft[node.Name]
		switch {
		case ok && string(s.Address) == m.Raft && s.Suffrage == raft.Voter:
			continue
		case ok && s.Suffrage == raft.Voter:
			// A voter at a new address: it keeps its vote.
			n.log.Info("a server's raft address changed", "server", node.Name, "raft", m.Raft)
			if err := n.raft.AddVoter(raft.ServerID(node.Name), raft.ServerAddress(m.Raft), 0, 0).Error(); err != nil {
				n.log.Warn("updating a server's address", "server", node.Name, "err", err)
				return
			}
		case ok && string(s.Address) == m.Raft:
			// A non-voter: a voter once it has caught up.
			if !n.caughtUpNode(m) {
				continue
			}
			n.log.Info("a new server has caught up: it votes from now on", "server", node.Name)
			if err := n.raft.AddVoter(raft.ServerID(node.Name), raft.ServerAddress(m.Raft), 0, 0).Error(); err != nil {
				n.log.Warn("promoting a server", "server", node.Name, "err", err)
				return
			}
		default:
			// A new server joins as a non-voter: if it were a voter at
			// once, a quorum could need the vote of a node that holds
			// nothing yet, and that does not vote until it has caught
			// up (votes.go).
			n.log.Info("adding a server to the raft configuration", "server", node.Name, "raft", m.Raft)
			if err := n.raft.AddNonvoter(raft.ServerID(node.Name), raft.ServerAddress(m.Raft), 0, 0).Error(); err != nil {
				n.log.Warn("adding a server", "server", node.Name, "err", err)
				return
			}
		}
	}
	n.mdel.mu.Lock()
	gone := map[string]time.Time{}
	for k, v := range n.mdel.gone {
		gone[k] = v.since
	}
	n.mdel.mu.Unlock()
	voters, live := 0, 0
	for _, s := range cfg.Servers {
		if s.Suffrage == raft.Voter {
			voters++
			if alive[string(s.ID)] || string(s.ID) == n.cfg.Name {
				live++
			}
		}
	}
	for _, s := range cfg.Servers {
		id := string(s.ID)
		since, ok := gone[id]
		if id == n.cfg.Name || alive[id] || !ok || time.Since(since) < n.cfg.ReapAfter {
			continue
		}
		// Never leave the live servers short of a quorum of what remains.
		if live < (voters-1)/2+1 {
			continue
		}
		n.log.Warn("removing a server gossip has found gone", "server", id, "since", since)
		if err := n.raft.RemoveServer(s.ID, 0, 0).Error(); err != nil {
			n.log.Warn("removing a server", "server", id, "err", err)
			return
		}
		if s.Suffrage == raft.Voter {
			voters--
		}
	}
}

// caughtUpNode reports whether the node gossip describes as m has applied
// everything this leader had committed when it asked (its status, on its
// client port), and so may vote.
func (n *Node) caughtUpNode(m nodeMeta) bool {
	if m.Client == "" {
		return false
	}
	target := n.raft.CommitIndex()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := n.dial(ctx, m.Client)
	if err != nil {
		return false
	}
	defer c.Close()
	st, err := c.Status(ctx)
	return err == nil && st.AppliedIndex >= target
}

// Member describes one node of the cluster.
type Member = fencekv.Member

// Term is the node's raft term, now (the wire method term, which a leader
// asks of each voter before it answers a read: read.go).
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }

// Members lists the nodes gossip and raft know of.
func (n *Node) Members(ctx context.Context) ([]fencekv.Member, error) {
	var out []fencekv.Member
	index := map[string]int{}
	_, leader := n.raft.LeaderWithID()
	var servers []raft.Server
	f := n.raft.GetConfiguration()
	known := f.Error() == nil
	if known {
		servers = f.Configuration().Servers
	}
	for _, node := range n.ml.Members() {
		m, _ := n.mdel.meta(node.Name)
		index[node.Name] = len(out)
		out = append(out, fencekv.Member{Node: node.Name, ClientAddr: m.Client, RaftAddr: m.Raft, GossipAddr: m.Gossip, State: stateName(node.State)})
	}
	n.mdel.mu.Lock()
	for name, m := range n.mdel.all {
		// A node gossip has found gone is a member while raft has it;
		// once reaped, it is not (else each node that saw it would list
		// it for good, and one that joined later not at all).
		if known && !slices.ContainsFunc(servers, func(s raft.Server) bool { return string(s.ID) == name }) {
			continue
		}
		if _, ok := index[name]; !ok {
			state := "dead"
			if g, ok := n.mdel.gone[name]; ok {
				state = g.state
			}
			index[name] = len(out)
			out = append(out, fencekv.Member{Node: name, ClientAddr: m.Client, RaftAddr: m.Raft, GossipAddr: m.Gossip, State: state})
		}
	}
	n.mdel.mu.Unlock()
	if known {
		for _, s := range servers {
			i, ok := index[string(s.ID)]
			if !ok {
				i = len(out)
				out = append(out, fencekv.Member{Node: string(s.ID), RaftAddr: string(s.Address), State: "unknown"})
			}
			out[i].Voter = s.Suffrage == raft.Voter
			out[i].RaftRole = "follower"
			if s.ID == leader {
				out[i].RaftRole = "leader"
			}
		}
	}
	slices.SortFunc(out, func(a, b fencekv.Member) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}

func stateName(s memberlist.NodeStateType) string {
	switch s {
	case memberlist.StateAlive:
		return "alive"
	case memberlist.StateSuspect:
		return "suspect"
	case memberlist.StateDead:
		return "dead"
	case memberlist.StateLeft:
		return "left"
	}
	return "unknown"
}

func role(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Follower:
		return "follower"
	case raft.Candidate:
		return "candidate"
	}
	return "shutdown"
}
