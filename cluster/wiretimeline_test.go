package cluster

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gometrics "github.com/armon/go-metrics"
	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wire"
)

// BenchmarkWireRound times a put's whole round as a client sees it, on
// three in-process nodes (real disks, fsync on, real TCP) each serving
// the client protocol, with wire clients (one connection each, one
// request in flight) on the leader or on a follower, whose forwarder
// sends the request on to the leader. Each request's key is its own, and
// it is stamped at every stage:
//
//	send        the client calls Put
//	follower    the follower's engine has it (the client protocol: encode, loopback, parse)
//	leader      the leader's engine has it (from the follower: its forward hop)
//	dispatch    the proposer hands its entry to raft (the wait for a slot, batching)
//	committed   raft's future returns: leader log write, AppendEntries, commit, apply
//	answered    the leader's engine returns
//	back        the follower's engine returns (the forward hop's answer)
//	received    the client has the answer
//
// and the benchmark reports each stage's median (and 90th percentile)
// across the requests, in ms, plus raft's own timings (reportStages).
// The stages sum to the round on the median only roughly; the total is
// measured on its own (round-ms).
//
//	go test -run '^$' -bench WireRound -benchtime 2000x -count 5 ./cluster
func BenchmarkWireRound(b *testing.B) {
	sink := gometrics.NewInmemSink(time.Hour, time.Hour)
	mcfg := gometrics.DefaultConfig("bench")
	mcfg.EnableHostname, mcfg.EnableRuntimeMetrics, mcfg.EnableServiceLabel = false, false, false
	mcfg.EnableHostnameLabel = false
	if _, err := gometrics.NewGlobal(mcfg, sink); err != nil {
		b.Fatal(err)
	}
	defer gometrics.NewGlobal(mcfg, &gometrics.BlackholeSink{})

	nodes := startGroup(b, 3)
	for _, nd := range nodes {
		serveWire(b, nd)
	}
	leader := waitLeader(b, nodes)
	var follower *Node
	for _, nd := range nodes {
		if nd != leader {
			follower = nd
			break
		}
	}
	rec := &timeline{stamps: map[string]*[nStages]time.Time{}}
	stamps.Store(&stampHooks{
		dispatch: func(cmds []state.Command) { rec.markCmds(cmds, stDispatch) },
		done:     func(cmds []state.Command) { rec.markCmds(cmds, stCommitted) },
	})
	defer stamps.Store(nil)
	wireTimeline.Store(rec)
	defer wireTimeline.Store(nil)
	value := []byte(strings.Repeat("v", 128))
	run := 0
	for _, clients := range []int{1, 64} {
		for _, via := range []string{"leader", "follower"} {
			target := leader
			if via == "follower" {
				target = follower
			}
			b.Run(fmt.Sprintf("via=%s/clients=%d", via, clients), func(b *testing.B) {
				run++
				ctx := context.Background()
				cls := make([]*wire.Client, clients)
				for i := range cls {
					c, err := wire.Dial(ctx, target.cfg.ClientAddr)
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					cls[i] = c
				}
				// Warm up (the forwarder's connection too), then forget
				// what the warm-up timed.
				for i := range 50 {
					if _, err := cls[i%clients].Put(ctx, fmt.Appendf(nil, "w%d", i), value, fencekv.WriteOptions{}); err != nil {
						b.Fatal(err)
					}
				}
				sink = resetSink(b, mcfg)
				rec.reset(leader, follower)
				var next sync.Mutex
				n := 0
				var rounds []time.Duration
				var rmu sync.Mutex
				b.ResetTimer()
				var wg sync.WaitGroup
				for ci, c := range cls {
					wg.Go(func() {
						for seq := 0; ; seq++ {
							next.Lock()
							if n >= b.N {
								next.Unlock()
								return
							}
							n++
							next.Unlock()
							key := fmt.Appendf(nil, "r%d-c%d-%d", run, ci, seq)
							t0 := time.Now()
							rec.mark(key, stSend, t0)
							if _, err := c.Put(ctx, key, value, fencekv.WriteOptions{}); err != nil {
								b.Error(err)
								return
							}
							t1 := time.Now()
							rec.mark(key, stReceived, t1)
							rmu.Lock()
							rounds = append(rounds, t1.Sub(t0))
							rmu.Unlock()
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				rec.report(b, via == "follower", rounds)
				reportStages(b, sink)
			})
		}
	}
}

const (
	stSend = iota
	stFollower
	stLeader
	stDispatch
	stCommitted
	stAnswered
	stBack
	stReceived
	nStages
)

var stageNames = [nStages]string{"send", "follower", "leader", "dispatch", "committed", "answered", "back", "received"}

// timeline keeps each request's stamps, by key.
type timeline struct {
	mu       sync.Mutex
	stamps   map[string]*[nStages]time.Time
	leader   *Node
	follower *Node
}

func (t *timeline) reset(leader, follower *Node) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stamps = map[string]*[nStages]time.Time{}
	t.leader, t.follower = leader, follower
}

func (t *timeline) mark(key []byte, st int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stamps[string(key)]
	if s == nil {
		s = new([nStages]time.Time)
		t.stamps[string(key)] = s
	}
	s[st] = at
}

func (t *timeline) markCmds(cmds []state.Command, st int) {
	at := time.Now()
	for i := range cmds {
		t.mark(cmds[i].Key, st, at)
	}
}

// report logs, and reports as metrics, each stage's median and 90th
// percentile over the requests that have every stamp of their path.
func (t *timeline) report(b *testing.B, forwarded bool, rounds []time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	path := []int{stSend, stLeader, stDispatch, stCommitted, stAnswered, stReceived}
	if forwarded {
		path = []int{stSend, stFollower, stLeader, stDispatch, stCommitted, stAnswered, stBack, stReceived}
	}
	d := make([][]time.Duration, len(path)-1)
	for _, s := range t.stamps {
		ok := true
		for _, st := range path {
			if s[st].IsZero() {
				ok = false
			}
		}
		if !ok {
			continue
		}
		for i := range d {
			d[i] = append(d[i], s[path[i+1]].Sub(s[path[i]]))
		}
	}
	ms := func(x time.Duration) float64 { return float64(x) / 1e6 }
	for i := range d {
		if len(d[i]) == 0 {
			continue
		}
		sort.Slice(d[i], func(a, c int) bool { return d[i][a] < d[i][c] })
		p50, p90 := d[i][len(d[i])/2], d[i][len(d[i])*9/10]
		name := stageNames[path[i]] + ">" + stageNames[path[i+1]]
		b.Logf("%-22s n=%-6d p50 %.3f ms  p90 %.3f ms", name, len(d[i]), ms(p50), ms(p90))
		b.ReportMetric(ms(p50), name+"-ms")
	}
	if len(rounds) > 0 {
		sort.Slice(rounds, func(a, c int) bool { return rounds[a] < rounds[c] })
		b.ReportMetric(ms(rounds[len(rounds)/2]), "round-ms")
		b.ReportMetric(ms(rounds[len(rounds)*99/100]), "round-p99-ms")
	}
}

// stampEngine is a node as the wire server sees it, stamping each put as
// it comes in and as it is answered (a follower's, or the leader's).
type stampEngine struct {
	*Node
}

var wireTimeline atomic.Pointer[timeline] // the running benchmark's (one at a time)

func (e stampEngine) Put(ctx context.Context, key, value []byte, w fencekv.WriteOptions) (fencekv.WriteResult, error) {
	in, out := stLeader, stAnswered
	if rec := wireTimeline.Load(); rec != nil {
		rec.mu.Lock()
		isFollower := e.Node == rec.follower
		rec.mu.Unlock()
		if isFollower {
			in, out = stFollower, stBack
		}
		rec.mark(key, in, time.Now())
		defer func() { rec.mark(key, out, time.Now()) }()
	}
	return e.Node.Put(ctx, key, value, w)
}

// serveWire serves the client protocol for nd on its client address
// until b ends.
func serveWire(b *testing.B, nd *Node) {
	ln, err := net.Listen("tcp", nd.cfg.ClientAddr)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := wire.NewServer(stampEngine{nd}, wire.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Shutdown(context.Background()) })
}
