package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv/bench"
)

func fkRun(wl bench.Workload, clients int, opsPerSec float64, p50 time.Duration) runResult {
	return runResult{Round: 1, System: "fencekv", Result: bench.Result{Workload: wl, Clients: clients, Ops: 1,
		OpsPerSec: opsPerSec, Latency: bench.Latency{Count: 1, P50: p50}}}
}

// TestSingleGoals: the cluster's goals against one node, judged from the
// single-node run's results and baselines, and not checked without them.
func TestSingleGoals(t *testing.T) {
	single := &report{Rounds: 1, Runs: []runResult{
		fkRun(bench.FencedPut, 64, 1000, time.Millisecond),
		fkRun(bench.FencedPut, 1, 5000, 200*time.Microsecond),
	}}
	single.Baselines.SyncedEcho = bench.Latency{Count: 1, P50: 230 * time.Microsecond}
	single.Baselines.FencekvPing = bench.Latency{Count: 1, P50: 60 * time.Microsecond}
	cluster := &clusterReport{report: report{Rounds: 1, Runs: []runResult{
		fkRun(bench.FencedPut, 64, 600, 5*time.Millisecond),
		fkRun(bench.LockCycle, 64, 300, 5*time.Millisecond),
		fkRun(bench.FencedPut, 1, 2000, 400*time.Microsecond),
	}}}

	verdicts := func() map[string]string {
		m := map[string]string{}
		for _, g := range cluster.singleGoals() {
			m[g.goal] = g.measured + " => " + g.verdict
		}
		return m
	}
	for _, g := range verdicts() {
		if !strings.HasSuffix(g, "not checked") {
			t.Fatalf("without the single node's run: %q; want not checked", g)
		}
	}

	cluster.single = single
	want := map[string]string{
		"fenced-put at 64 clients ≥ half a single node's":                          "60% (600 vs 1000 ops/s) => met",
		"lock-cycle at 64 clients ≥ half a single node's":                          "no single-node run to compare (--single) => not checked",
		"fenced-put at 1 client: p50 ≤ 2× a single node's":                         "2.00× (400 µs vs 200 µs) => met",
		"fenced-put at 1 client: p50 ≤ 1.5× the floor (synced echo + forward hop)": "1.38× (400 µs vs 290 µs: echo 230 µs + ping 60 µs) => met",
	}
	got := verdicts()
	for goal, w := range want {
		if got[goal] != w {
			t.Errorf("%s: %q; want %q", goal, got[goal], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("goals %v; want %d", got, len(want))
	}

	cluster.Runs[2].Result.Latency.P50 = 500 * time.Microsecond
	got = verdicts()
	for goal, w := range map[string]string{
		"fenced-put at 1 client: p50 ≤ 2× a single node's":                         "2.50× (500 µs vs 200 µs) => **missed**: 2.50×, over 2.00×",
		"fenced-put at 1 client: p50 ≤ 1.5× the floor (synced echo + forward hop)": "1.72× (500 µs vs 290 µs: echo 230 µs + ping 60 µs) => **missed**: 1.72×, over 1.50×",
	} {
		if got[goal] != w {
			t.Errorf("%s: %q; want %q", goal, got[goal], w)
		}
	}
}
