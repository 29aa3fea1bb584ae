package clustertest

// Membership as the nodes tell it: wire members and /metrics, and a wait
// until every running node's view agrees with the voter set a test made.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// Members asks nd for the members it knows of (wire members).
func (c *Cluster) Members(nd *Node) ([]fencekv.Member, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cl, err := wire.DialWith(ctx, nd.Client, c.dial)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return cl.Members(ctx)
}

// Metrics scrapes nd's /metrics (on its --http address): each sample,
// named as exposed with its labels (`fencekv_cluster_voters{state="alive"}`),
// and its value.
func (c *Cluster) Metrics(nd *Node) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+nd.HTTP+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("clustertest: %s /metrics: %s", nd.Name, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("clustertest: %s /metrics: %q: %v", nd.Name, line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// memberStates are the gossip states the membership gauges are exposed
// for (metrics/collect.go).
var memberStates = []string{"alive", "suspect", "dead", "left", "unknown"}

// CheckMembers reports how the running nodes' views of the membership
// differ from voters (nil if they agree). It checks, on every running
// node:
//
//   - its status: it is the leader, or a follower of the one leader every
//     node names;
//   - wire members: it lists voters exactly, the raft configuration is
//     voters (each a voter, no non-voter left over), each alive by
//     gossip, the one leader the leader; a node removed is not listed;
//   - /metrics: fencekv_cluster_voters and fencekv_cluster_members are
//     len(voters) alive and 0 in every other state,
//     fencekv_cluster_has_leader is 1.
//
// Every running node must be one of voters.
func (c *Cluster) CheckMembers(voters []*Node) error {
	want := map[string]bool{}
	for _, v := range voters {
		want[v.Name] = true
	}
	running := 0
	for _, nd := range c.Nodes {
		if !nd.Running() {
			continue
		}
		running++
		if !want[nd.Name] {
			return fmt.Errorf("%s runs but is not among the voters %v", nd.Name, names(voters))
		}
	}
	leader := "" // by its client address, as status names it
	for _, nd := range voters {
		if !nd.Running() {
			return fmt.Errorf("voter %s is not running", nd.Name)
		}
		st, err := c.Status(nd)
		if err != nil {
			return fmt.Errorf("%s status: %v", nd.Name, err)
		}
		switch {
		case st.Role != "leader" && st.Role != "follower":
			return fmt.Errorf("%s is %q", nd.Name, st.Role)
		case st.Leader == "":
			return fmt.Errorf("%s knows no leader", nd.Name)
		case leader == "":
			leader = st.Leader
		case st.Leader != leader:
			return fmt.Errorf("%s says %s leads, another said %s", nd.Name, st.Leader, leader)
		}
		if (st.Role == "leader") != (nd.Client == leader) {
			return fmt.Errorf("%s is %s, but %s leads", nd.Name, st.Role, leader)
		}
		ms, err := c.Members(nd)
		if err != nil {
			return fmt.Errorf("%s members: %v", nd.Name, err)
		}
		seen := map[string]bool{}
		for _, m := range ms {
			inRaft := m.RaftRole != ""
			switch {
			case want[m.Node] && !m.Voter:
				return fmt.Errorf("%s lists %s as not a voter (%s, %q)", nd.Name, m.Node, m.State, m.RaftRole)
			case want[m.Node] && m.State != "alive":
				return fmt.Errorf("%s lists voter %s as %s", nd.Name, m.Node, m.State)
			case want[m.Node] && (m.RaftRole == "leader") != (m.ClientAddr == leader):
				return fmt.Errorf("%s lists %s as %s, but %s leads", nd.Name, m.Node, m.RaftRole, leader)
			case !want[m.Node] && inRaft:
				return fmt.Errorf("%s still has %s in raft (voter %v, %s)", nd.Name, m.Node, m.Voter, m.State)
			case !want[m.Node]:
				return fmt.Errorf("%s lists %s (%s), not in raft", nd.Name, m.Node, m.State)
			}
			seen[m.Node] = true
		}
		for _, v := range voters {
			if !seen[v.Name] {
				return fmt.Errorf("%s does not list %s", nd.Name, v.Name)
			}
		}
		mt, err := c.Metrics(nd)
		if err != nil {
			return fmt.Errorf("%s metrics: %v", nd.Name, err)
		}
		for _, s := range memberStates {
			wantVoters := 0
			if s == "alive" {
				wantVoters = len(voters)
			}
			if g, ok := mt[`fencekv_cluster_voters{state="`+s+`"}`]; !ok || int(g) != wantVoters {
				return fmt.Errorf("%s /metrics: fencekv_cluster_voters{state=%q} is %v (exposed %v), want %d", nd.Name, s, g, ok, wantVoters)
			}
		}
		for _, s := range memberStates {
			wantMembers := 0
			if s == "alive" {
				wantMembers = running
			}
			if g, ok := mt[`fencekv_cluster_members{state="`+s+`"}`]; !ok || int(g) != wantMembers {
				return fmt.Errorf("%s /metrics: fencekv_cluster_members{state=%q} is %v (exposed %v), want %d", nd.Name, s, g, ok, wantMembers)
			}
		}
		if g, ok := mt["fencekv_cluster_has_leader"]; ok && g != 1 {
			return fmt.Errorf("%s /metrics: fencekv_cluster_has_leader is %v", nd.Name, g)
		}
	}
	if !slices.ContainsFunc(voters, func(v *Node) bool { return v.Client == leader }) {
		return fmt.Errorf("the leader, %s, is none of the voters", leader)
	}
	return nil
}

// WaitMembers waits until CheckMembers(voters) passes, and fails the test
// with the last difference if it does not within the given time. It
// returns how long it waited.
func (c *Cluster) WaitMembers(tb testing.TB, voters []*Node, within time.Duration) time.Duration {
	tb.Helper()
	began := time.Now()
	deadline := began.Add(within)
	last := ""
	for {
		err := c.CheckMembers(voters)
		if err == nil {
			return time.Since(began)
		}
		if err.Error() != last { // each new difference, as it settles
			last = err.Error()
			tb.Logf("clustertest: at %v: %v", time.Since(began).Round(time.Millisecond), err)
		}
		if time.Now().After(deadline) {
			tb.Fatalf("clustertest: the members do not agree on voters %v within %v: %v", names(voters), within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func names(nodes []*Node) []string {
	var out []string
	for _, nd := range nodes {
		out = append(out, nd.Name)
	}
	slices.Sort(out)
	return out
}
