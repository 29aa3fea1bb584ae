package fencekv_test

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// A real `fencekv serve` process, stopped by its PID.
type serverProc struct {
	cmd    *exec.Cmd
	out    *fencekvtest.Buffer
	exited chan struct{}
}

func startServer(t *testing.T, bin, dir, addr string) *serverProc {
	t.Helper()
	p := &serverProc{cmd: exec.Command(bin, "serve", "--data", dir, "--listen", addr, "--http", ""), out: &fencekvtest.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.signal(t, syscall.SIGKILL) })
	fencekvtest.Eventually(t, 20*time.Second, "the server at "+addr+" answers", func() bool {
		select {
		case <-p.exited:
			t.Fatalf("the server exited: %s", p.out)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		cl, err := wire.Dial(ctx, addr)
		if err != nil {
			return false
		}
		defer cl.Close()
		_, err = cl.Status(ctx)
		return err == nil
	})
	return p
}

// signal sends sig and waits for the process to exit.
func (p *serverProc) signal(t *testing.T, sig syscall.Signal) {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		t.Fatalf("the server did not exit on %v: %s", sig, p.out)
	}
}

func serverBinary(t *testing.T) string {
	if b := os.Getenv("FENCEKV_BIN"); b != "" {
		return b
	}
	return clustertest.Build(t)
}

// TestWatchHistoryServerRestarts: a watch over TCP, under write and lock
// load, across a kill -9 of the server and a clean restart (same dir,
// same address): it resumes each time from the history the restarted
// server kept, and gets every acknowledged change, in revision order,
// with no gap and no repeat; a watch from revision 1 after them replays
// exactly what the live one got.
func TestWatchHistoryServerRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	bin, dir, addr := serverBinary(t), t.TempDir(), clustertest.FreeAddr(t)
	srv := startServer(t, bin, dir, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := wire.Watch(ctx, []string{addr}, fencekv.WatchOptions{Locks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	live := fencekvtest.CollectEvents(w)
	cl, err := wire.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	wr := fencekvtest.StartHistoryWriter(cl, "h/")

	wr.WaitPuts(t, 200, 30*time.Second)
	srv.signal(t, syscall.SIGKILL) // in the middle of the load
	srv = startServer(t, bin, dir, addr)
	n := wr.Puts()
	wr.WaitPuts(t, n+200, 30*time.Second)
	srv.signal(t, syscall.SIGTERM)
	srv = startServer(t, bin, dir, addr)
	n = wr.Puts()
	wr.WaitPuts(t, n+100, 30*time.Second)
	acked := wr.Stop()

	if _, err := cl.Put(ctx, []byte("mark"), nil, fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	got := live.UntilKey(t, "mark", 30*time.Second)
	if err := fencekvtest.CheckHistory(got, acked, 1); err != nil {
		t.Fatalf("the live watch, across a kill -9 and a restart: %v", err)
	}
	if w.Err() != nil {
		t.Fatalf("the live watch failed: %v", w.Err())
	}
	// The whole history, from a watch that starts after the restarts.
	r, err := wire.Watch(ctx, []string{addr}, fencekv.WatchOptions{Locks: true, StartRevision: 1})
	if err != nil {
		t.Fatalf("a watch from revision 1 after the restarts: %v", err)
	}
	defer r.Close()
	if err := fencekvtest.SameEvents(fencekvtest.CollectEvents(r).UntilKey(t, "mark", 30*time.Second), got); err != nil {
		t.Fatalf("a watch from revision 1 after the restarts: %v", err)
	}
	t.Logf("%d events, %d changes acknowledged", len(got), len(acked))
}
