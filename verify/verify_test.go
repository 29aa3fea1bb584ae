package verify_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
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
