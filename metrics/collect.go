package metrics

import (
	"context"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/prometheus/client_golang/prometheus"
)

// storeCollector reads the attached store at scrape time: one Status call
// per scrape.
type storeCollector struct{ m *Metrics }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	dBuild         = desc("fencekv_build_info", "Always 1; the version of fencekv serving.", "version")
	dLastToken     = desc("fencekv_last_token", "The highest fencing token the store has issued.")
	dRevision      = desc("fencekv_revision", "The store-wide revision: accepted writes.")
	dKeys          = desc("fencekv_keys", "Live keys.")
	dLocks         = desc("fencekv_locks_held", "Locks held by a live lease.")
	dWaiters       = desc("fencekv_lock_waiters", "Callers queued for locks (on a cluster node: those queued on it as leader).")
	dGrants        = desc("fencekv_leases_granted_total", "Locks granted (acquires, and hand-offs to queued callers) applied since the process started.")
	dExpiries      = desc("fencekv_leases_expired_total", "Leases that ran out without a renew, applied since the process started.")
	dCommits       = desc("fencekv_commits_total", "Group commits (one log sync each) on a single node since start.")
	dCommands      = desc("fencekv_commands_total", "Commands applied through group commits on a single node since start.")
	dDataSize      = desc("fencekv_data_size_bytes", "Size of the data file.")
	dConns         = desc("fencekv_open_connections", "Client connections open.")
	dRole          = desc("fencekv_cluster_role", "1 for this node's raft role, 0 for the others (single: not a cluster).", "role")
	dHasLeader     = desc("fencekv_cluster_has_leader", "1 if this node knows a leader, else 0.")
	dTerm          = desc("fencekv_raft_term", "This node's raft term.")
	dCommit        = desc("fencekv_raft_commit_index", "The last raft index this node knows committed.")
	dApplied       = desc("fencekv_raft_applied_index", "The last raft index this node applied.")
	dLeaderChanges = desc("fencekv_raft_leader_changes_total", "Changes of leader this node has seen since start (including to no leader).")
	dFollowerReads = desc("fencekv_follower_reads_total", "Linearizable reads this node answered from its own state as a follower, with a read index from the leader.")
	dLastContact   = desc("fencekv_raft_last_contact_seconds", "Time since this node last heard from the leader (0 on the leader); absent if it never has.")
	dScrapeErr     = desc("fencekv_status_errors_total", "Scrapes whose reading of the store's status failed.")
	dMembers       = desc("fencekv_cluster_members", "Nodes this node knows of, by gossip state (alive, suspect, dead, left; unknown: in raft's configuration, never heard of by gossip).", "state")
	dVoters        = desc("fencekv_cluster_voters", "Voters in the raft configuration, by gossip state: a voter not alive is a quorum's margin spent.", "state")
)

// memberStates are the states fencekv_cluster_members and
// fencekv_cluster_voters are reported for (0 if none), so that an alert
// sees each series from the start.
var memberStates = []string{"alive", "suspect", "dead", "left", "unknown"}

// members is a cluster node: it lists what gossip and raft know of the
// cluster's nodes.
type members interface {
	Members(context.Context) ([]fencekv.Member, error)
}

var roles = []string{"single", "leader", "follower", "candidate"}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dBuild, dLastToken, dRevision, dKeys, dLocks, dWaiters, dGrants, dExpiries,
		dCommits, dCommands, dDataSize, dConns, dRole, dHasLeader, dTerm, dCommit, dApplied, dLeaderChanges, dFollowerReads, dLastContact, dScrapeErr,
		dMembers, dVoters} {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(dBuild, prometheus.GaugeValue, 1, fencekv.Version)
	st := c.m.state.Load()
	if st.conns != nil {
		ch <- prometheus.MustNewConstMetric(dConns, prometheus.GaugeValue, float64(st.conns.Conns()))
	}
	if st.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := st.store.Status(ctx)
	if err != nil {
		c.m.statusErrs.Add(1)
	}
	ch <- prometheus.MustNewConstMetric(dScrapeErr, prometheus.CounterValue, float64(c.m.statusErrs.Load()))
	if err != nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(dLastToken, float64(s.LastToken))
	gauge(dRevision, float64(s.Revision))
	gauge(dKeys, float64(s.Keys))
	gauge(dLocks, float64(s.Locks))
	gauge(dWaiters, float64(s.Waiters))
	counter(dGrants, float64(s.Grants))
	counter(dExpiries, float64(s.Expiries))
	gauge(dDataSize, float64(s.DataSize))
	for _, r := range roles {
		v := 0.0
		if r == s.Role {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(dRole, prometheus.GaugeValue, v, r)
	}
	if s.Role == "single" || s.Role == "" {
		counter(dCommits, float64(s.Commits))
		counter(dCommands, float64(s.Commands))
		return
	}
	hasLeader := 0.0
	if s.Leader != "" {
		hasLeader = 1
	}
	gauge(dHasLeader, hasLeader)
	gauge(dTerm, float64(s.Term))
	gauge(dCommit, float64(s.CommitIndex))
	gauge(dApplied, float64(s.AppliedIndex))
	if r, ok := st.store.(Raft); ok {
		counter(dLeaderChanges, float64(r.LeaderChanges()))
		if d, ok := r.LastContact(); ok {
			gauge(dLastContact, d.Seconds())
		}
	}
	if r, ok := st.store.(followerReader); ok {
		counter(dFollowerReads, float64(r.FollowerReads()))
	}
	if ml, ok := st.store.(members); ok {
		if ms, err := ml.Members(ctx); err == nil {
			all, voters := map[string]int{}, map[string]int{}
			for _, m := range ms {
				all[m.State]++
				if m.Voter {
					voters[m.State]++
				}
			}
			for _, state := range memberStates {
				ch <- prometheus.MustNewConstMetric(dMembers, prometheus.GaugeValue, float64(all[state]), state)
				ch <- prometheus.MustNewConstMetric(dVoters, prometheus.GaugeValue, float64(voters[state]), state)
			}
		}
	}
}

// followerReader is a cluster node that answers linearizable reads as a
// follower.
type followerReader interface {
	FollowerReads() uint64
}
