package verify

// TestLinearizableMembership and TestGrowFromOne run the linearizability
// workload of TestLinearizableCluster (the same model, clients, term
// watch and history checks) against a cluster whose membership changes
// under it, one step at a time:
//
//	add a node (it joins by gossip, as a non-voter, and is made a voter
//	once it has caught up);
//	SIGTERM a voter, and wait until the leader reaps it (--reap-after);
//	kill -9 a voter, and wait until it is reaped;
//	replace a voter: kill -9 it and start a fresh node, on an empty data
//	dir under a new name; the dead one is reaped, the new one votes.
//
// After each step the test waits until every running node tells the
// truth about it (clustertest.CheckMembers): its status names the one
// leader; wire members lists exactly the voters the test made, each
// alive, and no other node in raft; /metrics counts those voters alive
// and none in any other state. Clients dial random nodes of a list that
// grows with each node added (removed nodes stay on it: a client's
// stale list). Beyond the model, the checks of TestLinearizableCluster
// hold across every step: tokens only rise and are never granted twice,
// and no write below a fence is accepted.
//
// A step whose victim was not the leader moves no lease: the model may
// take a lease as run out across it, unless the term watch saw a new
// term.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/fencekv/fencekv/cluster/clustertest"
)

// memberReapAfter is the nodes' --reap-after: a dead voter is removed
// this long after gossip found it dead.
const memberReapAfter = "1s"

// memberSettle bounds the wait for the members to agree after a step:
// gossip finds a killed node dead within seconds (its suspicion timeout
// grows when few members confirm it), then --reap-after.
const memberSettle = time.Minute

func TestLinearizableMembership(t *testing.T) {
	cfg := linClusterConfig{clients: 8, faults: len(memberSteps), gap: [2]time.Duration{300 * time.Millisecond, 900 * time.Millisecond},
		minOps: 40, checkTime: 2 * time.Minute}
	next := func(m *memberRun, k int) memberStep { return memberSteps[k] }
	if verifyLong() {
		cfg = linClusterConfig{clients: 10, faults: 30, gap: [2]time.Duration{500 * time.Millisecond, 3 * time.Second},
			minOps: 100, checkTime: 15 * time.Minute}
		next = (*memberRun).randomStep
	}
	c := clustertest.Start(t, fencekvBinary(t), 3, &clustertest.Options{Extra: []string{"--reap-after", memberReapAfter}})
	runMembership(t, cfg, c, next)
}

// TestGrowFromOne grows a cluster from one node bootstrapped alone to
// three under load, then kills the first node with -9: the other two
// keep serving, with every acknowledged write (the model's last reads)
// and no token granted twice or below one granted before.
func TestGrowFromOne(t *testing.T) {
	cfg := linClusterConfig{clients: 6, faults: 3, gap: [2]time.Duration{500 * time.Millisecond, 1000 * time.Millisecond},
		minOps: 40, checkTime: 2 * time.Minute}
	if verifyLong() {
		cfg.clients, cfg.minOps, cfg.gap = 10, 200, [2]time.Duration{2 * time.Second, 5 * time.Second}
	}
	c := clustertest.Start(t, fencekvBinary(t), 1, &clustertest.Options{Extra: []string{"--reap-after", memberReapAfter}})
	first := c.Nodes[0]
	steps := []memberStep{addStep, addStep, {"kill -9 the first node", func(m *memberRun, leader *clustertest.Node) (string, bool) {
		m.remove(first, false)
		return first.Name, first == leader
	}}}
	runMembership(t, cfg, c, func(m *memberRun, k int) memberStep { return steps[k] })
}

// memberRun is a run whose faults are membership steps.
type memberRun struct {
	t      *testing.T
	r      *linRun
	c      *clustertest.Cluster
	target *clusterTarget
	terms  *termWatch
	wg     *sync.WaitGroup
	rng    *rand.Rand
	voters []*clustertest.Node // what the steps made the raft configuration
}

// A memberStep changes the membership and sets m.voters to what the
// configuration must become; it returns the nodes it touched, and whether
// one of them was the leader.
type memberStep struct {
	name string
	do   func(m *memberRun, leader *clustertest.Node) (nodes string, leaderHit bool)
}

var addStep = memberStep{"add a node", func(m *memberRun, _ *clustertest.Node) (string, bool) {
	return m.add().Name, false
}}

// memberSteps is the short form: each step once, from three voters to
// five and back to three.
var memberSteps = []memberStep{
	addStep,
	addStep,
	{"SIGTERM a follower", func(m *memberRun, leader *clustertest.Node) (string, bool) {
		f := m.victim(leader, false)
		m.remove(f, true)
		return f.Name, false
	}},
	{"kill -9 a follower", func(m *memberRun, leader *clustertest.Node) (string, bool) {
		f := m.victim(leader, false)
		m.remove(f, false)
		return f.Name, false
	}},
	{"replace a follower by a fresh node under a new name", func(m *memberRun, leader *clustertest.Node) (string, bool) {
		return m.replace(m.victim(leader, false)), false
	}},
}

// randomStep is the long form's next step: at random, keeping three to
// five voters, on any voter, the leader included.
func (m *memberRun) randomStep(int) memberStep {
	var choices []memberStep
	if len(m.voters) < 5 {
		choices = append(choices, addStep)
	}
	if len(m.voters) > 3 {
		for _, graceful := range []bool{true, false} {
			name := "kill -9 a voter"
			if graceful {
				name = "SIGTERM a voter"
			}
			choices = append(choices, memberStep{name, func(m *memberRun, leader *clustertest.Node) (string, bool) {
				v := m.victim(leader, true)
				m.remove(v, graceful)
				return v.Name, v == leader
			}})
		}
	}
	choices = append(choices, memberStep{"replace a voter by a fresh node under a new name", func(m *memberRun, leader *clustertest.Node) (string, bool) {
		v := m.victim(leader, true)
		return m.replace(v), v == leader
	}})
	return choices[m.rng.IntN(len(choices))]
}

// add starts a node on an empty dir under a new name; it joins, and
// clients and the term watch reach it from now on.
func (m *memberRun) add() *clustertest.Node {
	nd := m.c.Add(m.t)
	m.target.add(nd)
	m.terms.watch(m.r, nd, m.wg)
	m.voters = append(m.voters, nd)
	return nd
}

// remove stops nd (SIGTERM if graceful, else kill -9) for good: the
// leader must reap it.
func (m *memberRun) remove(nd *clustertest.Node, graceful bool) {
	if graceful {
		m.c.Stop(nd)
	} else {
		m.c.Kill(nd)
	}
	m.terms.forget(nd)
	m.voters = slices.DeleteFunc(m.voters, func(v *clustertest.Node) bool { return v == nd })
}

// replace kills nd with -9, its disk lost, and starts a fresh node in
// its place under a new name.
func (m *memberRun) replace(nd *clustertest.Node) string {
	m.remove(nd, false)
	return nd.Name + " by " + m.add().Name
}

// victim picks a voter at random: any, or one other than the leader.
func (m *memberRun) victim(leader *clustertest.Node, anyVoter bool) *clustertest.Node {
	var from []*clustertest.Node
	for _, v := range m.voters {
		if anyVoter || v != leader {
			from = append(from, v)
		}
	}
	return from[m.rng.IntN(len(from))]
}

// runMembership runs the workload against c (every node of it a voter)
// with cfg.faults membership steps, step k from next, each after a gap
// of load, and checks the history.
func runMembership(t *testing.T, cfg linClusterConfig, c *clustertest.Cluster, next func(m *memberRun, k int) memberStep) {
	seed := testSeed(t)
	target := newClusterTarget(c)
	r := &linRun{t: t, target: target, cluster: true, start: time.Now(), ops: newOpCounter()}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		r.done.Store(true)
		r.cancel()
		wg.Wait()
	}()
	m := &memberRun{t: t, r: r, c: c, target: target, wg: &wg, rng: rand.New(rand.NewPCG(seed, math.MaxUint64)),
		voters: append([]*clustertest.Node(nil), c.Nodes...)}
	c.WaitMembers(t, m.voters, memberSettle)
	r.startClients(&wg, cfg.clients, seed)
	m.terms = watchTerms(r, c, &wg)

	// The main goroutine owns the cluster: one step at a time, each
	// settled (every node's view agrees with it) before the next.
	var faults []faultRec
	var windows [][2]int64
	var annotations []porcupine.Annotation
	for k := range cfg.faults {
		r.ops.await(t, cfg.minOps, randDuration(m.rng, cfg.gap[0], cfg.gap[1]), "clients completed")
		step := next(m, k)
		leader := c.Leader(t)
		at := r.now()
		nodes, leaderHit := step.do(m, leader)
		took := c.WaitMembers(t, m.voters, memberSettle)
		end := r.now()
		faults = append(faults, faultRec{name: step.name, start: at, end: end})
		if leaderHit {
			windows = append(windows, [2]int64{at, end})
		}
		annotations = append(annotations, porcupine.Annotation{Tag: "members", Start: at, End: end,
			Description: fmt.Sprintf("#%d %s (%s; leader %s)", k+1, step.name, nodes, leader.Name), BackgroundColor: "#b3d9ff"})
		t.Logf("step %d: %s (%s; leader %s): %d voters %v, settled in %v (%v in all)", k+1, step.name, nodes, leader.Name,
			len(m.voters), voterNames(m.voters), took.Round(time.Millisecond), time.Duration(end-at).Round(time.Millisecond))
	}
	r.ops.await(t, cfg.minOps, cfg.gap[0], "clients completed")
	r.done.Store(true)
	wg.Wait()
	c.WaitWritable(t, time.Minute)
	r.checkCluster(cfg, seed, faults, windows, m.terms, annotations)
}

func voterNames(nodes []*clustertest.Node) []string {
	var out []string
	for _, nd := range nodes {
		out = append(out, nd.Name)
	}
	slices.Sort(out)
	return out
}
