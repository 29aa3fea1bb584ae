package main

// End-to-end tests of the CLI's conventions: errors as JSON with --json,
// bytes that are not UTF-8 in JSON, hints for typos, shell completion; and
// how locks are described.

import (
	"bytes"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
)

// TestJSONErrors: with --json every error is one JSON object on stdout,
// with a code, and nothing on stderr: usage errors, connection errors and
// refusals alike. The exit status is the same as without --json.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	down := &shell{t: t, env: []string{"FENCEKV_ADDR=" + freeAddr(t)}}
	for _, tc := range []struct {
		args []string
		code int
		want map[string]any
	}{
		{[]string{"put", "k"}, exitUsage, map[string]any{"error": "usage"}},
		{[]string{"put", "k", "v", "--tokn", "7"}, exitUsage, map[string]any{"error": "usage"}},
		{[]string{"bogus"}, exitUsage, map[string]any{"error": "usage"}},
		{[]string{"lock", "acquire", "x", "--ttl", "10"}, exitUsage, map[string]any{"error": "usage"}},
		{[]string{"get", "k"}, exitError, map[string]any{"error": "unavailable"}},
		{[]string{"lock", "acquire", "x"}, exitError, map[string]any{"error": "unavailable"}},
	} {
		r := down.run(append(tc.args, "--json")...)
		if r.code != tc.code || r.stderr != "" || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("want exit %d and one line on stdout only, got %v", tc.code, r)
			continue
		}
		m := decodeJSON(t, r.stdout)
		wantFields(t, m, tc.want)
		if msg, _ := m["message"].(string); msg == "" {
			t.Errorf("%v: no message", r)
		}
	}

	s := startServer(t, t.TempDir())
	c := s.shell(t)
	tok := c.ok("lock", "acquire", "l", "--ttl", "30s")
	c.ok("put", "k", "v", "--token", strings.TrimSpace(tok))
	r := c.fails(exitFenced, "put", "k", "old", "--token", "0", "--json")
	wantFields(t, decodeJSON(t, r.stdout), map[string]any{"error": "stale_token", "fence": int(parseToken(t, tok))})
	wantEqual(t, "stderr", r.stderr, "")
	// A refusal of a txn names the key.
	r = c.fails(exitFenced, "txn", `{"ops": [{"op": "put", "key": "k", "value": "x"}]}`, "--json")
	wantFields(t, decodeJSON(t, r.stdout), map[string]any{"error": "stale_token", "key": "k"})
}

// TestJSONBytes: keys and values that are not UTF-8 come out in base64,
// marked by a NAME_encoding field; UTF-8 ones as they are.
func TestJSONBytes(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)
	raw := "\xff\xfe\x00bin"
	c.stdin = raw
	c.ok("put", "b/raw", "-")
	c.stdin = ""
	c.ok("put", "b/text", "héllo")
	m := c.jsonOK("get", "b/raw")
	wantFields(t, m, map[string]any{"key": "b/raw", "value": base64.StdEncoding.EncodeToString([]byte(raw)), "value_encoding": "base64"})
	if _, marked := m["key_encoding"]; marked {
		t.Errorf("a UTF-8 key is marked as base64: %v", m)
	}
	m = c.jsonOK("get", "b/text")
	wantFields(t, m, map[string]any{"value": "héllo"})
	if _, marked := m["value_encoding"]; marked {
		t.Errorf("a UTF-8 value is marked as base64: %v", m)
	}
	items := c.jsonOK("scan", "b/")["items"].([]any)
	wantFields(t, items[0].(map[string]any), map[string]any{"key": "b/raw", "value_encoding": "base64"})
}

// TestTypoHints: a mistyped command, subcommand or flag gets the nearest
// name; a subcommand group names its own commands and help; a duration
// without a unit is answered with how to write it. All are usage errors:
// exit 2, one line on stderr.
func TestTypoHints(t *testing.T) {
	t.Parallel()
	c := &shell{t: t, env: []string{"FENCEKV_ADDR=" + freeAddr(t)}}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lok", "info", "x"}, "did you mean 'fencekv lock'?"},
		{[]string{"stauts"}, "did you mean 'fencekv status'?"},
		{[]string{"help", "pt"}, "did you mean 'fencekv put'?"},
		{[]string{"lock", "aquire", "x"}, "did you mean 'fencekv lock acquire'?"},
		{[]string{"lock", "bogus"}, "its commands: acquire, renew, release, info, list; see 'fencekv lock --help'"},
		{[]string{"put", "k", "v", "--tokn", "7"}, "unknown flag --tokn; did you mean --token?"},
		{[]string{"lock", "acquire", "x", "--ttl", "10"}, "--ttl 10: a duration needs a unit: write 10s"},
		{[]string{"run-locked", "x", "--wait", "1.5", "--", "true"}, "--wait 1.5: a duration needs a unit: write 1.5s"},
		{[]string{"completion", "bsh"}, "did you mean bash?"},
	} {
		r := c.run(tc.args...)
		if r.code != exitUsage || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("want exit 2 and one line on stderr, got %v", r)
		}
		wantContains(t, strings.Join(tc.args, " "), r.stderr, tc.want)
	}
}

// TestCompletion: the completion scripts, and the completions fencekv
// gives them.
func TestCompletion(t *testing.T) {
	t.Parallel()
	c := &shell{t: t}
	wantContains(t, "bash script", c.ok("completion", "bash"), "complete -o bashdefault -o default -F _fencekv_complete fencekv")
	wantContains(t, "zsh script", c.ok("completion", "zsh"), "compdef _fencekv fencekv")
	wantContains(t, "fish script", c.ok("completion", "fish"), "complete -c fencekv")
	words := func(args ...string) []string { return strings.Fields(c.ok(append(args, completeFlag)...)) }
	if w := words(); !contains(w, "run-locked") || !contains(w, "lock") || contains(w, "verify-client") {
		t.Errorf("commands offered: %q", w)
	}
	if w := words("lock"); !contains(w, "acquire") || !contains(w, "release") {
		t.Errorf("lock's commands offered: %q", w)
	}
	if w := words("put", "k", "v", "--to"); !contains(w, "--token") {
		t.Errorf("put's flags offered: %q", w)
	}
	// With bash itself, if there is one.
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "fencekv")); err != nil {
		t.Fatal(err)
	}
	script := `eval "$(fencekv completion bash)"; COMP_WORDS=(fencekv lock rel); COMP_CWORD=2; _fencekv_complete; echo "${COMPREPLY[@]}"`
	cmd := exec.Command(bash, "-c", script)
	cmd.Env = cleanEnv("PATH=" + dir + ":" + os.Getenv("PATH"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	wantEqual(t, "bash completes 'fencekv lock rel'", strings.TrimSpace(string(out)), "release")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestServeBindFails: a server that cannot listen (the address is taken)
// exits non-zero and leaves no data dir behind: it listens before it
// creates or opens one.
func TestServeBindFails(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	dir := filepath.Join(t.TempDir(), "new-data")
	r := (&shell{t: t}).run("serve", "--data", dir, "--listen", s.addr)
	if r.code == 0 {
		t.Fatalf("serve on a busy address: want a non-zero exit, got %v", r)
	}
	wantContains(t, "stderr", r.stderr, s.addr)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("serve that could not listen left %s behind (stat: %v)", dir, err)
	}
}

// TestVerifyJSON: verify --json prints its report in the CLI's style:
// snake_case names and durations in *_ms.
func TestVerifyJSON(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	m := s.shell(t).jsonOK("verify", "--rounds", "2", "--ttl", "200ms", "--clients", "2", "--updates", "20")
	wantFields(t, m, map[string]any{"ok": true, "rounds": 2, "updates": 20, "stale_accepted": 0, "held_accepted": 0, "late_accepted": 0})
	for _, f := range []string{"prefix", "stale_refused", "held_refused", "acked", "late_attempted", "late_refused", "counter", "total", "violations", "elapsed_ms"} {
		if _, ok := m[f]; !ok {
			t.Errorf("verify --json has no %q: %v", f, m)
		}
	}
	for f := range m {
		if f != strings.ToLower(f) {
			t.Errorf("verify --json field %q is not snake_case", f)
		}
	}
}

// TestLockLine: how `lock info` and `lock list` describe a lock.
func TestLockLine(t *testing.T) {
	for _, tt := range []struct {
		in   fencekv.LockInfo
		want string
	}{
		{fencekv.LockInfo{Name: "L", Held: true, Token: 7, TTL: 1500 * time.Millisecond, Holder: "w1", Waiters: 2}, "L\theld by token 7 for 1.5s (holder \"w1\"), 2 waiting"},
		{fencekv.LockInfo{Name: "L", Held: true, Token: 7}, "L\theld by token 7, whose lease has just run out"},
		{fencekv.LockInfo{Name: "L", Token: 7, Delay: 2 * time.Second}, "L\tfree (last token 7), in lock-delay for 2s"},
		{fencekv.LockInfo{Name: "L"}, "L\tfree"},
	} {
		if got := lockLine(tt.in); got != tt.want {
			t.Errorf("lockLine(%+v) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

// TestJSONLogDurations: --log-format json writes durations as the text
// format does ("300ms"), not as integers of nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	var b bytes.Buffer
	log, err := newLogger(&b, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("lock granted", "ttl", 300*time.Millisecond, "token", 7)
	wantContains(t, "JSON log line", b.String(), `"ttl":"300ms","token":7`)
}
