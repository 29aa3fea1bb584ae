package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
)

// TestGlobalFlags: the client flags work before the command as after it
// ("fencekv --addr X get k", as etcdctl and kubectl take them), the
// command's own copy winning; a global flag the command does not take,
// and a mistyped global flag, are usage errors with a hint.
func TestGlobalFlags(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	bare := &shell{t: t, env: []string{"FENCEKV_ADDR=" + freeAddr(t)}}
	bare.ok("--addr", s.addr, "put", "k", "v")
	wantEqual(t, "fencekv --addr X get k", bare.ok("--addr", s.addr, "get", "k"), "v\n")
	wantEqual(t, "fencekv --addr=X get k", bare.ok("--addr="+s.addr, "get", "k"), "v\n")
	m := decodeJSON(t, bare.ok("--json", "--addr", s.addr, "ping"))
	if m["version"] != fencekv.Version {
		t.Errorf("fencekv --json ping: %v", m)
	}
	wantEqual(t, "fencekv --addr X lock acquire", bare.run("--addr", s.addr, "--timeout", "5s", "lock", "acquire", "l").code, 0)
	wantEqual(t, "the command's --addr wins", bare.ok("--addr", freeAddr(t), "get", "k", "--addr", s.addr), "v\n")
	r := bare.fails(exitUsage, "--addr", s.addr, "serve")
	wantContains(t, "fencekv --addr X serve", r.stderr, "unknown flag --addr")
	r = bare.fails(exitUsage, "--adr", s.addr, "get", "k")
	wantContains(t, "fencekv --adr X get k", r.stderr, "did you mean --addr?")
	wantContains(t, "fencekv --help", bare.ok("--help"), "GLOBAL OPTIONS")
}

// TestGetRaw: get --raw and get -o FILE give the value's bytes alone, so
// that a file put from stdin comes back the same; a missing key writes no
// file and exits 6.
func TestGetRaw(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.shell(t)
	data := make([]byte, 4096)
	rand.Read(data)
	data = append(data, '\n', '\n')
	c.stdin = string(data)
	c.ok("put", "file", "-")
	c.stdin = ""
	if got := c.ok("get", "file", "--raw"); got != string(data) {
		t.Errorf("get --raw: %d bytes, not the %d put", len(got), len(data))
	}
	out := filepath.Join(t.TempDir(), "out")
	wantEqual(t, "get -o stdout", c.ok("get", "file", "-o", out), "")
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data) {
		t.Errorf("get -o: %d bytes (%v), not the %d put", len(got), err, len(data))
	}
	c.ok("put", "short", "v")
	wantEqual(t, "get --raw short", c.ok("get", "short", "--raw"), "v")
	wantEqual(t, "get short", c.ok("get", "short"), "v\n")
	missing := filepath.Join(t.TempDir(), "missing")
	c.fails(exitNotFound, "get", "nokey", "-o", missing)
	if _, err := os.Stat(missing); err == nil {
		t.Error("get -o of a missing key wrote a file")
	}
	c.fails(exitUsage, "get", "short", "--raw", "--json")
}

// TestCompletionShells: the completion command's argument completes to
// the shells, in bash, zsh (the same protocol) and fish, not to "help h".
func TestCompletionShells(t *testing.T) {
	t.Parallel()
	c := &shell{t: t}
	w := strings.Fields(c.ok("completion", completeFlag))
	if strings.Join(w, " ") != "bash zsh fish" {
		t.Errorf("fencekv completion <TAB> offers %q, want bash zsh fish", w)
	}
	fish := c.ok("completion", "fish")
	wantContains(t, "fish script", fish, "__fish_seen_subcommand_from completion' -f -a 'bash zsh fish'")
	for _, line := range strings.Split(fish, "\n") {
		if strings.Contains(line, "subcommand_from completion") && strings.Contains(line, "help h") {
			t.Errorf("fish offers help for completion: %s", line)
		}
	}
}

// TestMembersTable: a dead or departed node's role is "-" whatever raft's
// configuration says, and a pid is shown where the node told it.
func TestMembersTable(t *testing.T) {
	ms := []fencekv.Member{
		{Node: "n0", ClientAddr: "127.0.0.1:7420", State: "alive", Voter: true, RaftRole: "leader"},
		{Node: "n1", ClientAddr: "127.0.0.1:7421", State: "dead", Voter: true, RaftRole: "follower"},
	}
	human, js := membersTable(ms, map[string]int{"n0": 4242})
	lines := strings.Split(human, "\n")
	if f := strings.Fields(lines[1]); f[len(f)-2] != "leader" || f[len(f)-1] != "4242" {
		t.Errorf("alive leader: %q", lines[1])
	}
	if f := strings.Fields(lines[2]); f[len(f)-2] != "-" || f[len(f)-1] != "-" {
		t.Errorf("dead node: %q, want role and pid -", lines[2])
	}
	if js[1]["raft_role"] != "" || js[1]["pid"] != nil || js[0]["pid"] != 4242 {
		t.Errorf("JSON: %v", js)
	}
}

// TestMembersPID: a cluster node's members lists its server's pid, the
// one its status gives.
func TestMembersPID(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), "--node", "n0", "--raft", freeAddr(t), "--gossip", freeAddr(t), "--bootstrap-expect", "1")
	c := s.shell(t)
	pid := strconv.Itoa(s.cmd.Process.Pid)
	var out string
	waitFor(t, 10*time.Second, "members to list n0 with its role", func() bool {
		out = c.ok("members")
		return strings.Contains(out, "leader")
	})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if f := strings.Fields(lines[len(lines)-1]); f[len(f)-1] != pid {
		t.Errorf("members: %q, want pid %s", out, pid)
	}
	wantFields(t, c.jsonOK("status"), map[string]any{"pid": s.cmd.Process.Pid})
}
