package diskfault_test

// Disk faults in real processes: `fencekv serve` built with -tags
// failpoints, its faults armed through FENCEKV_FAILPOINTS_FILE while it
// runs, and the invariants the suites check: nothing acknowledged is lost,
// no token is issued twice, nothing is acknowledged after a failed fsync.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/fencekv/fencekv/wire"
)

var (
	binOnce sync.Once
	binPath string
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// failpointsBin builds fencekv with -tags failpoints once per run.
func failpointsBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "diskfault-bin")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
		binPath = clustertest.BuildTags(t, dir, "failpoints")
	})
	if binPath == "" {
		t.Fatal("the failpoints build failed in an earlier test")
	}
	return binPath
}

// logBuffer collects a process's output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// single is one single-node server process.
type single struct {
	t      *testing.T
	bin    string
	dir    string
	fp     string // its failpoints file
	addr   string
	http   string
	cmd    *exec.Cmd
	log    *logBuffer
	exited chan struct{}
	logs   []string // the logs of earlier runs
	env    []string // more environment variables
}

func newSingle(t *testing.T, dir string) *single {
	return &single{t: t, bin: failpointsBin(t), dir: dir,
		fp:   filepath.Join(t.TempDir(), "failpoints"),
		addr: clustertest.FreeAddr(t), http: clustertest.FreeAddr(t)}
}

// start runs the server and waits until it answers.
func (s *single) start() {
	s.t.Helper()
	s.log = &logBuffer{}
	s.cmd = exec.Command(s.bin, "serve", "--data", s.dir, "--listen", s.addr, "--http", s.http, "--log-level", "info")
	s.cmd.Env = append(append(os.Environ(), "FENCEKV_FAILPOINTS_FILE="+s.fp), s.env...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.exited = make(chan struct{})
	cmd, exited := s.cmd, s.exited
	go func() { cmd.Wait(); close(exited) }()
	s.t.Cleanup(func() { s.kill() })
	waitFor(s.t, 20*time.Second, "the server answers", func() error {
		select {
		case <-exited:
			return errStop(fmt.Errorf("exited:\n%s", s.log))
		default:
		}
		cl, err := dial(s.addr)
		if err != nil {
			return err
		}
		defer cl.Close()
		_, err = cl.Ping(context.Background())
		return err
	})
}

// kill stops the process (by its PID) with SIGKILL and waits for it.
func (s *single) kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.logs = append(s.logs, s.log.String())
	if s.t.Failed() {
		s.t.Logf("--- server log ---\n%s", s.log)
	}
	s.cmd = nil
}

// stop stops it gracefully (SIGTERM) and waits for it.
func (s *single) stop() {
	s.t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.t.Error("the server did not stop within 20s of SIGTERM")
	}
	s.kill()
}

// arm writes the failpoints file the server reads at its next hook.
func arm(t *testing.T, path, rules string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func dial(addr string) (*wire.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return wire.Dial(ctx, addr)
}

func mustDial(t *testing.T, addr string) *wire.Client {
	t.Helper()
	cl, err := dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// stopErr ends waitFor at once.
type stopErr struct{ error }

func errStop(err error) error { return stopErr{err} }

// waitFor polls cond until it returns nil, failing the test at the
// deadline (or at once on an errStop).
func waitFor(t *testing.T, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		var se stopErr
		if errors.As(err, &se) || time.Now().After(deadline) {
			t.Fatalf("waiting %v for %s: %v", within, what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readyz returns /readyz's status code and body.
func readyz(addr string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func code(err error) fencekv.Code {
	var fe *fencekv.Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	return ""
}

func outcome(err error) string {
	var fe *fencekv.Error
	if errors.As(err, &fe) {
		return fe.Outcome
	}
	return ""
}

// waitLog waits for every one of wants in a process's output (it is
// copied from the process's pipe in the background).
func waitLog(t *testing.T, log func() string, wants ...string) {
	t.Helper()
	waitFor(t, 5*time.Second, fmt.Sprintf("the log to say %q", wants), func() error {
		got := log()
		for _, w := range wants {
			if !strings.Contains(got, w) {
				return fmt.Errorf("no %q yet", w)
			}
		}
		return nil
	})
}
