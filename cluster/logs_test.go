package cluster

import (
	"context"
	"log"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv/cluster/clustertest"
	"github.com/hashicorp/go-hclog"
)

// records is a slog handler that keeps what it is given.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// TestRaftAndGossipLogLines: raft's and memberlist's lines reach the
// node's log at their own level, without their level tag or a timestamp
// of their own (a raft warning read `msg="2026-12-01T... [WARN]  raft:
// ..."`), and a peer's failed heartbeats, which repeat while it is down,
// at debug.
func TestRaftAndGossipLogLines(t *testing.T) {
	rec := &records{}
	w := slogWriter{slog.New(rec)}
	raftLog := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Debug, Output: w, DisableTime: true})
	gossipLog := log.New(w, "", 0)

	raftLog.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "127.0.0.1:1")
	raftLog.Error("failed to heartbeat to", "peer", "127.0.0.1:2")
	gossipLog.Printf("[ERR] memberlist: Failed to send gossip to 127.0.0.1:3")
	gossipLog.Printf("[DEBUG] memberlist: Stream connection from=127.0.0.1:4")
	gossipLog.Printf("a line [with brackets] and no level")
	// Routine for a rolling restart: not errors to page anyone for.
	raftLog.Error("failed to pipeline appendEntries", "peer", "n1", "error", "write tcp: broken pipe")
	raftLog.Error("failed to decode incoming command", "error", "transport shutdown")
	gossipLog.Printf("[WARN] memberlist: Refuting a dead message (from: n2)")

	want := []struct {
		level slog.Level
		msg   string
	}{
		{slog.LevelWarn, `raft: heartbeat timeout reached, starting election: last-leader-addr=127.0.0.1:1`},
		{slog.LevelDebug, `raft: failed to heartbeat to: peer=127.0.0.1:2`},
		{slog.LevelError, `memberlist: Failed to send gossip to 127.0.0.1:3`},
		{slog.LevelDebug, `memberlist: Stream connection from=127.0.0.1:4`},
		{slog.LevelInfo, `a line [with brackets] and no level`},
		{slog.LevelDebug, `raft: failed to pipeline appendEntries: peer=n1 error="write tcp: broken pipe"`},
		{slog.LevelDebug, `raft: failed to decode incoming command: error="transport shutdown"`},
		{slog.LevelInfo, `memberlist: Refuting a dead message (from: n2)`},
	}
	if len(rec.recs) != len(want) {
		t.Fatalf("%d records; want %d", len(rec.recs), len(want))
	}
	for i, w := range want {
		if r := rec.recs[i]; r.Level != w.level || r.Message != w.msg {
			t.Errorf("record %d: %v %q; want %v %q", i, r.Level, r.Message, w.level, w.msg)
		}
	}
}

// TestWrongJoinWarned: a node whose --join no member answers says so at
// warn, not only at debug, where an operator with a typo in --join saw
// nothing but raft's "no known peers" (found by an operator's
// walk-through).
func TestWrongJoinWarned(t *testing.T) {
	after := joinWarnAfter
	joinWarnAfter = 100 * time.Millisecond
	t.Cleanup(func() { joinWarnAfter = after })
	rec := &records{}
	cfg := leaderlessConfig(t, "lonely")
	cfg.Join = []string{clustertest.FreeAddr(t)} // nothing there
	cfg.Engine.Logger = slog.New(rec)
	serveNode(t, cfg)
	warned := func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, r := range rec.recs {
			if r.Level == slog.LevelWarn && strings.Contains(r.Message, "no member listed in --join answers yet") {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(30 * time.Second)
	for !warned() {
		if time.Now().After(deadline) {
			t.Fatal("no warning of a --join that nobody answers within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
