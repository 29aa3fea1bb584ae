package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/bench"
	"github.com/fencekv/fencekv/bench/peers"
	"github.com/fencekv/fencekv/wire"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// benchpeers cluster: a 3-node fencekv cluster and a 3-member etcd
// cluster side by side, on loopback with default settings. It starts both
// clusters itself (it must kill their leaders), runs the throughput
// matrix with the clients spread over all nodes, then measures failover:
// under write load, kill -9 of the leader, and the time until a write is
// acknowledged again, and the errors clients saw.
//
//	benchpeers cluster --fencekv-bin bin/fencekv --etcd-bin etcd --out cluster.md --json cluster.json

type clusterOptions struct {
	fencekvBin, etcdBin string
	etcdVersion         string
	dir                 string
	duration, warmup    time.Duration
	rounds              int
	clients             []int
	workloads           []bench.Workload
	kills               int
	loadClients         int
}

// failoverResult is one system's failover measurements.
type failoverResult struct {
	System  string          `json:"system"`
	Clients int             `json:"clients"`
	Kills   []failoverKill  `json:"kills"`
	Error   string          `json:"error,omitempty"`
	Median  time.Duration   `json:"median_ns"`
	Max     time.Duration   `json:"max_ns"`
	Errors  []int           `json:"errors_per_failover"`  // failed requests
	Redials []int           `json:"redials_per_failover"` // failed reconnects
	Timings []time.Duration `json:"-"`
}

// failoverKill is one kill of the leader.
type failoverKill struct {
	Leader   string        `json:"leader"`
	Recovery time.Duration `json:"recovery_ns"` // kill to the first write acknowledged after it
	Errors   int           `json:"errors"`      // requests that failed, from the kill to the next steady state
	Redials  int           `json:"redials"`     // reconnects that failed (to the dead node), in the same time
}

// loadCluster reads a cluster report written with --json.
func loadCluster(name string) (*clusterReport, error) {
	rep := &clusterReport{}
	if err := readJSON(name, rep); err != nil {
		return nil, err
	}
	rep.loaded()
	return rep, nil
}

type clusterReport struct {
	report
	Failover []failoverResult `json:"failover"`

	// single is the single-node report of the same run (--single), for
	// the goals against one node; nil without it.
	single *report
}

func clusterMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchpeers cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o clusterOptions
	clients := fs.String("clients", "1,16,64", "client counts, comma-separated (contended skips 1)")
	workloads := fs.String("workloads", "fenced-put,lock-cycle,contended,get", "workloads, comma-separated (none: only the failover measurement)")
	out := fs.String("out", "", "write the markdown section to this file (default stdout)")
	jsonOut := fs.String("json", "", "also write every result as JSON to this file")
	from := fs.String("from", "", "run nothing: write the section of the results in this JSON file (from --json)")
	single := fs.String("single", "", "the single-node results of the same run (benchpeers --json), for the goals against one node")
	fs.StringVar(&o.fencekvBin, "fencekv-bin", "", "the fencekv `BINARY`; empty skips fencekv")
	fs.StringVar(&o.etcdBin, "etcd-bin", "", "the etcd `BINARY`; empty skips etcd")
	fs.StringVar(&o.etcdVersion, "etcd-version", "", "etcd's version, for the report")
	fs.StringVar(&o.dir, "data-dir", os.TempDir(), "where the nodes keep their data (a new dir per cluster under it)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time of each run")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "warm-up before each run")
	fs.IntVar(&o.rounds, "rounds", 1, "run the matrix this many times and report medians")
	fs.IntVar(&o.kills, "kills", 5, "leader kills per system for the failover measurement (0: none)")
	fs.IntVar(&o.loadClients, "failover-clients", 16, "write clients during the failover measurement")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if o.clients, err = parseInts(*clients); err != nil {
		fmt.Fprintf(stderr, "benchpeers cluster: --clients: %v\n", err)
		return 2
	}
	if *workloads != "none" { // none: the failover measurement only
		if o.workloads, err = parseWorkloads(*workloads); err != nil {
			fmt.Fprintf(stderr, "benchpeers cluster: --workloads: %v\n", err)
			return 2
		}
	}
	if o.fencekvBin == "" && o.etcdBin == "" && *from == "" {
		fmt.Fprintln(stderr, "benchpeers cluster: give --fencekv-bin, --etcd-bin or both (or --from)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var rep *clusterReport
	if *from != "" {
		rep, err = loadCluster(*from)
	} else {
		rep, err = measureClusters(ctx, o, stderr)
	}
	if err == nil && *single != "" {
		rep.single, err = load(*single)
	}
	if err != nil {
		fmt.Fprintf(stderr, "benchpeers cluster: %v\n", err)
		return 1
	}
	markdown := func(w io.Writer) error {
		_, err := io.WriteString(w, rep.clusterMarkdown())
		return err
	}
	if err := writeReport(stdout, *out, *jsonOut, markdown, rep); err != nil {
		fmt.Fprintf(stderr, "benchpeers cluster: %v\n", err)
		return 1
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "benchpeers cluster: interrupted; the report is partial")
		return 1
	}
	return 0
}

// node is one process of a cluster under test, restartable.
type node struct {
	name   string
	client string // fencekv: host:port; etcd: URL
	args   []string
	bin    string
	log    string

	cmd  *exec.Cmd
	done chan struct{}
}

func (n *node) start() error {
	f, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(n.bin, n.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		f.Close()
		close(done)
	}()
	n.cmd, n.done = cmd, done
	return nil
}

// kill sends SIGKILL to the node's process and waits for it to exit.
func (n *node) kill() {
	if n.cmd == nil {
		return
	}
	n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
	n.cmd = nil
}

// stop sends SIGTERM, then SIGKILL after 10 s.
func (n *node) stop() {
	if n.cmd == nil {
		return
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		n.cmd.Process.Signal(syscall.SIGKILL)
		<-n.done
	}
	n.cmd = nil
}

// testCluster is three nodes of one system.
type testCluster struct {
	system string
	nodes  []*node
	dial   bench.Dialer
	// leader returns the index of the node that leads, or an error.
	leader func(ctx context.Context) (int, error)
	// ready reports whether every node is up and follows one leader.
	ready func(ctx context.Context) error
}

func (c *testCluster) addrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.client)
	}
	return out
}

func (c *testCluster) stop() {
	for _, n := range c.nodes {
		n.stop()
	}
}

// freePorts returns n free loopback TCP ports (and UDP, for gossip).
func freePorts(n int) ([]int, error) {
	var out []int
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		closers = append(closers, l)
		u, err := net.ListenPacket("udp", l.Addr().String())
		if err != nil {
			continue
		}
		closers = append(closers, u)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

func startFencekvCluster(ctx context.Context, bin, dir string) (*testCluster, error) {
	ports, err := freePorts(9)
	if err != nil {
		return nil, err
	}
	addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
	c := &testCluster{system: "fencekv"}
	for i := range 3 {
		name := fmt.Sprintf("n%d", i)
		var join []string
		for j := range 3 {
			if j != i {
				join = append(join, addr(ports[3*j+2]))
			}
		}
		c.nodes = append(c.nodes, &node{name: name, client: addr(ports[3*i]), bin: bin, log: filepath.Join(dir, name+".log"),
			args: []string{"serve", "--node", name, "--data", filepath.Join(dir, name), "--listen", addr(ports[3*i]),
				"--raft", addr(ports[3*i+1]), "--gossip", addr(ports[3*i+2]), "--bootstrap-expect", "3",
				"--join", strings.Join(join, ","), "--http", "", "--log-level", "warn"}})
	}
	c.dial = bench.DialFencekv(strings.Join(c.addrs(), ","))
	status := func(ctx context.Context, i int) (fencekv.Status, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		cl, err := wire.Dial(ctx, c.nodes[i].client)
		if err != nil {
			return fencekv.Status{}, err
		}
		defer cl.Close()
		return cl.Status(ctx)
	}
	c.leader = func(ctx context.Context) (int, error) {
		for i := range c.nodes {
			if st, err := status(ctx, i); err == nil && st.Role == "leader" {
				return i, nil
			}
		}
		return 0, errors.New("no fencekv node leads")
	}
	c.ready = func(ctx context.Context) error {
		var leader string
		for i := range c.nodes {
			st, err := status(ctx, i)
			if err != nil {
				return err
			}
			if st.Leader == "" || leader != "" && st.Leader != leader || st.AppliedIndex+100 < st.CommitIndex {
				return fmt.Errorf("%s: leader %q, applied %d of %d", c.nodes[i].name, st.Leader, st.AppliedIndex, st.CommitIndex)
			}
			leader = st.Leader
		}
		return nil
	}
	return c, c.startAll(ctx)
}

func startEtcdCluster(ctx context.Context, bin, dir string) (*testCluster, error) {
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	url := func(p int) string { return "http://127.0.0.1:" + strconv.Itoa(p) }
	var initial []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("e%d=%s", i, url(ports[2*i+1])))
	}
	c := &testCluster{system: "etcd"}
	for i := range 3 {
		name := fmt.Sprintf("e%d", i)
		c.nodes = append(c.nodes, &node{name: name, client: url(ports[2*i]), bin: bin, log: filepath.Join(dir, name+".log"),
			args: []string{"--name", name, "--data-dir", filepath.Join(dir, name),
				"--listen-client-urls", url(ports[2*i]), "--advertise-client-urls", url(ports[2*i]),
				"--listen-peer-urls", url(ports[2*i+1]), "--initial-advertise-peer-urls", url(ports[2*i+1]),
				"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
				"--initial-cluster-token", "benchpeers", "--log-level", "warn"}})
	}
	c.dial = peers.DialEtcd(c.addrs())
	status := func(ctx context.Context, i int) (*clientv3.StatusResponse, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{c.nodes[i].client}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		return cl.Status(ctx, c.nodes[i].client)
	}
	c.leader = func(ctx context.Context) (int, error) {
		for i := range c.nodes {
			if st, err := status(ctx, i); err == nil && st.Leader == st.Header.MemberId {
				return i, nil
			}
		}
		return 0, errors.New("no etcd member leads")
	}
	c.ready = func(ctx context.Context) error {
		var leader uint64
		for i := range c.nodes {
			st, err := status(ctx, i)
			if err != nil {
				return err
			}
			if st.Leader == 0 || leader != 0 && st.Leader != leader || st.RaftAppliedIndex+100 < st.RaftIndex {
				return fmt.Errorf("%s: leader %x, applied %d of %d", c.nodes[i].name, st.Leader, st.RaftAppliedIndex, st.RaftIndex)
			}
			leader = st.Leader
		}
		return nil
	}
	return c, c.startAll(ctx)
}

// startAll starts every node and waits until the cluster is ready and a
// write through every node is acknowledged.
func (c *testCluster) startAll(ctx context.Context) error {
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			c.stop()
			return err
		}
	}
	if err := c.awaitReady(ctx, time.Minute); err != nil {
		c.stop()
		return err
	}
	return nil
}

// awaitReady waits until every node follows one leader and takes writes.
func (c *testCluster) awaitReady(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if err = c.ready(ctx); err == nil {
			err = c.writeThroughAll(ctx)
		}
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s cluster not ready within %v: %w", c.system, within, err)
}

func (c *testCluster) writeThroughAll(ctx context.Context) error {
	for range c.nodes {
		d, err := c.dial(ctx) // the dialer goes round the nodes
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = d.Put(wctx, "benchpeers/ready", []byte("1"), 0)
		cancel()
		d.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func measureClusters(ctx context.Context, o clusterOptions, log io.Writer) (*clusterReport, error) {
	rep := &clusterReport{report: report{
		Date:     time.Now().UTC(),
		CPU:      cpuModel(),
		Cores:    numCPU(),
		Kernel:   strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")),
		Go:       goVersion(),
		Duration: o.duration,
		Warmup:   o.warmup,
		Rounds:   o.rounds,
		Config:   bench.DefaultConfig(),
	}}
	rep.ValueSize, rep.Keys, rep.GetPercent = rep.Config.ValueSize, rep.Config.Keys, rep.Config.GetPercent
	rep.LoadStart = loadavg()
	defer func() { rep.LoadEnd = loadavg() }()

	var clusters []*testCluster
	defer func() {
		for _, c := range clusters {
			c.stop()
		}
	}()
	if o.fencekvBin != "" {
		dir, err := os.MkdirTemp(o.dir, "fencekv-cluster-")
		if err != nil {
			return nil, err
		}
		c, err := startFencekvCluster(ctx, o.fencekvBin, dir)
		if err != nil {
			return nil, err
		}
		clusters = append(clusters, c)
		rep.Systems = append(rep.Systems, system{Name: "fencekv", Version: fencekv.Version,
			Setup: "3 nodes (`fencekv serve --node`), defaults: raft with its log on fencekv's write-ahead log, one fdatasync per raft batch", dial: c.dial})
	}
	if o.etcdBin != "" {
		dir, err := os.MkdirTemp(o.dir, "etcd-cluster-")
		if err != nil {
			return nil, err
		}
		c, err := startEtcdCluster(ctx, o.etcdBin, dir)
		if err != nil {
			return nil, err
		}
		clusters = append(clusters, c)
		rep.Systems = append(rep.Systems, system{Name: "etcd", Version: o.etcdVersion,
			Setup: "3 members, defaults (WAL fsync per raft batch; heartbeat 100 ms, election timeout 1 s)", dial: c.dial})
	}
	fmt.Fprintf(log, "clusters up: %v\n", func() []string {
		var s []string
		for _, c := range clusters {
			s = append(s, c.system+" "+strings.Join(c.addrs(), ","))
		}
		return s
	}())

	total := 0
	for _, wl := range o.workloads {
		total += len(clientCounts(wl, o.clients)) * len(rep.Systems) * o.rounds
	}
	n := 0
	for round := 1; round <= o.rounds; round++ {
		order := slices.Concat(rep.Systems[(round-1)%len(rep.Systems):], rep.Systems[:(round-1)%len(rep.Systems)])
		for _, wl := range o.workloads {
			for _, cl := range clientCounts(wl, o.clients) {
				for _, s := range order {
					if ctx.Err() != nil {
						return rep, nil
					}
					settle(ctx)
					n++
					cfg := rep.Config
					cfg.Workload, cfg.Clients, cfg.Duration, cfg.Warmup = wl, cl, o.duration, o.warmup
					cfg.Prefix = fmt.Sprintf("bench/r%d/", round)
					res, err := bench.Run(ctx, s.dial, cfg)
					rr := runResult{Round: round, System: s.Name, Result: res}
					if err != nil {
						rr.Error = err.Error()
					}
					rep.Runs = append(rep.Runs, rr)
					fmt.Fprintf(log, "[%2d/%d] 3 nodes %-10s %2d clients %-7s %9.0f ops/s  p50 %s  p99 %s  errors %d%s\n",
						n, total, wl, cl, s.Name, res.OpsPerSec, ms(res.Latency.P50), ms(res.Latency.P99), res.Errors, errNote(rr.Error))
				}
			}
		}
	}
	for _, c := range clusters {
		if o.kills == 0 || ctx.Err() != nil {
			break
		}
		settle(ctx)
		fr := measureFailover(ctx, c, o.kills, o.loadClients, log)
		rep.Failover = append(rep.Failover, fr)
	}
	return rep, nil
}

// measureFailover runs write load (fenced puts, each client its own key,
// spread over the nodes) and kills the leader kills times: each time it
// measures the time from the kill to the first write acknowledged after
// it, and the errors the clients saw until the cluster was whole again
// (the node restarted and caught up).
func measureFailover(ctx context.Context, c *testCluster, kills, clients int, log io.Writer) failoverResult {
	fr := failoverResult{System: c.system, Clients: clients}
	var (
		mu      sync.Mutex
		lastAck time.Time // the latest acknowledgement
		acks    []time.Time
		errs    int // failed requests
		redials int // failed reconnects
	)
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			key := fmt.Sprintf("failover/%d", i)
			value := make([]byte, 128)
			var d bench.Driver
			for lctx.Err() == nil {
				if d == nil {
					var err error
					dctx, cancel := context.WithTimeout(lctx, 2*time.Second)
					d, err = c.dial(dctx)
					cancel()
					if err != nil {
						d = nil
						mu.Lock()
						redials++
						mu.Unlock()
						time.Sleep(50 * time.Millisecond) // the node is down: next
						continue
					}
				}
				wctx, cancel := context.WithTimeout(lctx, 10*time.Second)
				err := d.Put(wctx, key, value, 1)
				cancel()
				now := time.Now()
				mu.Lock()
				if err == nil {
					acks = append(acks, now)
					lastAck = now
				} else if lctx.Err() == nil {
					errs++
				}
				mu.Unlock()
				if err != nil {
					// Whatever failed, a user would reconnect: to the next
					// node (the dialer goes round them).
					d.Close()
					d = nil
				}
			}
			if d != nil {
				d.Close()
			}
		})
	}
	defer func() {
		stop()
		wg.Wait()
	}()
	fail := func(err error) failoverResult {
		fr.Error = err.Error()
		fmt.Fprintf(log, "failover %s: %v\n", c.system, err)
		return fr
	}
	for k := range kills {
		// Steady load first.
		if err := c.awaitReady(ctx, time.Minute); err != nil {
			return fail(err)
		}
		time.Sleep(2 * time.Second) // load on a whole cluster before the kill
		li, err := c.leader(ctx)
		if err != nil {
			return fail(err)
		}
		leader := c.nodes[li]
		mu.Lock()
		nerrs, nredials := errs, redials
		mu.Unlock()
		killed := time.Now()
		leader.kill()
		// The first acknowledgement after the kill. One that arrives
		// within a few milliseconds may have been committed by the old
		// leader just before it died; recovery takes hundreds.
		const margin = 20 * time.Millisecond
		var recovered time.Time
		deadline := time.Now().Add(time.Minute)
		for recovered.IsZero() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // poll the clients' acknowledgements
			mu.Lock()
			if lastAck.After(killed.Add(margin)) {
				for _, a := range acks {
					if a.After(killed.Add(margin)) {
						recovered = a
						break
					}
				}
			}
			mu.Unlock()
		}
		if recovered.IsZero() {
			return fail(fmt.Errorf("no write acknowledged within a minute of killing %s", leader.name))
		}
		if err := leader.start(); err != nil {
			return fail(err)
		}
		if err := c.awaitReady(ctx, time.Minute); err != nil {
			return fail(err)
		}
		mu.Lock()
		kr := failoverKill{Leader: leader.name, Recovery: recovered.Sub(killed), Errors: errs - nerrs, Redials: redials - nredials}
		acks = acks[:0]
		mu.Unlock()
		fr.Kills = append(fr.Kills, kr)
		fmt.Fprintf(log, "failover %s #%d: killed leader %s; first write acknowledged %s later; %d requests failed, %d reconnects failed\n",
			c.system, k+1, leader.name, ms(kr.Recovery), kr.Errors, kr.Redials)
	}
	var ds []time.Duration
	for _, k := range fr.Kills {
		ds = append(ds, k.Recovery)
		fr.Errors = append(fr.Errors, k.Errors)
		fr.Redials = append(fr.Redials, k.Redials)
	}
	slices.Sort(ds)
	if len(ds) > 0 {
		fr.Median, fr.Max = ds[(len(ds)-1)/2], ds[len(ds)-1]
		if len(ds)%2 == 0 {
			fr.Median = (ds[len(ds)/2-1] + ds[len(ds)/2]) / 2
		}
	}
	return fr
}

func numCPU() int       { return runtime.NumCPU() }
func goVersion() string { return runtime.Version() }

// clusterMarkdown renders the 3-node comparison as a section of
// bench/RESULTS.md.
func (r *clusterReport) clusterMarkdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# A 3-node fencekv cluster against a 3-member etcd cluster\n\n")
	how := "make bench-peers"
	if r.Rounds > 1 {
		how = fmt.Sprintf("ROUNDS=%d make bench-peers", r.Rounds)
	}
	p("Generated by `%s` (`benchpeers cluster`, bench/peers/cmd/benchpeers/cluster.go); rerun it rather than editing the tables by hand. With more than one round, each cell is the run with the median throughput and each ratio the median of the per-round ratios.\n\n", how)
	p("## Setup\n\n")
	p("- Date: %s; %s, %d cores; %s\n", r.Date.Format("2006-01-02 15:04 MST"), r.CPU, r.Cores, r.Go)
	for _, s := range r.Systems {
		v := s.Version
		if v == "" {
			v = "version unknown"
		}
		p("- %s %s: %s\n", s.Name, v, s.Setup)
	}
	p("- All nodes on 127.0.0.1 of this one machine, data in temp dirs on one disk, with the load generator: three replicas fsync on one disk and share two cores, so absolute numbers are far below what three machines give; compare the ratios (load average %s at the start, %s at the end).\n", r.LoadStart, r.LoadEnd)
	p("- Clients are spread over all three nodes (client i talks to node i mod 3, one connection each), so two thirds of the requests reach a follower and are forwarded to the leader, on both systems. Workloads as above; gets are linearizable on both (etcd's default; fencekv's quorum round).\n")
	p("- Each run: %v warm-up, then %v measured.\n\n", r.Warmup, r.Duration)

	p("## Throughput and latency (3 nodes)\n\n")
	var peers []string
	if r.has("etcd") && r.has("fencekv") {
		peers = []string{"etcd"}
	}
	r.throughputTable(p, []int{1, 2, 4, 8, 16, 32, 64, 128, 256}, peers)

	p("## Failover\n\n")
	p("Under write load (%s clients spread over the nodes, each putting to its own key with a token, reconnecting to the next node after any error), the leader is killed with SIGKILL; the time is from the kill to the first write any client has acknowledged after it (ignoring acknowledgements within 20 ms of the kill, which the old leader may have committed); client-visible errors are the requests that failed from the kill until the killed node was back and the cluster whole again (the clients on the dead node's connections, and any request the cluster answered with an error); failed reconnects (a client trying the dead node again before moving on) are counted apart. Then the next kill.\n\n", failoverClients(r.Failover))
	p("| system | kills | kill → first acknowledged write, median | max | each | failed requests per failover | failed reconnects |\n| --- | ---: | ---: | ---: | --- | --- | --- |\n")
	for _, f := range r.Failover {
		var each, errs, redials []string
		for _, k := range f.Kills {
			each = append(each, ms(k.Recovery))
			errs = append(errs, strconv.Itoa(k.Errors))
			redials = append(redials, strconv.Itoa(k.Redials))
		}
		note := ""
		if f.Error != "" {
			note = " (stopped: " + f.Error + ")"
		}
		p("| %s | %d%s | %s | %s | %s | %s | %s |\n", f.System, len(f.Kills), note, ms(f.Median), ms(f.Max), strings.Join(each, ", "), strings.Join(errs, ", "), strings.Join(redials, ", "))
	}
	p("\n")

	p("## Goals (3 nodes)\n\n")
	p("From the cluster issue; ratios of runs back to back in this one run. What limits fencekv's cluster, from profiles: bench/README.md.\n\n")
	p("| goal | measured | verdict |\n| --- | --- | --- |\n")
	for _, g := range r.clusterGoals() {
		p("| %s | %s | %s |\n", g.goal, g.measured, g.verdict)
	}
	p("\n")
	return b.String()
}

func failoverClients(fs []failoverResult) string {
	if len(fs) == 0 {
		return "no"
	}
	return strconv.Itoa(fs[0].Clients)
}

func (r *clusterReport) clusterGoals() []goal {
	var gs []goal
	ratioGoal := func(wl bench.Workload, target float64) {
		name := fmt.Sprintf("%s at 64 clients ≥ %s etcd's 3-node cluster", wl, times(target))
		x := r.ratio("etcd", wl, 64)
		f, okf := r.find("fencekv", wl, 64)
		e, oke := r.find("etcd", wl, 64)
		if x == 0 || !okf || !oke {
			gs = append(gs, goal{name, "not run or a run failed", "not checked"})
			return
		}
		gs = append(gs, goal{name, fmt.Sprintf("%s (%.0f vs %.0f ops/s)", times(x), f.Result.OpsPerSec, e.Result.OpsPerSec), verdict(x, target)})
	}
	ratioGoal(bench.FencedPut, 5)
	ratioGoal(bench.LockCycle, 5)
	ratioGoal(bench.Contended, 5)
	ratioGoal(bench.Get, 5)
	gs = append(gs, r.singleGoals()...)
	var f, e *failoverResult
	for i := range r.Failover {
		switch r.Failover[i].System {
		case "fencekv":
			f = &r.Failover[i]
		case "etcd":
			e = &r.Failover[i]
		}
	}
	name := "failover (kill -9 of the leader → first acknowledged write, median) no slower than etcd's"
	switch {
	case f == nil || e == nil || len(f.Kills) == 0 || len(e.Kills) == 0:
		gs = append(gs, goal{name, "not run", "not checked"})
	default:
		v := "met"
		if f.Median > e.Median {
			v = fmt.Sprintf("**missed**: %s slower (%.0f%%)", ms(f.Median-e.Median), 100*(float64(f.Median)/float64(e.Median)-1))
		}
		gs = append(gs, goal{name, fmt.Sprintf("fencekv %s (max %s), etcd %s (max %s)", ms(f.Median), ms(f.Max), ms(e.Median), ms(e.Max)), v})
	}
	return gs
}

// singleGoals judges the cluster against a single fencekv node of the
// same run: throughput at 64 clients at least half of the node's, and a
// 1-client fenced put's p50 at most twice the node's and within 1.5x of
// the floor of a round (a synced echo to another process, plus the
// forward hop, taken as a fencekv ping: the baselines of the single-node
// run).
func (r *clusterReport) singleGoals() []goal {
	var gs []goal
	// both finds fencekv's run of wl at clients in the cluster and on the
	// single node.
	both := func(wl bench.Workload, clients int) (c, one runResult, ok bool) {
		c, ok = r.find("fencekv", wl, clients)
		if !ok || r.single == nil {
			return c, one, false
		}
		one, ok = r.single.find("fencekv", wl, clients)
		return c, one, ok
	}
	half := func(wl bench.Workload) {
		name := fmt.Sprintf("%s at 64 clients ≥ half a single node's", wl)
		c, one, ok := both(wl, 64)
		if !ok {
			gs = append(gs, goal{name, "no single-node run to compare (--single)", "not checked"})
			return
		}
		x := c.Result.OpsPerSec / one.Result.OpsPerSec
		gs = append(gs, goal{name, fmt.Sprintf("%.0f%% (%.0f vs %.0f ops/s)", 100*x, c.Result.OpsPerSec, one.Result.OpsPerSec), verdict(x, 0.5)})
	}
	half(bench.FencedPut)
	half(bench.LockCycle)

	const twice = "fenced-put at 1 client: p50 ≤ 2× a single node's"
	const floorName = "fenced-put at 1 client: p50 ≤ 1.5× the floor (synced echo + forward hop)"
	c, one, ok := both(bench.FencedPut, 1)
	if !ok {
		gs = append(gs, goal{twice, "no single-node run to compare (--single)", "not checked"})
	} else {
		got, base := c.Result.Latency.P50, one.Result.Latency.P50
		gs = append(gs, goal{twice, fmt.Sprintf("%s (%s vs %s)", times(float64(got)/float64(base)), ms(got), ms(base)), atMost(float64(got)/float64(base), 2)})
	}
	if _, okc := r.find("fencekv", bench.FencedPut, 1); !okc || r.single == nil || r.single.Baselines.SyncedEcho.Count == 0 || r.single.Baselines.FencekvPing.Count == 0 {
		gs = append(gs, goal{floorName, "no single-node baselines (--single)", "not checked"})
	} else {
		bl := r.single
		got, floor := c.Result.Latency.P50, bl.Baselines.SyncedEcho.P50+bl.Baselines.FencekvPing.P50
		gs = append(gs, goal{floorName, fmt.Sprintf("%s (%s vs %s: echo %s + ping %s)", times(float64(got)/float64(floor)), ms(got), ms(floor),
			ms(bl.Baselines.SyncedEcho.P50), ms(bl.Baselines.FencekvPing.P50)), atMost(float64(got)/float64(floor), 1.5)})
	}
	return gs
}

// atMost is the verdict on a ratio x that should be at most limit.
func atMost(x, limit float64) string {
	if x <= limit {
		return "met"
	}
	return fmt.Sprintf("**missed**: %s, over %s", times(x), times(limit))
}
