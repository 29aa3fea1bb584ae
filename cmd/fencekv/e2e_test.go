package main

// End-to-end tests of the real binary, used as a person would: a server
// process on a random port of 127.0.0.1 with its data in t.TempDir(), and
// the client commands run as processes against it, checked by their output
// and exit status.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// bin is the fencekv binary built by TestMain.
var bin string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	var remove func()
	var err error
	if bin, remove, err = fencekvtest.Build(".", "fencekv"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer remove()
	return m.Run()
}

// --- processes -----------------------------------------------------------

// logBuffer collects a process's output; safe for concurrent use.
type logBuffer = fencekvtest.Buffer

// server is a running 'fencekv serve' process.
type server struct {
	dir  string
	addr string
	cmd  *exec.Cmd
	log  *logBuffer
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, set before done closes
}

var servingAddr = regexp.MustCompile(`msg="fencekv serving" .*addr=(\S+)`)

// startServer runs 'fencekv serve' on dir, listening on a port the kernel
// picks, and waits for its "fencekv serving" log line. The process is
// killed when the test ends if it is still running.
func startServer(t *testing.T, dir string, extra ...string) *server {
	t.Helper()
	args := append([]string{bin, "serve", "--data", dir, "--listen", "127.0.0.1:0", "--http", ""}, extra...)
	return startServerCmd(t, dir, args)
}

// startServerCmd runs argv (a command that execs 'fencekv serve', so that
// its PID is the server's) and waits until it serves.
func startServerCmd(t *testing.T, dir string, argv []string) *server {
	t.Helper()
	s := &server{dir: dir, log: &logBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Env = cleanEnv()
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start serve: %v", err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() { s.kill() })
	waitFor(t, 10*time.Second, "the server's \"fencekv serving\" line", func() bool {
		select {
		case <-s.done:
			t.Fatalf("serve exited before serving: %v\n%s", s.err, s.log)
		default:
		}
		m := servingAddr.FindStringSubmatch(s.log.String())
		if m == nil {
			return false
		}
		s.addr = m[1]
		return true
	})
	return s
}

// kill stops the process by its pid, at once, if it still runs (a stopped
// process is continued first so that it can die).
func (s *server) kill() {
	select {
	case <-s.done:
		return
	default:
	}
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT)
	s.cmd.Process.Kill()
	<-s.done
}

func (s *server) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(s.cmd.Process.Pid, sig); err != nil {
		t.Fatalf("signal %v to the server: %v", sig, err)
	}
}

// wait waits for the process to exit and returns its exit status.
func (s *server) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(timeout):
		t.Fatalf("serve did not exit within %v; log:\n%s", timeout, s.log)
	}
	return s.cmd.ProcessState.ExitCode()
}

// stop sends SIGTERM and checks for a clean exit.
func (s *server) stop(t *testing.T) {
	t.Helper()
	s.signal(t, syscall.SIGTERM)
	if code := s.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM, want 0; log:\n%s", code, s.log)
	}
}

// cleanEnv is the test's environment without FENCEKV_* variables, so that
// the developer's own settings cannot change what is tested.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCEKV_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// result is how one CLI run ended.
type result struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("fencekv %s: exit %d\nstdout: %q\nstderr: %q", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// shell runs the binary as a client of the server (FENCEKV_ADDR set).
type shell struct {
	t     *testing.T
	env   []string
	stdin string
}

func (s *server) shell(t *testing.T, env ...string) *shell {
	return &shell{t: t, env: append([]string{"FENCEKV_ADDR=" + s.addr}, env...)}
}

// proc is a running client command.
type proc struct {
	args           []string
	cmd            *exec.Cmd
	stdout, stderr *logBuffer
	done           chan struct{} // closed when the process has exited
}

// start starts fencekv with args. The process is killed by its pid when
// the test ends if it is still running.
func (c *shell) start(args ...string) *proc {
	c.t.Helper()
	p := &proc{args: args, stdout: &logBuffer{}, stderr: &logBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = cleanEnv(c.env...)
	p.cmd.Stdin = strings.NewReader(c.stdin)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	// A grandchild left holding the output pipe must not hold up Wait.
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		c.t.Fatalf("fencekv %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	c.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT)
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for the process to exit and returns how it ended.
func (p *proc) wait(t *testing.T, timeout time.Duration) result {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("fencekv %s: still running after %v\nstdout: %q\nstderr: %q",
			strings.Join(p.args, " "), timeout, p.stdout, p.stderr)
	}
	return result{args: p.args, stdout: p.stdout.String(), stderr: p.stderr.String(), code: p.cmd.ProcessState.ExitCode()}
}

// run runs fencekv with args and returns its output and exit status.
func (c *shell) run(args ...string) result {
	c.t.Helper()
	return c.start(args...).wait(c.t, 30*time.Second)
}

// ok runs fencekv, wants exit status 0 and returns its standard output.
func (c *shell) ok(args ...string) string {
	c.t.Helper()
	r := c.run(args...)
	if r.code != 0 {
		c.t.Fatalf("want exit 0, got %v", r)
	}
	return r.stdout
}

// fails runs fencekv and wants exit status code.
func (c *shell) fails(code int, args ...string) result {
	c.t.Helper()
	r := c.run(args...)
	if r.code != code {
		c.t.Fatalf("want exit %d, got %v", code, r)
	}
	return r
}

// jsonOK runs fencekv with --json, wants exit status 0 and decodes the
// output.
func (c *shell) jsonOK(args ...string) map[string]any {
	c.t.Helper()
	return decodeJSON(c.t, c.ok(append(args, "--json")...))
}

func decodeJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("output is not a JSON object: %v\n%s", err, s)
	}
	return m
}

// --- assertions ----------------------------------------------------------

// waitFor polls cond until it holds, failing the test after timeout.
var waitFor = fencekvtest.Eventually

func wantEqual[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func wantContains(t *testing.T, what, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Errorf("%s = %q, want it to contain %q", what, s, sub)
	}
}

// wantFields checks fields of a decoded JSON object; numbers are compared
// as float64, as encoding/json decodes them.
func wantFields(t *testing.T, m map[string]any, want map[string]any) {
	t.Helper()
	for k, w := range want {
		got, ok := m[k]
		if !ok {
			t.Errorf("JSON %v has no field %q", m, k)
			continue
		}
		if i, isInt := w.(int); isInt {
			w = float64(i)
		}
		if got != w {
			t.Errorf("JSON field %q = %v (%T), want %v (%T)", k, got, got, w, w)
		}
	}
}

func parseToken(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil || n == 0 {
		t.Fatalf("want a token, got %q", s)
	}
	return n
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// --- tests ---------------------------------------------------------------

// TestKeys walks through the key commands and their exit statuses.
func TestKeys(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)

	wantContains(t, "ping", c.ok("ping"), "pong from "+s.addr)
	wantEqual(t, "version", strings.HasPrefix(c.ok("version"), "fencekv "), true)
	wantFields(t, c.jsonOK("status"), map[string]any{"last_token": 0, "revision": 0, "keys": 0, "locks": 0})

	// A missing key: nothing on stdout, exit 6.
	r := c.fails(exitNotFound, "get", "missing")
	wantEqual(t, "get missing: stdout", r.stdout, "")
	wantContains(t, "get missing: stderr", r.stderr, "not found")

	wantEqual(t, "put", c.ok("put", "config/mode", "blue"), "OK fence=0 revision=1\n")
	wantEqual(t, "get", c.ok("get", "config/mode"), "blue\n")
	wantFields(t, c.jsonOK("get", "config/mode"), map[string]any{"key": "config/mode", "found": true, "value": "blue", "fence": 0, "revision": 1})

	// "-" reads the value from stdin, bytes as they are.
	c.stdin = "line one\nline two"
	wantFields(t, c.jsonOK("put", "doc", "-"), map[string]any{"key": "doc", "fence": 0, "revision": 2})
	c.stdin = ""
	wantEqual(t, "get doc", c.ok("get", "doc"), "line one\nline two\n")

	// A value that looks like a flag goes after "--".
	c.ok("put", "dash", "--", "-x")
	wantEqual(t, "get dash", c.ok("get", "dash"), "-x\n")

	// cas: 0 means absent; a wrong revision exits 5 and says the current one.
	c.ok("cas", "once", "0", "first")
	r = c.fails(exitCondition, "cas", "once", "0", "second")
	wantContains(t, "cas refusal", r.stderr, "compare_failed")
	r = c.fails(exitCondition, "cas", "once", "0", "second", "--json")
	m := decodeJSON(t, r.stdout)
	wantFields(t, m, map[string]any{"error": "compare_failed"})
	rev := m["revision"].(float64)
	c.ok("cas", "once", strconv.FormatFloat(rev, 'f', 0, 64), "second")
	wantEqual(t, "get once", c.ok("get", "once"), "second\n")

	// incr: a missing key counts as 0; the delta may be negative.
	wantEqual(t, "incr", c.ok("incr", "n"), "1\n")
	wantEqual(t, "incr 10", c.ok("incr", "n", "10"), "11\n")
	wantEqual(t, "incr -5", c.ok("incr", "n", "-5"), "6\n")
	wantFields(t, c.jsonOK("incr", "n", "-10"), map[string]any{"key": "n", "value": -4})
	wantEqual(t, "get n", c.ok("get", "n"), "-4\n")
	r = c.fails(exitCondition, "incr", "config/mode")
	wantContains(t, "incr of text", r.stderr, "not_integer")
	wantFields(t, decodeJSON(t, c.fails(exitCondition, "incr", "config/mode", "--json").stdout), map[string]any{"error": "not_integer"})

	// scan lists live keys in byte order, with a prefix and a limit.
	// The note that more keys follow goes to stderr: stdout has only keys.
	r = c.run("scan", "--limit", "1")
	wantEqual(t, "scan --limit 1", r.stdout, "config/mode\tblue\t(fence 0, revision 1)\n")
	wantEqual(t, "scan --limit 1: stderr", r.stderr, "(more keys after \"config/mode\": raise --limit, or page on with --after \"config/mode\")\n")
	// --after pages on without repeating the last key; --start includes it.
	wantEqual(t, "scan --after", c.ok("scan", "--after", "config/mode", "--limit", "1"), "dash\t-x\t(fence 0, revision 3)\n")
	wantEqual(t, "scan --start", c.ok("scan", "--start", "dash", "--limit", "1"), "dash\t-x\t(fence 0, revision 3)\n")
	var keys []string
	for _, it := range c.jsonOK("scan")["items"].([]any) {
		keys = append(keys, it.(map[string]any)["key"].(string))
	}
	wantEqual(t, "scan keys", strings.Join(keys, " "), "config/mode dash doc n once")
	m = c.jsonOK("scan", "config/")
	items := m["items"].([]any)
	wantEqual(t, "scan config/ items", len(items), 1)
	wantFields(t, items[0].(map[string]any), map[string]any{"key": "config/mode", "value": "blue", "fence": 0, "revision": 1})
	wantFields(t, c.jsonOK("scan", "--limit", "2"), map[string]any{"more": true})
	r = c.run("scan", "zzz")
	wantEqual(t, "scan nothing", r.stdout+"|"+r.stderr, "|(no keys)\n")

	// del: a missing key is fine; the key is gone from get and scan.
	wantContains(t, "del", c.ok("del", "doc"), "OK deleted")
	wantContains(t, "del again", c.ok("delete", "doc"), "OK not found")
	c.fails(exitNotFound, "get", "doc")
	if strings.Contains(c.ok("scan"), "doc") {
		t.Error("scan lists a deleted key")
	}

	st := c.jsonOK("status")
	wantFields(t, st, map[string]any{"keys": 4})
	for _, f := range []string{"version", "last_token", "revision", "locks", "waiters", "commits", "commands", "data_size"} {
		if _, ok := st[f]; !ok {
			t.Errorf("status --json has no %q: %v", f, st)
		}
	}
}

// TestFencing is the story the CLI exists for: a token from an older grant
// is refused once a newer one wrote.
func TestFencing(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)

	old := parseToken(t, c.ok("lock", "acquire", "inventory", "--ttl", "30s"))
	// A second acquire is refused while held: exit 4, with the holder's token.
	r := c.fails(exitLockHeld, "lock", "acquire", "inventory", "--holder", "second")
	wantContains(t, "lock_held", r.stderr, "lock_held")
	m := decodeJSON(t, c.fails(exitLockHeld, "lock", "acquire", "inventory", "--json").stdout)
	wantFields(t, m, map[string]any{"error": "lock_held", "token": int(old)})
	if ms, _ := m["retry_ms"].(float64); ms <= 0 {
		t.Errorf("lock_held retry_ms = %v, want > 0", m["retry_ms"])
	}
	tok := func(n uint64) string { return strconv.FormatUint(n, 10) }

	c.ok("put", "inventory/sku-1", "41", "--token", tok(old))
	// Releasing with a token that does not hold the lock: exit 3.
	r = c.fails(exitFenced, "lock", "release", "inventory", "--token", tok(old+100))
	wantContains(t, "release with a wrong token", r.stderr, "not_holder")
	c.ok("lock", "release", "inventory", "--token", tok(old))
	c.fails(exitFenced, "lock", "release", "inventory", tok(old)) // released already

	m = c.jsonOK("lock", "acquire", "inventory", "--ttl", "30s")
	wantFields(t, m, map[string]any{"lock": "inventory", "ttl_ms": 30000})
	newer := uint64(m["token"].(float64))
	if newer <= old {
		t.Fatalf("second grant has token %d, want above %d", newer, old)
	}
	c.ok("put", "inventory/sku-1", "42", "--token", tok(newer))

	// The stale write: exit 3, the key keeps the newer value.
	r = c.fails(exitFenced, "put", "inventory/sku-1", "40", "--token", tok(old))
	wantContains(t, "stale put", r.stderr, "stale_token")
	wantFields(t, decodeJSON(t, c.fails(exitFenced, "put", "inventory/sku-1", "40", "--token", tok(old), "--json").stdout),
		map[string]any{"error": "stale_token", "fence": int(newer)})
	c.fails(exitFenced, "incr", "inventory/sku-1", "--token", tok(old))
	c.fails(exitFenced, "del", "inventory/sku-1", "--token", tok(old))
	// A write with no token is refused too, once the key is fenced.
	c.fails(exitFenced, "put", "inventory/sku-1", "0")
	wantFields(t, c.jsonOK("get", "inventory/sku-1"), map[string]any{"value": "42", "fence": int(newer)})

	// A held write (--lock) is refused when the token no longer holds it.
	c.fails(exitFenced, "put", "inventory/sku-2", "1", "--token", tok(old), "--lock", "inventory")
	c.ok("put", "inventory/sku-2", "1", "--token", tok(newer), "--lock", "inventory")
	// --strict wants a token above the fence.
	c.fails(exitFenced, "put", "inventory/sku-2", "2", "--token", tok(newer), "--strict")

	// A deleted key keeps its fence.
	c.ok("del", "inventory/sku-2", "--token", tok(newer))
	m = decodeJSON(t, c.fails(exitNotFound, "get", "inventory/sku-2", "--json").stdout)
	wantFields(t, m, map[string]any{"found": false, "fence": int(newer), "value": nil})
	c.fails(exitFenced, "put", "inventory/sku-2", "3", "--token", tok(old))
}

// TestFlagPlacement checks that flags work before and after the positional
// arguments, as people type them, and from the environment.
func TestFlagPlacement(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)
	for _, args := range [][]string{
		{"put", "k1", "v", "--token", "7"},
		{"put", "--token", "7", "k2", "v"},
		{"put", "k3", "--token", "7", "v"},
		{"put", "k4", "v", "-t", "7"},
		{"put", "k5", "v", "--token=7"},
		{"put", "k6", "v", "--json", "--token", "7"},
		{"incr", "k7", "-5", "--token", "7"},
		{"incr", "--token", "7", "k8", "-5"},
	} {
		c.ok(args...)
		wantFields(t, c.jsonOK("get", args[keyArg(args)]), map[string]any{"fence": 7})
	}
	wantEqual(t, "get k8", c.ok("get", "k8"), "-5\n")

	// FENCEKV_TOKEN stands for --token.
	ct := s.shell(t, "FENCEKV_TOKEN=9")
	ct.ok("put", "k1", "v2")
	wantFields(t, c.jsonOK("get", "k1"), map[string]any{"fence": 9, "value": "v2"})

	// --addr works before or after the arguments; it wins over FENCEKV_ADDR.
	bare := &shell{t: t}
	bare.ok("get", "k1", "--addr", s.addr)
	wrong := &shell{t: t, env: []string{"FENCEKV_ADDR=" + freeAddr(t)}}
	wrong.ok("get", "--addr", s.addr, "k1")

	// --help after the arguments is help for the command.
	for _, args := range [][]string{{"put", "k", "v", "--help"}, {"put", "--help"}, {"help", "put"}} {
		r := c.run(args...)
		if r.code != 0 || !strings.Contains(r.stdout, "fencekv put - ") {
			t.Errorf("want the put help and exit 0, got %v", r)
		}
	}
}

// keyArg finds the key among a command line's arguments: the
// first after the command name that is not a flag or a flag's value.
func keyArg(args []string) int {
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--token" || a == "-t":
			i++
		case strings.HasPrefix(a, "-"):
		default:
			return i
		}
	}
	return -1
}

// TestLocks covers the lock subcommands' output.
func TestLocks(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)

	r := c.run("lock", "list")
	wantEqual(t, "lock list, none", r.stdout+"|"+r.stderr, "|(no locks held)\n")
	wantContains(t, "lock info, never held", c.ok("lock", "info", "jobs/a"), "jobs/a\tfree")

	a := parseToken(t, c.ok("lock", "acquire", "jobs/a", "--ttl", "1m", "--holder", "worker-1"))
	b := parseToken(t, c.ok("lock", "acquire", "jobs/b"))
	if b <= a {
		t.Errorf("tokens %d then %d, want increasing", a, b)
	}
	info := c.ok("lock", "info", "jobs/a")
	wantContains(t, "lock info", info, fmt.Sprintf("jobs/a\theld by token %d", a))
	wantContains(t, "lock info", info, `(holder "worker-1")`)
	m := c.jsonOK("lock", "info", "jobs/a")
	wantFields(t, m, map[string]any{"lock": "jobs/a", "held": true, "holder": "worker-1", "token": int(a), "waiters": 0})
	if ms := m["ttl_ms"].(float64); ms <= 0 || ms > 60000 {
		t.Errorf("lock info ttl_ms = %v, want in (0, 60000]", ms)
	}

	list := c.ok("lock", "ls", "jobs/")
	wantEqual(t, "lock list lines", strings.Count(list, "\n"), 2)
	m = c.jsonOK("lock", "list", "--limit", "1")
	wantFields(t, m, map[string]any{"more": true})
	wantEqual(t, "lock list --limit 1", len(m["locks"].([]any)), 1)

	// renew takes the token as a flag or as the second argument.
	wantEqual(t, "renew", c.ok("lock", "renew", "jobs/b", "--token", strconv.FormatUint(b, 10)), "OK ttl=10s\n")
	wantFields(t, c.jsonOK("lock", "renew", "jobs/b", strconv.FormatUint(b, 10)), map[string]any{"ttl_ms": 10000, "token": int(b)})
	c.fails(exitFenced, "lock", "renew", "jobs/b", strconv.FormatUint(a, 10))
	c.fails(exitUsage, "lock", "renew", "jobs/b") // no token at all

	wantEqual(t, "release", c.ok("lock", "release", "jobs/b", "--token", strconv.FormatUint(b, 10)), "OK released\n")
	c.fails(exitFenced, "lock", "renew", "jobs/b", "--token", strconv.FormatUint(b, 10))
	wantFields(t, c.jsonOK("lock", "info", "jobs/b"), map[string]any{"held": false})

	// A queued acquire is granted when the holder releases.
	waiter := c.start("lock", "acquire", "jobs/a", "--wait", "20s")
	waitFor(t, 10*time.Second, "the waiter to queue", func() bool {
		return c.jsonOK("lock", "info", "jobs/a")["waiters"] == float64(1)
	})
	c.ok("lock", "release", "jobs/a", "--token", strconv.FormatUint(a, 10))
	r = waiter.wait(t, 10*time.Second)
	if r.code != 0 || parseToken(t, r.stdout) <= b {
		t.Errorf("queued acquire: want a token above %d, got %v", b, r)
	}
	// A wait that runs out exits 4.
	c.fails(exitLockHeld, "lock", "acquire", "jobs/a", "--wait", "200ms")
	// An out-of-range TTL is a usage error.
	wantContains(t, "ttl 1ms", c.fails(exitUsage, "lock", "acquire", "jobs/c", "--ttl", "1ms").stderr, "bad_request")
}

// TestUsageErrors: mistakes on the command line exit 2 with one line on
// stderr, before any server is asked (none listens here).
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	c := &shell{t: t, env: []string{"FENCEKV_ADDR=" + freeAddr(t)}}
	for _, args := range [][]string{
		{"put"},
		{"put", "k"},
		{"put", "k", "v", "extra"},
		{"get"},
		{"get", "a", "b"},
		{"put", "--bogus", "k", "v"},
		{"put", "k", "v", "--bogus"},
		{"put", "k", "v", "--token", "seven"},
		{"incr", "k", "abc"},
		{"cas", "k", "x", "v"},
		{"lock", "acquire"},
		{"lock", "acquire", "x", "--ttl", "banana"},
		{"lock", "release", "x"},
		{"lock", "bogus"},
		{"bogus"},
		{"help", "bogus"},
		{"run-locked"},
		{"run-locked", "name"},
		{"serve", "extra"},
		{"serve", "--event-loop", "false"}, // a boolean flag takes no separate value
		{"restore", "backup.fkvb"},         // no --data
	} {
		r := c.run(args...)
		if r.code != exitUsage {
			t.Errorf("want exit %d, got %v", exitUsage, r)
			continue
		}
		if r.stdout != "" || !strings.HasPrefix(r.stderr, "fencekv: ") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("want one line on stderr and nothing on stdout, got %v", r)
		}
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	c := &shell{t: t}
	for _, args := range [][]string{
		{"--help"},
		{},
		{"serve", "--help"},
		{"put", "--help"},
		{"lock", "--help"},
		{"lock"},
		{"lock", "acquire", "--help"},
		{"lock", "help", "acquire"},
		{"run-locked", "-h"},
	} {
		r := c.run(args...)
		if r.code != 0 || !strings.Contains(r.stdout, "USAGE:") {
			t.Errorf("want help and exit 0, got %v", r)
		}
	}
	wantContains(t, "fencekv --help", c.ok("--help"), "Exit status:")
	wantContains(t, "fencekv lock --help", c.ok("lock", "--help"), "acquire")
}

// TestNoServer: with nothing listening, client commands exit 1 and say
// what to check.
func TestNoServer(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	c := &shell{t: t, env: []string{"FENCEKV_ADDR=" + addr}}
	for _, args := range [][]string{
		{"ping"},
		{"get", "k"},
		{"put", "k", "v"},
		{"lock", "acquire", "x"},
		{"run-locked", "x", "--", "true"},
	} {
		r := c.fails(exitError, args...)
		wantContains(t, "stderr", r.stderr, addr)
		wantContains(t, "stderr", r.stderr, "is 'fencekv serve' running")
	}
}

// TestServeDataDirInUse: a second server on the same data dir refuses to
// start, and the first keeps serving.
func TestServeDataDirInUse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServer(t, dir)
	c := &shell{t: t}
	r := c.run("serve", "--data", dir, "--listen", "127.0.0.1:0", "--http", "")
	if r.code == 0 {
		t.Fatalf("second serve on the same dir: want a non-zero exit, got %v", r)
	}
	wantContains(t, "second serve: stderr", r.stderr, "in use")
	s.shell(t).ok("ping")

	// A busy address is refused too.
	r = c.run("serve", "--data", t.TempDir(), "--listen", s.addr, "--http", "")
	if r.code == 0 {
		t.Fatalf("serve on a busy address: want a non-zero exit, got %v", r)
	}
	wantContains(t, "serve on a busy address: stderr", r.stderr, s.addr)
}

// TestServeSIGTERM: SIGTERM stops the server cleanly (exit 0), its data is
// there after a restart, and the token sequence goes on from where it was.
func TestServeSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServer(t, dir)
	c := s.shell(t)
	tok := parseToken(t, c.ok("lock", "acquire", "l"))
	c.ok("put", "k", "v", "--token", strconv.FormatUint(tok, 10))
	s.stop(t)
	wantContains(t, "log", s.log.String(), `msg="shutting down" signal=terminated`)
	wantContains(t, "log", s.log.String(), `msg="fencekv stopped"`)

	s2 := startServer(t, dir)
	c = s2.shell(t)
	wantFields(t, c.jsonOK("get", "k"), map[string]any{"value": "v", "fence": int(tok)})
	if t2 := parseToken(t, c.ok("lock", "acquire", "other")); t2 <= tok {
		t.Errorf("token after restart = %d, want above %d", t2, tok)
	}
	s2.signal(t, syscall.SIGINT)
	wantEqual(t, "exit status after SIGINT", s2.wait(t, 15*time.Second), 0)
}

// TestGracefulShutdownUnderLoad: SIGTERM in the middle of a load of fenced,
// held writes from several clients loses no acknowledged write (G6), and
// the token sequence goes on after the restart (G1).
func TestGracefulShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServer(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	// worker is one client's history; only its goroutine touches it until
	// wg.Wait.
	type worker struct {
		lease    fencekv.Lease
		puts     []string // keys whose put was acknowledged; the value is the key
		incrMax  int64    // the value the last acknowledged incr returned
		incrSent int64    // incrs sent, acknowledged or not
		err      error    // the error that stopped it
	}
	const workers = 6
	ws := make([]*worker, workers)
	var acks atomic.Int64
	var wg sync.WaitGroup
	for i := range ws {
		cl, err := wire.Dial(ctx, s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		l, err := cl.Acquire(ctx, fmt.Sprintf("load/%d", i), time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		w := &worker{lease: l}
		ws[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := fencekv.WriteOptions{Token: l.Token, Lock: l.Name}
			counter := []byte(l.Name + "/counter")
			for n := 0; ; n++ {
				key := fmt.Sprintf("%s/%06d", l.Name, n)
				if _, err := cl.Put(ctx, []byte(key), []byte(key), o); err != nil {
					w.err = err
					return
				}
				w.puts = append(w.puts, key)
				acks.Add(1)
				w.incrSent++
				v, _, err := cl.Incr(ctx, counter, 1, o)
				if err != nil {
					w.err = err
					return
				}
				w.incrMax = v
				acks.Add(1)
			}
		}()
	}
	waitFor(t, 20*time.Second, "500 acknowledged writes", func() bool { return acks.Load() >= 500 })
	s.stop(t)
	wg.Wait()
	wantContains(t, "log", s.log.String(), `msg="fencekv stopped"`)

	var lastToken fencekv.Token
	for i, w := range ws {
		// The load ends with the connection; a refusal would be a bug.
		var fe *fencekv.Error
		if errors.As(w.err, &fe) && fe.Code != fencekv.CodeUnavailable {
			t.Errorf("worker %d: refused during shutdown: %v", i, w.err)
		}
		lastToken = max(lastToken, w.lease.Token)
	}

	s2 := startServer(t, dir)
	cl, err := wire.Dial(ctx, s2.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	total := 0
	for i, w := range ws {
		for _, key := range w.puts {
			e, err := cl.Get(ctx, []byte(key))
			if err != nil {
				t.Fatal(err)
			}
			if !e.Found || string(e.Value) != key || e.Fence != w.lease.Token {
				t.Errorf("worker %d: acknowledged put of %q lost: found=%v value=%q fence=%d, want fence %d",
					i, key, e.Found, e.Value, e.Fence, w.lease.Token)
			}
		}
		total += len(w.puts)
		e, err := cl.Get(ctx, []byte(w.lease.Name+"/counter"))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.ParseInt(string(e.Value), 10, 64)
		if n < w.incrMax || n > w.incrSent {
			t.Errorf("worker %d: counter is %d after the restart; acknowledged up to %d, sent %d", i, n, w.incrMax, w.incrSent)
		}
		total += int(w.incrMax)
	}
	t.Logf("%d acknowledged writes before SIGTERM, all there after the restart", total)
	l, err := cl.Acquire(ctx, "after-restart", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= lastToken {
		t.Errorf("token after the restart = %d, want above %d", l.Token, lastToken)
	}
	s2.stop(t)
}

// TestWatchCLI: fencekv watch prints each change under its prefix as it
// happens, one JSON object a line, and stops cleanly on SIGINT.
func TestWatchCLI(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)
	p := c.start("watch", "cfg/", "--locks", "--json")
	// The watch is on once a write before it is not printed and one
	// after it is: write until something shows.
	waitFor(t, 10*time.Second, "the watch to print", func() bool {
		c.ok("put", "cfg/probe", "x")
		return strings.Contains(p.stdout.String(), "cfg/probe")
	})
	c.ok("put", "cfg/a", "1")
	c.ok("put", "other", "1")
	c.ok("lock", "acquire", "cfg/L")
	waitFor(t, 10*time.Second, "the lock event", func() bool { return strings.Contains(p.stdout.String(), `"acquired"`) })
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t, 10*time.Second)
	if r.code != 0 {
		t.Fatalf("watch exited %d: %s", r.code, r.stderr)
	}
	var types []string
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if e["key"] == "other" {
			t.Fatalf("watch of cfg/ printed %v", e)
		}
		if e["key"] == "cfg/probe" {
			continue
		}
		types = append(types, fmt.Sprint(e["type"], " ", e["key"], e["lock"]))
	}
	if want := "[put cfg/a<nil> acquired <nil>cfg/L]"; fmt.Sprint(types) != want {
		t.Fatalf("events %v; want %s", types, want)
	}
}

// TestRefusalsCommand: `fencekv refusals` shows every refusal the server
// keeps, oldest first, over as many pages as it takes, and --follow goes on
// with new ones without skipping any. It used to print only the first page
// of 1000, and --follow skipped from there to the server's latest.
func TestRefusalsCommand(t *testing.T) {
	s := startServer(t, t.TempDir())
	sh := s.shell(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := wire.Dial(ctx, s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{Token: 5}); err != nil {
		t.Fatal(err)
	}
	refuse := func(n int) {
		for range n {
			if _, err := cl.Put(ctx, []byte("k"), []byte("stale"), fencekv.WriteOptions{Token: 1}); !errors.Is(err, fencekv.ErrStaleToken) {
				t.Fatalf("put with token 1 below fence 5 = %v; want stale_token", err)
			}
		}
	}
	refuse(1005)
	seqs := func(out string) []int {
		var got []int
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var m struct{ Seq int }
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("a line of refusals --json is not a JSON object: %v: %q", err, line)
			}
			got = append(got, m.Seq)
		}
		return got
	}
	inOrder := func(what string, got []int, from, to int) {
		t.Helper()
		if len(got) != to-from+1 || got[0] != from || got[len(got)-1] != to {
			t.Fatalf("%s: %d refusals, %v ... ; want #%d to #%d", what, len(got), got[:min(3, len(got))], from, to)
		}
		for i := range got {
			if got[i] != from+i {
				t.Fatalf("%s: refusal %d is #%d; want #%d", what, i, got[i], from+i)
			}
		}
	}
	text := strings.Split(strings.TrimSpace(sh.ok("refusals")), "\n")
	if len(text) != 1005 || !strings.Contains(text[1004], "#1005 stale_token") {
		t.Fatalf("refusals printed %d lines, the last %q; want 1005, the last #1005", len(text), text[len(text)-1])
	}
	inOrder("refusals --json", seqs(sh.ok("refusals", "--json")), 1, 1005)
	inOrder("refusals --since 1000", seqs(sh.ok("refusals", "--since", "1000", "--json")), 1001, 1005)

	p := sh.start("refusals", "--follow", "--json")
	lines := func() int { return strings.Count(p.stdout.String(), "\n") }
	waitFor(t, 30*time.Second, "--follow to print the 1005 kept", func() bool { return lines() >= 1005 })
	refuse(2)
	waitFor(t, 30*time.Second, "--follow to print the 2 new ones", func() bool { return lines() >= 1007 })
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t, 30*time.Second)
	inOrder("refusals --follow --json", seqs(r.stdout), 1, 1007)
}

// TestTimeoutOutcome: a command that changes state and gets no answer
// within --timeout may still be applied, and says so ("outcome":
// "unknown"); a read that times out does not. Here the server is stopped
// (SIGSTOP) with the put unread, and applies it when it resumes.
func TestTimeoutOutcome(t *testing.T) {
	s := startServer(t, t.TempDir())
	sh := s.shell(t)
	s.signal(t, syscall.SIGSTOP)
	put := decodeJSON(t, sh.fails(1, "put", "late", "v", "--timeout", "500ms", "--json").stdout)
	wantFields(t, put, map[string]any{"error": "timeout", "outcome": "unknown"})
	text := sh.fails(1, "put", "late", "v2", "--timeout", "500ms")
	wantContains(t, "a put's timeout", text.stderr, "it may still be applied")
	get := decodeJSON(t, sh.fails(1, "get", "late", "--timeout", "500ms", "--json").stdout)
	wantFields(t, get, map[string]any{"error": "timeout"})
	if _, ok := get["outcome"]; ok {
		t.Errorf("a get's timeout has an outcome: %v", get)
	}
	s.signal(t, syscall.SIGCONT)
	// What the user was told to expect: the write may land after all.
	// (Their order is the server's: they came on two connections.)
	waitFor(t, 10*time.Second, "the timed-out puts to be applied", func() bool {
		r := sh.run("get", "late")
		v := strings.TrimSpace(r.stdout)
		return r.code == 0 && (v == "v" || v == "v2")
	})
}

// TestSIGHUPWithNothingToReload: a server without TLS or an auth file
// logs a SIGHUP and goes on serving (Go's default for SIGHUP is to exit at
// once, with no graceful shutdown; it did, found by an operator's
// walk-through: logrotate sends it).
func TestSIGHUPWithNothingToReload(t *testing.T) {
	s := startServer(t, t.TempDir())
	sh := s.shell(t)
	sh.ok("put", "k", "v")
	s.signal(t, syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the SIGHUP's log line", func() bool {
		return strings.Contains(s.log.String(), "SIGHUP: nothing to reload")
	})
	wantEqual(t, "get after SIGHUP", strings.TrimSpace(sh.ok("get", "k")), "v")
	s.stop(t)
}
