package cluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	gometrics "github.com/armon/go-metrics"
	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/hashicorp/raft"
)

// BenchmarkRound times the leader's write path on three in-process nodes
// with real disks (fsync on) and real TCP between them, and breaks one
// round into raft's own stages, from the timings hashicorp/raft reports
// through go-metrics:
//
//	raft.leader.dispatchLog            the leader's log write and sync, before replication starts
//	raft.replication.appendEntries.rpc one AppendEntries to a follower and back (its log write and sync inside)
//	raft.rpc.appendEntries.storeLogs   the follower's log write and sync
//	raft.commitTime                    from the entry's dispatch to its commit on the leader
//	raft.fsm.applyBatch                the leader's state machine applying committed entries
//
// With -v the stages are logged per client count. Clients call Put on the
// leader's Node directly: the client protocol and a follower's forward
// hop are not in it.
func BenchmarkRound(b *testing.B) {
	sink := gometrics.NewInmemSink(time.Hour, time.Hour)
	mcfg := gometrics.DefaultConfig("bench")
	mcfg.EnableHostname, mcfg.EnableRuntimeMetrics, mcfg.EnableServiceLabel = false, false, false
	mcfg.EnableHostnameLabel = false
	if _, err := gometrics.NewGlobal(mcfg, sink); err != nil {
		b.Fatal(err)
	}
	defer gometrics.NewGlobal(mcfg, &gometrics.BlackholeSink{})

	nodes := startGroup(b, 3)
	leader := waitLeader(b, nodes)
	ctx := context.Background()
	value := []byte(strings.Repeat("v", 128))
	for _, clients := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			// Warm up, then forget what the warm-up and the elections timed.
			for i := range 50 {
				if _, err := leader.Put(ctx, fmt.Appendf(nil, "w%d", i), value, fencekv.WriteOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			sink = resetSink(b, mcfg)
			var next sync.Mutex
			i := 0
			b.ResetTimer()
			var wg sync.WaitGroup
			for c := range clients {
				wg.Go(func() {
					for {
						next.Lock()
						if i >= b.N {
							next.Unlock()
							return
						}
						i++
						next.Unlock()
						key := fmt.Appendf(nil, "k%d", c)
						if _, err := leader.Put(ctx, key, value, fencekv.WriteOptions{}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			reportStages(b, sink)
		})
	}
}

// resetSink installs a fresh in-memory sink and returns it.
func resetSink(b *testing.B, cfg *gometrics.Config) *gometrics.InmemSink {
	s := gometrics.NewInmemSink(time.Hour, time.Hour)
	if _, err := gometrics.NewGlobal(cfg, s); err != nil {
		b.Fatal(err)
	}
	return s
}

// reportStages logs raft's timings (mean and count per stage) and reports
// the main ones as benchmark metrics.
func reportStages(b *testing.B, sink *gometrics.InmemSink) {
	type stage struct {
		name  string
		count int
		mean  float64 // ms
	}
	agg := map[string]*stage{}
	for _, iv := range sink.Data() {
		iv.RLock()
		for name, s := range iv.Samples {
			if !strings.Contains(name, "raft.") {
				continue
			}
			name = name[strings.Index(name, "raft."):]
			st := agg[name]
			if st == nil {
				st = &stage{name: name}
				agg[name] = st
			}
			st.mean = (st.mean*float64(st.count) + s.Sum) / float64(st.count+s.Count)
			st.count += s.Count
		}
		iv.RUnlock()
	}
	var list []*stage
	for _, st := range agg {
		list = append(list, st)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].name < list[j].name })
	for _, st := range list {
		b.Logf("%-45s n=%-7d mean %.3f ms", st.name, st.count, st.mean)
	}
	for short, name := range map[string]string{
		"dispatch-ms": "raft.leader.dispatchLog",
		"ae-rpc-ms":   "raft.replication.appendEntries.rpc",
		"commit-ms":   "raft.commitTime",
		"store-ms":    "raft.rpc.appendEntries.storeLogs",
	} {
		if st := agg[name]; st != nil {
			b.ReportMetric(st.mean, short)
		}
	}
	if st := agg["raft.leader.dispatchLog"]; st != nil && st.count > 0 {
		b.ReportMetric(float64(b.N)/float64(st.count), "cmds/dispatch")
	}
}

// startGroup starts n nodes in this process that bootstrap one cluster,
// each with its own temp dir and free loopback ports, closed when b ends.
func startGroup(b *testing.B, n int) []*Node {
	cfgs := make([]Config, n)
	for i := range cfgs {
		cfg := DefaultConfig()
		cfg.Name, cfg.Dir = fmt.Sprintf("n%d", i), b.TempDir()
		cfg.ClientAddr, cfg.RaftAddr, cfg.GossipAddr = clustertest.FreeAddr(b), clustertest.FreeAddr(b), clustertest.FreeAddr(b)
		cfg.BootstrapExpect = n
		cfgs[i] = cfg
	}
	for i := range cfgs {
		for j := range cfgs {
			if j != i {
				cfgs[i].Join = append(cfgs[i].Join, cfgs[j].GossipAddr)
			}
		}
	}
	nodes := make([]*Node, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range cfgs {
		wg.Go(func() { nodes[i], errs[i] = Open(cfgs[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			b.Fatalf("node %d: %v", i, err)
		}
	}
	b.Cleanup(func() {
		for _, nd := range nodes {
			nd.Close()
		}
	})
	return nodes
}

// waitLeader waits for one of nodes to lead and take writes.
func waitLeader(b *testing.B, nodes []*Node) *Node {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, nd := range nodes {
			if nd.raft.State() == raft.Leader {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := nd.Put(ctx, []byte("ready"), nil, fencekv.WriteOptions{})
				cancel()
				if err == nil {
					return nd
				}
			}
		}
		time.Sleep(20 * time.Millisecond) // polling for an election: no event to wait on from outside
	}
	b.Fatal("no leader within 30s")
	return nil
}
