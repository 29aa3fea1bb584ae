package verify_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/verify"
	"github.com/fencekv/fencekv/wire"
)

// TestVerifyClientProcess is the paused client when the test binary is
// re-executed by TestVerifyRun; otherwise it does nothing.
func TestVerifyClientProcess(t *testing.T) {
	args := fencekvtest.AsChild(t) // of TestVerifyRun
	os.Exit(verify.ClientMain(args, os.Stdin, os.Stdout))
}

// TestVerifyRun runs a short verify against an in-process server, with the
// paused clients as real child processes stopped by SIGSTOP.
func TestVerifyRun(t *testing.T) {
	addr := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := verify.Run(ctx, verify.Config{
		Addr:    addr,
		Rounds:  6,
		TTL:     200 * time.Millisecond,
		Clients: 3,
		Updates: 40,
		Client: func(args []string) *exec.Cmd {
			return fencekvtest.Child("TestVerifyClientProcess", args)
		},
	})
	if err != nil {
		t.Fatalf("verify: %v\n%v", err, rep)
	}
	t.Log("\n" + rep.String())
	if !rep.OK() {
		t.Fatalf("violations: %v", rep.Violations)
	}
	if rep.Rounds != 6 || rep.StaleRefused != 3 || rep.HeldRefused != 3 {
		t.Errorf("rounds %d, stale refused %d, held refused %d; want 6, 3, 3", rep.Rounds, rep.StaleRefused, rep.HeldRefused)
	}
	if rep.Updates != 40 || rep.Acked == 0 || rep.Counter != rep.Total || rep.Total != int64(rep.Acked) {
		t.Errorf("inventory: %d updates, %d acked, counters %d, total %d", rep.Updates, rep.Acked, rep.Counter, rep.Total)
	}
	// verify cleans up: no scratch key is left live.
	c, err := wire.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	items, _, err := c.Scan(ctx, fencekv.ScanOptions{Prefix: []byte(rep.Prefix)})
	if err != nil || len(items) != 0 {
		t.Errorf("scan %s after verify = %d items, %v; want none", rep.Prefix, len(items), err)
	}
	locks, _, err := c.Locks(ctx, rep.Prefix, "", 0)
	if err != nil || len(locks) != 0 {
		t.Errorf("locks under %s after verify = %d, %v; want none held", rep.Prefix, len(locks), err)
	}
}

func TestReportVerdict(t *testing.T) {
	var r verify.Report
	if !r.OK() || !strings.Contains(r.String(), "PASS") {
		t.Errorf("empty report: OK %v, %q", r.OK(), r.String())
	}
	r.Violations = append(r.Violations, "round 3: a write with token 5 was accepted after token 6 wrote")
	if r.OK() || !strings.Contains(r.String(), "FAIL: 1 violation") || !strings.Contains(r.String(), "token 5") {
		t.Errorf("report with a violation: OK %v, %q", r.OK(), r.String())
	}
}

// serve starts an in-process server on a fresh store for the test.
func serve(t *testing.T) string {
	addr, _ := fencekvtest.Serve(t, nil)
	return addr
}

// TestVerifyCluster runs a short verify against a 3-node cluster (every
// node's address), while the leader is killed with -9 and restarted, and
// stopped with SIGSTOP past an election and continued, over and over: no
// stale write may be accepted, and the inventory's counters must hold
// every acknowledged update (and at most those whose outcome a failover
// left unknown).
func TestVerifyCluster(t *testing.T) {
	c := clustertest.Start(t, clustertest.Build(t), 3, nil)
	var addrs []string
	for _, nd := range c.Nodes {
		addrs = append(addrs, nd.Client)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	done := make(chan struct{})
	faults := leaderFaults(t, c, done)
	rep, err := verify.Run(ctx, verify.Config{
		Addr:    strings.Join(addrs, ","),
		Rounds:  8,
		TTL:     300 * time.Millisecond,
		Clients: 3,
		Updates: 60,
		Client: func(args []string) *exec.Cmd {
			return fencekvtest.Child("TestVerifyClientProcess", args)
		},
	})
	close(done)
	n := <-faults
	if err != nil {
		t.Fatalf("verify: %v\n%v", err, rep)
	}
	t.Logf("%d faults on the leader during the run\n%s", n, rep)
	if !rep.OK() {
		t.Fatalf("violations: %v", rep.Violations)
	}
	if n < 2 {
		t.Errorf("only %d faults during the run; want at least 2", n)
	}
	if rep.Rounds != 8 || rep.StaleRefused != 4 || rep.HeldRefused != 4 || rep.Updates != 60 {
		t.Errorf("rounds %d, stale refused %d, held refused %d, updates %d; want 8, 4, 4, 60", rep.Rounds, rep.StaleRefused, rep.HeldRefused, rep.Updates)
	}
}

// leaderFaults injects faults on the leader until done is closed: kill -9
// and restart, then SIGSTOP and SIGCONT, by turns, each past an election.
// The channel returned gets how many were injected.
func leaderFaults(t *testing.T, c *clustertest.Cluster, done <-chan struct{}) <-chan int {
	faults := make(chan int, 1)
	go func() {
		n := 0
		defer func() { faults <- n }()
		for {
			select {
			case <-done:
				return
			case <-time.After(700 * time.Millisecond): // verify runs between faults
			}
			leader := c.Leader(t)
			if n%2 == 0 {
				c.Kill(leader)
				time.Sleep(time.Second) // down past an election
				c.Restart(leader)
			} else {
				c.Pause(leader)
				time.Sleep(1500 * time.Millisecond) // paused past an election
				c.Resume(leader)
			}
			n++
		}
	}()
	return faults
}

// TestVerifyCLICluster is `make verify-cluster`: it starts three nodes and
// runs the `fencekv verify` command against all three while the leader is
// killed and restarted, paused and continued; verify must exit 0 (no stale
// write accepted, counters exact). FENCEKV_VERIFY_CLUSTER=1 runs it, with
// verify's flags from FENCEKV_VERIFY_FLAGS.
func TestVerifyCLICluster(t *testing.T) {
	if os.Getenv("FENCEKV_VERIFY_CLUSTER") != "1" {
		t.Skip("make verify-cluster runs it (FENCEKV_VERIFY_CLUSTER=1)")
	}
	bin := clustertest.Build(t)
	c := clustertest.Start(t, bin, 3, nil)
	var addrs []string
	for _, nd := range c.Nodes {
		addrs = append(addrs, nd.Client)
	}
	args := append([]string{"verify", "--addr", strings.Join(addrs, ",")}, strings.Fields(os.Getenv("FENCEKV_VERIFY_FLAGS"))...)
	t.Logf("%s %s", bin, strings.Join(args, " "))
	done := make(chan struct{})
	faults := leaderFaults(t, c, done)
	cmd := exec.Command(bin, args...)
	out, err := cmd.CombinedOutput()
	close(done)
	n := <-faults
	t.Logf("%d faults on the leader (kill -9 and restart, SIGSTOP and SIGCONT, by turns) while verify ran:\n%s", n, out)
	if err != nil {
		t.Fatalf("fencekv verify: %v", err)
	}
	if n < 2 {
		t.Errorf("only %d faults during the run; want at least 2", n)
	}
}
