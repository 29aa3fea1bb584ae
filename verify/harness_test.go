package verify

// The harness for the tests that run a real `fencekv serve` process: the
// binary is built once per test run, and serverProc starts, SIGKILLs and
// restarts it on one data dir, telling clients where the live incarnation
// listens.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv/fencekvtest"
)

// The fencekv binary is built once per test binary, by the first test that
// starts a server, into a directory TestMain removes. Not up front in
// TestMain: the package's tests re-execute the test binary as a paused
// client (TestVerifyRun), and those children must not build anything.
var (
	buildOnce  sync.Once
	removeBin  func() // removes the build's temporary directory
	fencekvBin string // the binary, once built
	buildErr   error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if removeBin != nil {
		removeBin()
	}
	os.Exit(code)
}

// fencekvBinary builds ../cmd/fencekv on first use and returns its path.
func fencekvBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		fencekvBin, removeBin, buildErr = fencekvtest.Build("../cmd/fencekv", "fencekv")
	})
	if buildErr != nil {
		t.Fatalf("building fencekv: %v", buildErr)
	}
	return fencekvBin
}

// verifyLong reports whether the long versions of the tests should run:
// `make verify` sets FENCEKV_VERIFY_LONG=1; without it, and with -short,
// the tests stay within seconds.
func verifyLong() bool { return os.Getenv("FENCEKV_VERIFY_LONG") == "1" }

// testSeed returns the seed for a test's random choices: FENCEKV_VERIFY_SEED
// if set (to replay a failure), else a fresh one. It is logged either way.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("FENCEKV_VERIFY_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("FENCEKV_VERIFY_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (replay the choices with FENCEKV_VERIFY_SEED=%d)", seed, seed)
	return seed
}

// artifactDir returns a directory for what a failing test leaves behind:
// $FENCEKV_VERIFY_ARTIFACTS if set, else a new temporary directory that is
// not removed, so its path can be printed and opened after the test.
func artifactDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("FENCEKV_VERIFY_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("artifacts dir: %v", err)
		}
		return d
	}
	d, err := os.MkdirTemp("", "fencekv-"+strings.ReplaceAll(t.Name(), "/", "-")+"-")
	if err != nil {
		t.Fatalf("artifacts dir: %v", err)
	}
	return d
}

// startTimeout bounds how long a server may take to start serving. It is
// generous: the race detector on two busy cores is slow.
const startTimeout = 60 * time.Second

var addrRE = regexp.MustCompile(`msg="fencekv serving".* addr=(\S+)`)

// serverProc is a `fencekv serve` process on one data dir, restartable. Its
// methods are safe for concurrent use; start and kill are called by one
// goroutine (the test's), clients call Up.
type serverProc struct {
	t   testing.TB
	bin string
	dir string

	mu      sync.Mutex    // guards the fields below
	cmd     *exec.Cmd     // the current incarnation; nil when down
	exited  chan struct{} // closed when the current incarnation has exited
	addr    string        // where the current incarnation serves; "" until it does
	up      chan struct{} // closed once an incarnation serves; replaced by kill
	killing bool          // the current incarnation is being killed by us
	started time.Time     // when the current incarnation was started
	starts  int
	logTail []string // the last lines of stderr, of all incarnations
}

// startServer starts `fencekv serve` on dir, listening on a random port of
// 127.0.0.1, and waits until it serves. The process is killed by PID in
// t.Cleanup if still running then.
func startServer(t testing.TB, dir string) *serverProc {
	t.Helper()
	s := &serverProc{t: t, bin: fencekvBinary(t), dir: dir, up: make(chan struct{})}
	t.Cleanup(s.stop)
	s.start()
	return s
}

// start runs a new incarnation on the same data dir and waits until it
// serves (or fails the test).
func (s *serverProc) start() {
	s.t.Helper()
	cmd := exec.Command(s.bin, "serve", "--data", s.dir, "--listen", "127.0.0.1:0", "--http", "", "--log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		s.t.Fatalf("server stderr: %v", err)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting fencekv serve: %v", err)
	}
	exited := make(chan struct{})
	serving := make(chan string, 1)
	s.mu.Lock()
	s.cmd, s.exited, s.addr, s.killing = cmd, exited, "", false
	s.started = time.Now()
	s.starts++
	n := s.starts
	s.mu.Unlock()

	go func() {
		s.readLog(n, stderr, serving)
		err := cmd.Wait()
		s.mu.Lock()
		killing := s.killing && s.cmd == cmd
		if s.cmd == cmd {
			s.cmd = nil
		}
		s.mu.Unlock()
		if !killing {
			// Errorf from a goroutine is allowed while the test runs; stop
			// (in Cleanup) waits for this goroutine, so it never runs late.
			s.t.Errorf("fencekv serve (incarnation %d, pid %d) exited on its own: %v\n%s", n, cmd.Process.Pid, err, s.tail())
		}
		close(exited)
	}()

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case addr := <-serving:
		s.mu.Lock()
		s.addr = addr
		close(s.up)
		s.mu.Unlock()
	case <-exited:
		s.t.Fatalf("fencekv serve (incarnation %d) exited before serving:\n%s", n, s.tail())
	case <-timer.C:
		s.t.Fatalf("fencekv serve (incarnation %d) did not serve within %v:\n%s", n, startTimeout, s.tail())
	}
}

// readLog keeps the tail of the server's stderr and reports the address
// from its "fencekv serving" line.
func (s *serverProc) readLog(n int, r io.Reader, serving chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		s.mu.Lock()
		s.logTail = append(s.logTail, fmt.Sprintf("[%d] %s", n, line))
		if len(s.logTail) > 200 {
			s.logTail = s.logTail[len(s.logTail)-100:]
		}
		s.mu.Unlock()
		if m := addrRE.FindStringSubmatch(line); m != nil {
			select {
			case serving <- m[1]:
			default:
			}
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

func (s *serverProc) tail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.logTail, "\n")
}

// Up returns the address of a serving incarnation, waiting for one (across
// a kill and restart) until ctx ends.
func (s *serverProc) Up(ctx context.Context) (string, error) {
	s.mu.Lock()
	up := s.up
	s.mu.Unlock()
	select {
	case <-up:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr, nil
}

// Started is when the current incarnation was started: every lease it
// rearmed on open runs at least a full TTL from then.
func (s *serverProc) Started() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// kill sends SIGKILL to the current incarnation and waits for it to exit.
// Clients calling Up from now on wait for the next start.
func (s *serverProc) kill() {
	s.t.Helper()
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	if cmd == nil {
		s.mu.Unlock()
		s.t.Fatalf("kill: the server is not running\n%s", s.tail())
		return
	}
	s.killing = true
	s.up = make(chan struct{})
	s.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		s.t.Fatalf("kill -9 %d: %v", cmd.Process.Pid, err)
	}
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-exited:
	case <-timer.C:
		s.t.Fatalf("fencekv serve (pid %d) still running %v after SIGKILL", cmd.Process.Pid, startTimeout)
	}
}

// stop kills the current incarnation, if any, by its PID and waits for it.
// It is the Cleanup of startServer.
func (s *serverProc) stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	if cmd != nil {
		s.killing = true
	}
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
	}
	if exited != nil {
		<-exited
	}
}

// randDuration returns a duration in [lo, hi).
func randDuration(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)))
}

// grantRec is an acknowledged lock grant, with its call and return times
// (any common time base).
type grantRec struct {
	lock      string
	token     uint64
	call, ret int64
}

// checkGrantOrder checks G1 on acknowledged grants of any locks: no token
// was granted twice, and a grant that returned before another was called
// has the lower token.
func checkGrantOrder(t *testing.T, grants []grantRec) {
	t.Helper()
	seen := map[uint64]string{}
	for _, g := range grants {
		if l, dup := seen[g.token]; dup {
			t.Errorf("G1: token %d granted twice (locks %s and %s)", g.token, l, g.lock)
		}
		seen[g.token] = g.lock
	}
	byCall := append([]grantRec(nil), grants...)
	byRet := append([]grantRec(nil), grants...)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].call < byCall[j].call })
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].ret < byRet[j].ret })
	var maxBefore uint64
	var from grantRec
	j := 0
	for _, g := range byCall {
		for ; j < len(byRet) && byRet[j].ret < g.call; j++ {
			if byRet[j].token > maxBefore {
				maxBefore, from = byRet[j].token, byRet[j]
			}
		}
		if g.token <= maxBefore {
			t.Errorf("G1: grant of %s called at %v got token %d, not above token %d of %s, granted before (returned at %v)",
				g.lock, time.Duration(g.call), g.token, maxBefore, from.lock, time.Duration(from.ret))
		}
	}
}

// opCounter counts the operations a test's workers complete, so that the
// test can wait for more of them (a kill schedule: "at least n more, and
// at least d from now").
type opCounter struct {
	n    atomic.Int64
	tick chan struct{} // gets a value after an operation, if none is pending
}

func newOpCounter() *opCounter { return &opCounter{tick: make(chan struct{}, 1)} }

// done counts one operation.
func (p *opCounter) done() {
	p.n.Add(1)
	select {
	case p.tick <- struct{}{}:
	default:
	}
}

// await returns once d has passed and at least n operations completed
// since it was called; it fails the test after two minutes without them.
func (p *opCounter) await(t testing.TB, n int64, d time.Duration, what string) {
	t.Helper()
	from := p.n.Load()
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	for p.n.Load()-from < n {
		select {
		case <-p.tick:
		case <-deadline.C:
			t.Fatalf("%s only %d operations in 2m", what, p.n.Load()-from)
		}
	}
}
