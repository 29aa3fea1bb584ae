package verify

// TestLinearizableCluster is TestLinearizable against a 3-node cluster of
// real `fencekv serve` processes: the same model, workload and porcupine
// check, with clients on random nodes (a client moves to another random
// node after its connection breaks or a node answers unavailable) and,
// during the run, faults on the leader and the followers:
//
//	kill -9 of the leader or of a follower, restarted on its data dir;
//	SIGSTOP of the leader past an election, then SIGCONT;
//	the leader alone in a minority (its raft traffic cut both ways);
//	a follower cut off from the others;
//	the leader's outbound raft traffic cut (it hears, nobody hears it);
//	every raft link slowed down;
//
// each healed before the next. An `unavailable` answer with outcome
// "unknown", a broken connection or a timeout is an unknown outcome;
// `unavailable` without it means the command was not applied, and the
// operation is left out of the history (its value then appears in no
// operation, so a read that saw it would fail the check).
//
// Beyond porcupine, two checks read the history directly: tokens strictly
// rise across every fault (every grant called after a fault ended is
// above every grant acknowledged before it began, besides G1 across the
// whole run), and no write carrying a token was accepted after a write
// with a newer token to the same key had been acknowledged, or a read had
// shown the key fenced above it (G2).

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/wire"
)

// clusterTarget is a cluster's nodes as a linTarget: a client dials a
// random node of its list (a node added during the run joins the list:
// add).
type clusterTarget struct {
	mu    sync.Mutex
	nodes []*clustertest.Node
}

func newClusterTarget(c *clustertest.Cluster) *clusterTarget {
	return &clusterTarget{nodes: append([]*clustertest.Node(nil), c.Nodes...)}
}

// add lets clients dial nd too.
func (ct *clusterTarget) add(nd *clustertest.Node) {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	ct.nodes = append(ct.nodes, nd)
}

func (ct *clusterTarget) pick(rng *rand.Rand) *clustertest.Node {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return ct.nodes[rng.IntN(len(ct.nodes))]
}

func (ct *clusterTarget) dial(ctx context.Context, rng *rand.Rand) (*wire.Client, error) {
	for {
		nd := ct.pick(rng)
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		cl, err := wire.Dial(dctx, nd.Client)
		cancel()
		if err == nil {
			return cl, nil
		}
		// Down (killed, not yet restarted): another, after a moment.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// linClusterConfig sizes a run against a cluster.
type linClusterConfig struct {
	clients   int
	faults    int
	gap       [2]time.Duration // run this long (at random) between faults
	hold      [2]time.Duration // and each fault lasts this long
	minOps    int64            // and at least this many operations between faults
	checkTime time.Duration
}

// minHold is the shortest fault: raft's election needs the heartbeat
// timeout (500 ms) and an election round to pass, and a leader paused or
// cut off for 800 ms was seen leading again afterwards, in a new term,
// with no other node having led: no failover to test.
const minHold = 1300 * time.Millisecond

func TestLinearizableCluster(t *testing.T) {
	// The short form runs each kind of fault once.
	cfg := linClusterConfig{clients: 8, faults: len(linFaults), gap: [2]time.Duration{300 * time.Millisecond, 900 * time.Millisecond},
		hold: [2]time.Duration{minHold, 2 * time.Second}, minOps: 40, checkTime: 2 * time.Minute}
	if verifyLong() {
		cfg = linClusterConfig{clients: 10, faults: 56, gap: [2]time.Duration{500 * time.Millisecond, 3 * time.Second},
			hold: [2]time.Duration{minHold, 3 * time.Second}, minOps: 100, checkTime: 15 * time.Minute}
	}
	runLinearizableCluster(t, cfg)
}

// A fault: what it does, and how it is undone.
type linFault struct {
	name   string
	inject func(c *clustertest.Cluster, leader *clustertest.Node, rng *rand.Rand) (undo func())
}

var linFaults = []linFault{
	{"kill -9 the leader", func(c *clustertest.Cluster, l *clustertest.Node, rng *rand.Rand) func() {
		c.Kill(l)
		return func() { c.Restart(l) }
	}},
	{"SIGSTOP the leader", func(c *clustertest.Cluster, l *clustertest.Node, rng *rand.Rand) func() {
		c.Pause(l)
		return func() { c.Resume(l) }
	}},
	// The leader cut off from its followers while its clients still
	// reach it: the proxies carry only raft's bytes, clients dial nodes
	// directly.
	{"isolate the leader", func(c *clustertest.Cluster, l *clustertest.Node, rng *rand.Rand) func() {
		c.Isolate(l)
		return c.Heal
	}},
	{"kill -9 a follower", func(c *clustertest.Cluster, l *clustertest.Node, rng *rand.Rand) func() {
		f := c.Others(l)[0]
		c.Kill(f)
		return func() { c.Restart(f) }
	}},
	{"cut a follower off", func(c *clustertest.Cluster, l *clustertest.Node, rng *rand.Rand) func() {
		c.Isolate(c.Others(l)[1])
		return c.Heal
	}},
	{"cut the leader's outbound raft", func(c *clustertest.Cluster, l *clustertest.Node, rng *rand.Rand) func() {
		for _, o := range c.Others(l) {
			c.Cut(l, o)
		}
		return c.Heal
	}},
	// A bridge: the leader and one follower cannot reach each other, the
	// other follower reaches both. The cut-off follower calls elections
	// with ever higher terms through the bridge while the leader still has
	// a majority through it.
	{"bridge the leader to one follower", func(c *clustertest.Cluster, l *clustertest.Node, rng *rand.Rand) func() {
		f := c.Others(l)[0]
		c.Cut(l, f)
		c.Cut(f, l)
		return c.Heal
	}},
	// A flapping link: the leader is cut off and let back in every few
	// hundred milliseconds, so elections start and are interrupted by the
	// old leader's heartbeats coming back.
	{"flap the leader's links", func(c *clustertest.Cluster, l *clustertest.Node, rng *rand.Rand) func() {
		return flap(c, l, rng, 150*time.Millisecond, 400*time.Millisecond)
	}},
	{"slow every raft link", func(c *clustertest.Cluster, l *clustertest.Node, rng *rand.Rand) func() {
		for _, a := range c.Nodes {
			for _, b := range c.Nodes {
				if a != b {
					c.SetLink(a, b, clustertest.Link{Mode: clustertest.Delay, Delay: 30 * time.Millisecond})
				}
			}
		}
		return c.Heal
	}},
}

// flap isolates nd and heals it in turn, each state held for a random
// time in [lo, hi), until the returned undo is called; undo waits for the
// flapping to stop and leaves every link healed. The schedule comes from
// a generator seeded from the run's rng, so a logged seed replays it.
func flap(c *clustertest.Cluster, nd *clustertest.Node, run *rand.Rand, lo, hi time.Duration) (undo func()) {
	stop := make(chan struct{})
	done := make(chan struct{})
	rng := rand.New(rand.NewPCG(run.Uint64(), run.Uint64()))
	go func() {
		defer close(done)
		cut := false
		for {
			if cut = !cut; cut {
				c.Isolate(nd)
			} else {
				c.Heal()
			}
			t := time.NewTimer(randDuration(rng, lo, hi))
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		c.Heal()
	}
}

// termWatch records the windows in which a new leader may have taken
// over. A take-over gives every lease its full TTL again (the rearm), so
// the model may take a lease as run out only across a stretch with no such
// window (linInput.Quiet). Every leader has a term of its own, and its
// rearm comes before any other command of its term in the log: a window
// runs from before the new term was seen (the start of the earliest of
// the nodes' last answered polls: the new leader's was before its term
// began, unless it answered the new term itself) until a write made after
// it was acknowledged.
type termWatch struct {
	mu      sync.Mutex
	max     uint64
	nodes   int
	last    map[string]int64 // per node: when its last answered poll began
	gone    map[string]bool  // nodes no longer watched (forget)
	windows [][2]int64
}

// watchTerms polls every node's term until the run's clients stop.
func watchTerms(r *linRun, c *clustertest.Cluster, wg *sync.WaitGroup) *termWatch {
	tw := &termWatch{last: map[string]int64{}, gone: map[string]bool{}}
	for _, nd := range c.Nodes {
		tw.watch(r, nd, wg)
	}
	return tw
}

// watch polls nd's term too, until the run's clients stop.
func (tw *termWatch) watch(r *linRun, nd *clustertest.Node, wg *sync.WaitGroup) {
	tw.mu.Lock()
	tw.nodes++
	tw.mu.Unlock()
	wg.Go(func() {
		// A node just started may not listen yet: dial until it does.
		var cl *wire.Client
		deadline := time.Now().Add(startTimeout)
		for {
			ctx, cancel := context.WithTimeout(r.ctx, time.Second)
			c, err := wire.Dial(ctx, nd.Client)
			cancel()
			if err == nil {
				cl = c
				break
			}
			if r.done.Load() || r.ctx.Err() != nil {
				return
			}
			if time.Now().After(deadline) {
				r.t.Errorf("term watch: dial %s: %v", nd.Name, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		defer cl.Close()
		for !r.done.Load() {
			began := r.now()
			ctx, cancel := context.WithTimeout(r.ctx, 500*time.Millisecond)
			term, err := cl.Term(ctx)
			cancel()
			if err == nil {
				if from, rose := tw.saw(nd.Name, term, began); rose {
					tw.add(from, tw.settle(r, cl))
				}
			}
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
}

// forget stops counting nd, a node gone for good (removed from the
// cluster): its last answer no longer bounds when a new term began.
func (tw *termWatch) forget(nd *clustertest.Node) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if !tw.gone[nd.Name] {
		tw.gone[nd.Name] = true
		tw.nodes--
		delete(tw.last, nd.Name)
	}
}

// saw records that node answered term to a poll begun at began. It
// reports whether term is higher than any seen before (but the first), and
// then from when the new term may have begun.
func (tw *termWatch) saw(node string, term uint64, began int64) (from int64, rose bool) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if tw.gone[node] {
		return 0, false
	}
	from = began
	for _, t := range tw.last {
		from = min(from, t)
	}
	if len(tw.last) < tw.nodes {
		from = 0 // a node not heard from yet: since the run began
	}
	tw.last[node] = began
	first := tw.max == 0
	if term <= tw.max {
		return 0, false
	}
	tw.max = term
	return from, !first
}

// settle writes through cl until a write is acknowledged, and returns
// when (or the run's end, if none is).
func (tw *termWatch) settle(r *linRun, cl *wire.Client) int64 {
	for !r.done.Load() {
		ctx, cancel := context.WithTimeout(r.ctx, time.Second)
		_, err := cl.Put(ctx, []byte("lin-term-watch"), []byte("x"), fencekv.WriteOptions{})
		cancel()
		if err == nil {
			return r.now()
		}
		select {
		case <-r.ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return math.MaxInt64
}

func (tw *termWatch) add(from, to int64) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	tw.windows = append(tw.windows, [2]int64{from, to})
}

func (tw *termWatch) seen() [][2]int64 {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	return append([][2]int64(nil), tw.windows...)
}

// faultRec is one fault as injected: when it began and when it was undone
// (times of the run).
type faultRec struct {
	name       string
	start, end int64
}

func runLinearizableCluster(t *testing.T, cfg linClusterConfig) {
	seed := testSeed(t)
	c := clustertest.Start(t, fencekvBinary(t), 3, &clustertest.Options{Proxy: true})
	r := &linRun{t: t, target: newClusterTarget(c), cluster: true, start: time.Now(), ops: newOpCounter()}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		r.done.Store(true)
		r.cancel()
		wg.Wait()
	}()
	r.startClients(&wg, cfg.clients, seed)
	terms := watchTerms(r, c, &wg)

	// The main goroutine owns the cluster: faults in turn, each kind as
	// often as the others, in a random order per cycle.
	rng := rand.New(rand.NewPCG(seed, math.MaxUint64))
	var faults []faultRec
	var annotations []porcupine.Annotation
	var order []int
	leaderFaults, moved := 0, 0
	for k := range cfg.faults {
		r.ops.await(t, cfg.minOps, randDuration(rng, cfg.gap[0], cfg.gap[1]), "clients completed")
		if len(order) == 0 {
			order = rng.Perm(len(linFaults))
		}
		f := linFaults[order[0]]
		order = order[1:]
		leader := c.Leader(t)
		at := r.now()
		undo := f.inject(c, leader, rng)
		time.Sleep(randDuration(rng, cfg.hold[0], cfg.hold[1])) // the fault lasts: the point of it
		undo()
		end := r.now()
		faults = append(faults, faultRec{name: f.name, start: at, end: end})
		annotations = append(annotations, porcupine.Annotation{Tag: "faults", Start: at, End: end,
			Description: fmt.Sprintf("#%d %s (%s)", k+1, f.name, leader.Name), BackgroundColor: "#ffb3b3"})
		after := ""
		if strings.Contains(f.name, "the leader") {
			leaderFaults++
			if nl := c.Leader(t); nl != leader {
				moved++
				after = "; leader after it " + nl.Name
			} else {
				after = "; the same leader after it"
			}
		}
		t.Logf("fault %d: %s (leader %s) for %v%s", k+1, f.name, leader.Name, time.Duration(end-at).Round(time.Millisecond), after)
	}
	t.Logf("%d of %d faults on the leader moved the leadership", moved, leaderFaults)
	r.ops.await(t, cfg.minOps, cfg.gap[0], "clients completed")
	r.done.Store(true)
	wg.Wait()
	c.WaitWritable(t, time.Minute)
	var windows [][2]int64
	for _, f := range faults {
		windows = append(windows, [2]int64{f.start, f.end})
	}
	r.checkCluster(cfg, seed, faults, windows, terms, annotations)
}

// checkCluster ends a run against a cluster whose clients have stopped:
// the last reads, and the checks of the history. The model may take a
// lease as run out only across a stretch with none of windows (the
// faults that may have moved the leadership) and no take-over the term
// watch saw; tokens must rise across each of faults.
func (r *linRun) checkCluster(cfg linClusterConfig, seed uint64, faults []faultRec, windows [][2]int64, terms *termWatch, annotations []porcupine.Annotation) {
	t := r.t
	history := r.finish(cfg.clients, seed)

	r.mu.Lock()
	t.Logf("%d operations answered unavailable (not applied) and left out of the history", len(r.notApplied))
	for i, s := range r.notApplied {
		if i == 5 {
			t.Logf("...")
			break
		}
		t.Logf("not applied: %s", s)
	}
	r.mu.Unlock()
	changes := terms.seen()
	windows = append(windows, changes...)
	t.Logf("%d new terms seen", len(changes))
	markQuiet(history, windows)
	r.checkGrants(history)
	checkFailoverTokens(t, history, faults)
	checkFences(t, history)
	r.check(history, linConfig{clients: cfg.clients, kills: len(faults), checkTime: cfg.checkTime}, annotations)
}

// checkFailoverTokens checks that tokens strictly rise across every
// fault: each grant called after a fault was undone is above every grant
// acknowledged before the fault began.
func checkFailoverTokens(t *testing.T, history []porcupine.Operation, faults []faultRec) {
	t.Helper()
	type grant struct {
		token     uint64
		call, ret int64
	}
	var grants []grant
	for _, op := range history {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if in.Op == linAcquire && !out.Unknown && out.Err == "" {
			grants = append(grants, grant{out.Token, op.Call, op.Return})
		}
	}
	across := 0
	for _, f := range faults {
		var before uint64
		after := uint64(math.MaxUint64)
		for _, g := range grants {
			if g.ret < f.start {
				before = max(before, g.token)
			}
			if g.call > f.end {
				after = min(after, g.token)
			}
		}
		if before == 0 || after == math.MaxUint64 {
			continue
		}
		across++
		if after <= before {
			t.Errorf("tokens across %q: a grant called after it has token %d, not above %d acknowledged before it", f.name, after, before)
		}
	}
	t.Logf("tokens rose across %d of %d faults (the others had no grant on one side)", across, len(faults))
}

// checkFences checks G2 on the history directly: no write carrying a
// token was accepted after the key was known to be fenced above that
// token (by an acknowledged write with a higher token, or an answer that
// showed the fence) before the write was called. A strict write must be
// above the fence, others at or above it.
func checkFences(t *testing.T, history []porcupine.Operation) {
	t.Helper()
	type seen struct {
		fence uint64
		ret   int64
		what  string
	}
	type key struct{ part, key int }
	fences := map[key][]seen{}
	var writes []porcupine.Operation
	for _, op := range history {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if in.Op >= linAcquire || out.Unknown {
			continue
		}
		k := key{in.Part, in.Key}
		switch {
		case out.Err == "" && (in.Op != linGet || out.Found || out.Fence > 0):
			fences[k] = append(fences[k], seen{out.Fence, op.Return, linDescribe(in, out)})
		case out.Err == "stale_token":
			fences[k] = append(fences[k], seen{out.Fact, op.Return, linDescribe(in, out)})
		}
		if in.Op != linGet && in.Token > 0 && out.Err == "" {
			writes = append(writes, op)
		}
	}
	for _, s := range fences {
		sort.Slice(s, func(i, j int) bool { return s[i].ret < s[j].ret })
	}
	checked := 0
	for _, w := range writes {
		in := w.Input.(linInput)
		for _, s := range fences[key{in.Part, in.Key}] {
			if s.ret >= w.Call {
				break
			}
			if s.fence > in.Token || in.Strict && s.fence == in.Token {
				t.Errorf("G2: %s (called at %v) was accepted after %s had returned at %v",
					linDescribe(in, w.Output.(linOutput)), time.Duration(w.Call), s.what, time.Duration(s.ret))
				break
			}
		}
		checked++
	}
	t.Logf("fences: %d accepted writes with tokens checked against every fence seen before them", checked)
}
