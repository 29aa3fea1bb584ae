package diskfault_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
)

// TestWALSyncEIO: the single node's write-ahead log fsync fails with EIO
// (once: a retry would succeed, as after Linux drops the dirty pages and
// clears the error). The writes before it stay acknowledged and survive a
// restart; the one that met it (an acquire) is answered unavailable with
// outcome unknown; the node syncs nothing more and refuses every later
// write; /readyz and the log say why; a restart without the fault
// recovers, and issues no token twice.
func TestWALSyncEIO(t *testing.T) {
	s := newSingle(t, t.TempDir())
	s.start()
	cl := mustDial(t, s.addr)
	l, err := cl.Acquire(ctx(t), "a", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	acked := map[string]string{}
	for i := range 20 {
		k, v := fmt.Sprintf("k%02d", i), fmt.Sprintf("v%d", i)
		if _, err := cl.Put(ctx(t), []byte(k), []byte(v), fencekv.WriteOptions{Token: l.Token, Lock: "a"}); err != nil {
			t.Fatal(err)
		}
		acked[k] = v
	}

	arm(t, s.fp, "wal.sync=eio@1") // the next sync, and only it
	_, err = cl.Acquire(ctx(t), "b", time.Minute, nil)
	if code(err) != fencekv.CodeUnavailable || outcome(err) != fencekv.OutcomeUnknown {
		t.Fatalf("the acquire whose sync failed: %v (outcome %q), want unavailable with outcome unknown", err, outcome(err))
	}
	// Every later write is refused, though the disk "works" again.
	for i := range 5 {
		_, err := cl.Put(ctx(t), []byte(fmt.Sprintf("after%d", i)), []byte("x"), fencekv.WriteOptions{})
		if code(err) != fencekv.CodeUnavailable {
			t.Fatalf("a put after the failed fsync: %v, want unavailable", err)
		}
	}
	if _, err := cl.Acquire(ctx(t), "c", time.Minute, nil); code(err) != fencekv.CodeUnavailable {
		t.Fatalf("an acquire after the failed fsync: %v, want unavailable", err)
	}
	st, body, err := readyz(s.http)
	if err != nil || st != http.StatusServiceUnavailable || !strings.Contains(body, "input/output error") {
		t.Errorf("/readyz after the failed fsync: %d %q %v, want 503 naming the I/O error", st, body, err)
	}
	waitLog(t, s.log.String, "diskfault: wal.sync hit 1: injected EIO", "refusing writes until restart")
	if log := s.log.String(); strings.Contains(log, "after the fault") {
		t.Errorf("the node synced its log again after the failed fsync:\n%s", log)
	}

	s.kill() // a crash; the page cache survives, as after a process crash
	arm(t, s.fp, "")
	s.start()
	cl = mustDial(t, s.addr)
	for k, v := range acked {
		e, err := cl.Get(ctx(t), []byte(k))
		if err != nil || string(e.Value) != v {
			t.Fatalf("acknowledged %s=%s after the restart: %q, %v", k, v, e.Value, err)
		}
	}
	// Whatever the unknown acquire did, no token comes back.
	top := l.Token
	if in, err := cl.LockInfo(ctx(t), "b"); err == nil && in.Token > top {
		top = in.Token
	}
	l2, err := cl.Acquire(ctx(t), "d", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token <= top {
		t.Fatalf("after the restart, token %d was issued; %d was granted before", l2.Token, top)
	}
	if st, body, err := readyz(s.http); st != http.StatusOK {
		t.Errorf("/readyz after the restart: %d %q %v", st, body, err)
	}
}

// TestFailpointsFromEnvironment: FENCEKV_FAILPOINTS is read at start: a
// malformed rule stops the process before it serves (a test never runs
// without its fault), and a rule armed there fires: every append of the
// log from the second on (the first is Open's re-arm) fails with ENOSPC,
// so the first write is refused and the store fails.
func TestFailpointsFromEnvironment(t *testing.T) {
	bin := failpointsBin(t)
	cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cx, bin, "serve", "--data", t.TempDir(), "--listen", clustertest.FreeAddr(t), "--http", "")
	cmd.Env = append(os.Environ(), "FENCEKV_FAILPOINTS=wal.fsync=eio")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), `no failpoint "wal.fsync"`) {
		t.Fatalf("a malformed FENCEKV_FAILPOINTS: %v\n%s\nwant exit status 2 naming the unknown failpoint", err, out)
	}

	s := newSingle(t, t.TempDir())
	s.env = []string{"FENCEKV_FAILPOINTS=wal.write=enospc@2+"}
	s.start()
	cl := mustDial(t, s.addr)
	_, err = cl.Put(ctx(t), []byte("k"), []byte("v"), fencekv.WriteOptions{})
	if code(err) != fencekv.CodeUnavailable || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("a put whose log append fails with ENOSPC: %v, want unavailable naming ENOSPC", err)
	}
	waitLog(t, s.log.String, "diskfault: wal.write hit 2: injected ENOSPC")
	if st, _, _ := readyz(s.http); st != http.StatusServiceUnavailable {
		t.Errorf("/readyz: %d, want 503", st)
	}
}
