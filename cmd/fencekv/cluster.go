package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/cluster"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

// clusterFlags are serve's flags for running as a node of a cluster.
func clusterFlags() []cli.Flag {
	d := cluster.DefaultConfig()
	env := func(name string) []string { return []string{"FENCEKV_" + name} }
	return []cli.Flag{
		&cli.StringFlag{Name: "node", EnvVars: env("NODE"), Usage: "run as the cluster node `NAME` (unique; kept in the data dir); without it, a single node"},
		&cli.StringFlag{Name: "raft", EnvVars: env("RAFT"), Usage: "replication `ADDRESS` (host:port) of this node"},
		&cli.StringFlag{Name: "raft-advertise", EnvVars: env("RAFT_ADVERTISE"), Usage: "replication `ADDRESS` (host:port) the other nodes dial, if not --raft (NAT, or a proxy in front of the node)"},
		&cli.StringFlag{Name: "gossip", EnvVars: env("GOSSIP"), Usage: "membership `ADDRESS` (host:port, TCP and UDP) of this node"},
		&cli.StringFlag{Name: "join", EnvVars: env("JOIN"), Usage: "gossip `ADDRESSES` of running members, comma-separated (retried until one answers)"},
		&cli.IntFlag{Name: "bootstrap-expect", EnvVars: env("BOOTSTRAP_EXPECT"), Usage: "bootstrap a new cluster once `N` servers without state see each other"},
		&cli.DurationFlag{Name: "reap-after", Value: d.ReapAfter, EnvVars: env("REAP_AFTER"), Usage: "remove a server gossip has found dead for this long"},
		&cli.DurationFlag{Name: "hold-timeout", Value: d.HoldTimeout, EnvVars: env("HOLD_TIMEOUT"), Usage: "how long a request waits for a leader before it is answered unavailable"},
		&cli.Uint64Flag{Name: "snapshot-threshold", Value: d.SnapshotThreshold, EnvVars: env("SNAPSHOT_THRESHOLD"), Usage: "raft log entries between snapshots", Hidden: true},
		&cli.Uint64Flag{Name: "trailing-logs", Value: d.TrailingLogs, EnvVars: env("TRAILING_LOGS"), Usage: "raft log entries kept after a snapshot", Hidden: true},
	}
}

// engine is what serve runs: a single node's DB or a cluster node.
type engine interface {
	wire.Engine
	Close() error
}

// openEngine opens the single node's DB, or, with --node, a cluster node
// whose clients reach it at clientAddr.
func openEngine(c *cli.Context, dir, clientAddr string, o fencekv.Options, sec *serverSecurity) (engine, error) {
	name := c.String("node")
	if name == "" {
		for _, f := range []string{"raft", "raft-advertise", "gossip", "join", "bootstrap-expect"} {
			if c.IsSet(f) {
				return nil, usagef("--%s needs --node (a cluster node's name)", f)
			}
		}
		db, err := fencekv.Open(dir, &o)
		if errors.Is(err, fencekv.ErrLocked) {
			return nil, fmt.Errorf("data dir %s is in use by another fencekv process", dir)
		}
		if err != nil {
			return nil, fmt.Errorf("opening data dir %s: %w", dir, err)
		}
		return db, nil
	}
	cc := cluster.DefaultConfig()
	cc.Name = name
	cc.Dir = dir
	cc.ClientAddr = clientAddr
	cc.RaftAddr = c.String("raft")
	cc.RaftAdvertise = c.String("raft-advertise")
	cc.GossipAddr = c.String("gossip")
	if cc.RaftAddr == "" || cc.GossipAddr == "" {
		return nil, usagef("a cluster node needs --raft and --gossip addresses")
	}
	cc.Join = splitList(c.String("join"))
	cc.BootstrapExpect = c.Int("bootstrap-expect")
	cc.ReapAfter = c.Duration("reap-after")
	cc.HoldTimeout = c.Duration("hold-timeout")
	cc.SnapshotThreshold = c.Uint64("snapshot-threshold")
	cc.TrailingLogs = c.Uint64("trailing-logs")
	cc.Engine = o
	sec.configureCluster(&cc) // raft TLS, gossip key, forwarding over TLS (security.go)
	n, err := cluster.Open(cc)
	if errors.Is(err, fencekv.ErrLocked) {
		return nil, fmt.Errorf("data dir %s is in use by another fencekv process", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("starting cluster node %s: %w", name, err)
	}
	return n, nil
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func membersCommand() *cli.Command {
	return &cli.Command{
		Name:  "members",
		Usage: "list the nodes of the cluster",
		UsageText: `fencekv members [--addr ADDR,...] [--json]

Lists every node the cluster knows, as the node reached sees it: its name,
client address, gossip state (alive, suspect, dead, left), whether it votes
in raft, its raft role ("-" for a node that is dead or left), and the
process id of its server, asked of the node itself (status), "-" if it does
not answer within a second (to stop or kill one by hand). A single node
lists nothing.

Example:
  fencekv members --addr 127.0.0.1:7420,127.0.0.1:7421`,
		Flags: clientFlags(),
		Action: func(c *cli.Context) error {
			do, err := clientSecurityOf(c).dialOptions()
			if err != nil {
				return err
			}
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				ms, err := cl.Members(ctx)
				if err != nil {
					return refused(c, err)
				}
				pids := memberPIDs(ctx, ms, do)
				human, out := membersTable(ms, pids)
				return show(c, human, map[string]any{"members": out})
			})
		},
	}
}

// memberGone reports whether gossip finds a member dead or departed: it has
// no raft role then, whatever the raft configuration still says.
func memberGone(m fencekv.Member) bool { return m.State == "dead" || m.State == "left" }

// memberPIDs asks each member that gossip does not find gone for its
// status, at once, within a second, and returns the process ids of those
// that answered as themselves, by node name.
func memberPIDs(ctx context.Context, ms []fencekv.Member, do *wire.DialOptions) map[string]int {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	pids := map[string]int{}
	for _, m := range ms {
		if memberGone(m) || m.ClientAddr == "" {
			continue
		}
		wg.Go(func() {
			o := *do
			o.DialTimeout = time.Second
			cl, err := wire.DialCluster(ctx, []string{m.ClientAddr}, &o)
			if err != nil {
				return
			}
			defer cl.Close()
			st, err := cl.Status(ctx)
			if err != nil || st.Node != m.Node || st.PID == 0 {
				return
			}
			mu.Lock()
			pids[m.Node] = st.PID
			mu.Unlock()
		})
	}
	wg.Wait()
	return pids
}

// membersTable renders ms, with the process ids known, for people and as
// JSON (pid null where unknown; raft_role "" for a node gone).
func membersTable(ms []fencekv.Member, pids map[string]int) (string, []map[string]any) {
	if len(ms) == 0 {
		return "a single node: no cluster members", []map[string]any{}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-10s %-21s %-21s %-8s %-6s %-9s %s", "NODE", "CLIENT", "RAFT", "STATE", "VOTER", "ROLE", "PID")
	out := make([]map[string]any, 0, len(ms))
	for _, m := range ms {
		role, pid := m.RaftRole, "-"
		if memberGone(m) || role == "" {
			role = "-"
		}
		var jpid any
		if p, ok := pids[m.Node]; ok {
			pid, jpid = strconv.Itoa(p), p
		}
		fmt.Fprintf(&b, "\n%-10s %-21s %-21s %-8s %-6v %-9s %s", m.Node, m.ClientAddr, m.RaftAddr, m.State, m.Voter, role, pid)
		jrole := m.RaftRole
		if memberGone(m) {
			jrole = ""
		}
		out = append(out, map[string]any{"node": m.Node, "client_addr": m.ClientAddr, "raft_addr": m.RaftAddr,
			"gossip_addr": m.GossipAddr, "state": m.State, "voter": m.Voter, "raft_role": jrole, "pid": jpid})
	}
	return b.String(), out
}
