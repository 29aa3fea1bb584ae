// Command benchpeers runs every bench workload against fencekv, etcd and
// Redis side by side and writes a markdown report of ops/s, latency and the
// ratio fencekv/peer, with the goals of the "Speed" issue checked.
//
// It expects the servers to be running already; bench/peers/run.sh (make
// bench-peers) starts them on free loopback ports and temp dirs.
//
//	benchpeers --fencekv 127.0.0.1:7420 --etcd http://127.0.0.1:2379 --redis 127.0.0.1:6379 --out RESULTS.md
//	benchpeers ports N    # prints N free loopback TCP ports, for scripts
package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/bench"
	"github.com/fencekv/fencekv/bench/peers"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "ports" {
		return ports(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "cluster" {
		return clusterMain(args[1:], stdout, stderr)
	}
	if len(args) == 2 && args[0] == "synced-echo" {
		return syncedEcho(args[1], stdout, stderr)
	}
	fs := flag.NewFlagSet("benchpeers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o         options
		clients   = fs.String("clients", "1,16,64", "client counts, comma-separated (contended skips 1)")
		workloads = fs.String("workloads", "all", "workloads, comma-separated")
		out       = fs.String("out", "", "write the markdown report to this file (default stdout)")
		jsonOut   = fs.String("json", "", "also write every result as JSON to this file")
		from      = fs.String("from", "", "run nothing: write the report of the results in this JSON file (from --json)")
	)
	fs.StringVar(&o.fencekv, "fencekv", "", "fencekv server `ADDRESS` (host:port); empty skips fencekv")
	fs.StringVar(&o.etcd, "etcd", "", "etcd client `URLS`, comma-separated; empty skips etcd")
	fs.StringVar(&o.redis, "redis", "", "Redis server `ADDRESS` (host:port); empty skips Redis")
	fs.IntVar(&o.fencekvPID, "fencekv-pid", 0, "the fencekv server's `PID`, to measure its CPU time per request (0: not measured)")
	fs.IntVar(&o.etcdPID, "etcd-pid", 0, "the etcd server's `PID`, to measure its CPU time per request")
	fs.IntVar(&o.redisPID, "redis-pid", 0, "the Redis server's `PID`, to measure its CPU time per request")
	fs.StringVar(&o.etcdVersion, "etcd-version", "", "etcd's version, for the report")
	fs.StringVar(&o.redisVersion, "redis-version", "", "Redis's version, for the report")
	fs.StringVar(&o.dataDir, "data-dir", os.TempDir(), "measure fsync latency on this dir's disk (where the servers keep their data)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time of each run")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "warm-up before each run")
	fs.IntVar(&o.rounds, "rounds", 1, "run the whole matrix this many times and report medians (the machine is noisy)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if o.rounds < 1 {
		fmt.Fprintln(stderr, "benchpeers: --rounds: want at least 1")
		return 2
	}
	if o.clients, err = parseInts(*clients); err != nil {
		fmt.Fprintf(stderr, "benchpeers: --clients: %v\n", err)
		return 2
	}
	if o.workloads, err = parseWorkloads(*workloads); err != nil {
		fmt.Fprintf(stderr, "benchpeers: --workloads: %v\n", err)
		return 2
	}
	o.systems = systems(o)
	if len(o.systems) == 0 && *from == "" {
		fmt.Fprintln(stderr, "benchpeers: give at least one of --fencekv, --etcd, --redis (or --from)")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var rep *report
	if *from != "" {
		rep, err = load(*from)
	} else {
		rep, err = measure(ctx, o, stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "benchpeers: %v\n", err)
		return 1
	}
	if err := writeReport(stdout, *out, *jsonOut, rep.markdown, rep); err != nil {
		fmt.Fprintf(stderr, "benchpeers: %v\n", err)
		return 1
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "benchpeers: interrupted; the report is partial")
		return 1
	}
	return 0
}

type options struct {
	fencekv, etcd, redis      string
	fencekvPID, etcdPID       int
	redisPID                  int
	etcdVersion, redisVersion string
	dataDir                   string
	duration, warmup          time.Duration
	rounds                    int
	clients                   []int
	workloads                 []bench.Workload
	systems                   []system
}

// system is one store under test.
type system struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Setup   string `json:"setup"`
	dial    bench.Dialer
	pid     int // of the server process, if known: its CPU time is measured
}

func systems(o options) []system {
	var s []system
	if o.fencekv != "" {
		s = append(s, system{Name: "fencekv", Version: fencekv.Version,
			Setup: "`fencekv serve` defaults: group commit, fsync on every commit", dial: bench.DialFencekv(o.fencekv), pid: o.fencekvPID})
	}
	if o.etcd != "" {
		s = append(s, system{Name: "etcd", Version: o.etcdVersion,
			Setup: "one member, defaults (WAL fsync per raft batch)", dial: peers.DialEtcd(strings.Split(o.etcd, ",")), pid: o.etcdPID})
	}
	if o.redis != "" {
		s = append(s, system{Name: "redis", Version: o.redisVersion,
			Setup: "appendonly yes, appendfsync always, no RDB snapshots", dial: peers.DialRedis(o.redis), pid: o.redisPID})
	}
	return s
}

// report is everything measured, as the JSON file has it.
type report struct {
	Date      time.Time     `json:"date"`
	CPU       string        `json:"cpu"`
	Cores     int           `json:"cores"`
	Kernel    string        `json:"kernel"`
	Go        string        `json:"go"`
	Duration  time.Duration `json:"duration_ns"`
	Warmup    time.Duration `json:"warmup_ns"`
	Rounds    int           `json:"rounds"`
	LoadStart string        `json:"loadavg_start"` // /proc/loadavg: other work on the machine
	LoadEnd   string        `json:"loadavg_end"`
	Config    bench.Config  `json:"-"`
	// From Config, for JSON.
	ValueSize  int         `json:"value_size"`
	Keys       int         `json:"keys"`
	GetPercent int         `json:"get_percent"`
	Systems    []system    `json:"systems"`
	Baselines  baselines   `json:"baselines"`
	Runs       []runResult `json:"runs"`
}

type baselines struct {
	LoopbackRTT bench.Latency `json:"loopback_rtt"`
	FencekvPing bench.Latency `json:"fencekv_ping"`
	Fsync       bench.Latency `json:"fsync"`
	SyncedEcho  bench.Latency `json:"synced_echo"` // to another process that syncs before answering
}

type runResult struct {
	Round  int          `json:"round"`
	System string       `json:"system"`
	Result bench.Result `json:"result"`
	Error  string       `json:"error,omitempty"`
	// GroupCommit is fencekv's batching over the run, warm-up included.
	GroupCommit *bench.Commits `json:"group_commit,omitempty"`
	// ServerCPU is the server process's CPU time (user and system, all its
	// threads) over the measured window; 0 if it was not measured.
	ServerCPU time.Duration `json:"server_cpu_ns,omitempty"`
	// ClientCPU is this process's CPU time over the measured window: the
	// load generator driving the system through its client library; 0 if
	// it was not measured.
	ClientCPU time.Duration `json:"client_cpu_ns,omitempty"`
	// SyncedEcho is the synced-echo round trip measured just before the
	// run, for fencekv's 1-client fenced puts: the floor they are judged
	// against, taken at the same time (the disk's fsync latency drifts
	// over a long run).
	SyncedEcho *bench.Latency `json:"synced_echo,omitempty"`
}

// cpuPerOp is the server's CPU time per measured op, or 0 if unknown.
func (rr runResult) cpuPerOp() time.Duration { return perOp(rr.ServerCPU, rr) }

// clientCPUPerOp is the load generator's CPU time per measured op, or 0 if
// unknown.
func (rr runResult) clientCPUPerOp() time.Duration { return perOp(rr.ClientCPU, rr) }

func perOp(cpu time.Duration, rr runResult) time.Duration {
	if cpu <= 0 || rr.Result.Ops <= 0 {
		return 0
	}
	return cpu / time.Duration(rr.Result.Ops)
}

// measure takes the baselines, then runs every workload at every client
// count against each system in turn (systems interleaved, so that noise
// from other work on the machine falls on all of them alike).
func measure(ctx context.Context, o options, log io.Writer) (*report, error) {
	rep := &report{
		Date:     time.Now().UTC(),
		CPU:      cpuModel(),
		Cores:    runtime.NumCPU(),
		Kernel:   strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")),
		Go:       runtime.Version(),
		Duration: o.duration,
		Warmup:   o.warmup,
		Rounds:   o.rounds,
		Systems:  o.systems,
		Config:   bench.DefaultConfig(),
	}
	rep.ValueSize, rep.Keys, rep.GetPercent = rep.Config.ValueSize, rep.Config.Keys, rep.Config.GetPercent
	rep.LoadStart = loadavg()
	defer func() { rep.LoadEnd = loadavg() }()
	var err error
	if rep.Baselines.LoopbackRTT, err = bench.LoopbackRTT(2000); err != nil {
		return nil, fmt.Errorf("loopback RTT: %w", err)
	}
	if rep.Baselines.Fsync, err = bench.FsyncLatency(o.dataDir, 200); err != nil {
		return nil, fmt.Errorf("fsync latency: %w", err)
	}
	if o.fencekv != "" {
		if rep.Baselines.FencekvPing, err = bench.PingFencekv(ctx, o.fencekv, 2000); err != nil {
			return nil, fmt.Errorf("fencekv ping: %w", err)
		}
	}
	if rep.Baselines.SyncedEcho, err = measureSyncedEcho(o.dataDir, 2000); err != nil {
		return nil, fmt.Errorf("synced echo: %w", err)
	}
	fmt.Fprintf(log, "baselines: loopback RTT p50 %s, fencekv ping p50 %s, fsync p50 %s, synced echo p50 %s\n",
		ms(rep.Baselines.LoopbackRTT.P50), ms(rep.Baselines.FencekvPing.P50), ms(rep.Baselines.Fsync.P50), ms(rep.Baselines.SyncedEcho.P50))

	total := 0
	for _, wl := range o.workloads {
		total += len(clientCounts(wl, o.clients)) * len(o.systems) * o.rounds
	}
	n := 0
	for round := 1; round <= o.rounds; round++ {
		// Each round starts with another system, so that no system always
		// runs right after the same other one (and its background work).
		order := slices.Concat(o.systems[(round-1)%len(o.systems):], o.systems[:(round-1)%len(o.systems)])
		for _, wl := range o.workloads {
			for _, c := range clientCounts(wl, o.clients) {
				for _, s := range order {
					if ctx.Err() != nil {
						return rep, nil
					}
					if waited, quiet := settle(ctx); !quiet {
						fmt.Fprintf(log, "(the machine was still busy after %s; running anyway)\n", waited.Round(time.Millisecond))
					}
					n++
					cfg := rep.Config
					cfg.Workload, cfg.Clients, cfg.Duration, cfg.Warmup = wl, c, o.duration, o.warmup
					var serverCPU, clientCPU time.Duration
					cfg.OnMeasure = func() func() {
						ca, cerr := processCPU(os.Getpid())
						var sa time.Duration
						serr := errNoPID
						if s.pid > 0 {
							if sa, serr = processCPU(s.pid); serr != nil {
								fmt.Fprintf(log, "(server CPU of %s not measured: %v)\n", s.Name, serr)
							}
						}
						return func() {
							if b, err := processCPU(os.Getpid()); err == nil && cerr == nil {
								clientCPU = b - ca
							}
							if serr == nil {
								if b, err := processCPU(s.pid); err == nil {
									serverCPU = b - sa
								}
							}
						}
					}
					var count func(context.Context) (bench.Commits, error)
					if s.Name == "fencekv" {
						count, _ = bench.CountCommits(ctx, o.fencekv)
					}
					var floor *bench.Latency
					if s.Name == "fencekv" && wl == bench.FencedPut && c == 1 {
						if l, err := measureSyncedEcho(o.dataDir, 1000); err == nil {
							floor = &l
						} else {
							fmt.Fprintf(log, "(synced echo before the run not measured: %v)\n", err)
						}
					}
					res, err := bench.Run(ctx, s.dial, cfg)
					rr := runResult{Round: round, System: s.Name, Result: res, ServerCPU: serverCPU, ClientCPU: clientCPU, SyncedEcho: floor}
					if err != nil {
						rr.Error = err.Error()
					}
					if count != nil {
						if c, err := count(context.WithoutCancel(ctx)); err == nil {
							rr.GroupCommit = &c
						}
					}
					rep.Runs = append(rep.Runs, rr)
					fmt.Fprintf(log, "[%2d/%d] %-10s %2d clients %-7s %9.0f ops/s  p50 %s  p99 %s  cpu/op %s  errors %d%s\n",
						n, total, wl, c, s.Name, res.OpsPerSec, ms(res.Latency.P50), ms(res.Latency.P99), us(rr.cpuPerOp()), res.Errors, errNote(rr.Error))
				}
			}
		}
	}
	return rep, nil
}

// settle waits until the machine is quiet: less than settleBusy of its
// CPU time busy over a settleWindow, for at most settleMax. A server's
// background work after a run (Redis rewriting its append-only file in a
// forked child, etcd compacting) would otherwise land in the next
// system's run. Steal time (other tenants) does not count.
func settle(ctx context.Context) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < settleMax && ctx.Err() == nil {
		a, okA := cpuTimes()
		time.Sleep(settleWindow)
		b, okB := cpuTimes()
		if !okA || !okB {
			return 0, true // no /proc/stat: nothing to wait for
		}
		if busy, total := b.busy-a.busy, b.total-a.total; total > 0 && float64(busy) < settleBusy*float64(total) {
			return time.Since(start), true
		}
	}
	return time.Since(start), false
}

const (
	settleBusy   = 0.15
	settleWindow = 250 * time.Millisecond
	settleMax    = 20 * time.Second
)

type cpuSample struct{ busy, total uint64 }

// processCPU is the CPU time (user plus system, every thread) process pid
// has used, from /proc/PID/stat.
// errNoPID: the server's PID was not given, so its CPU is not measured.
var errNoPID = errors.New("no PID given")

func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in brackets, may hold spaces: fields count from
	// after its closing bracket, where field 3 (state) starts.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] { // utime and stime: fields 14 and 15
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every
// Linux architecture Go runs on.
const clockTicks = 100

// cpuTimes reads the machine's CPU time from /proc/stat: busy is user,
// nice, system, irq and softirq; total adds idle and iowait.
func cpuTimes() (cpuSample, bool) {
	line, _, _ := strings.Cut(readFile("/proc/stat"), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return cpuSample{}, false
	}
	var v [7]uint64
	for i := range v {
		x, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return cpuSample{}, false
		}
		v[i] = x
	}
	busy := v[0] + v[1] + v[2] + v[5] + v[6]
	return cpuSample{busy: busy, total: busy + v[3] + v[4]}, true
}

// load reads a report written with --json.
func load(name string) (*report, error) {
	rep := &report{}
	if err := readJSON(name, rep); err != nil {
		return nil, err
	}
	d := bench.DefaultConfig()
	if rep.ValueSize == 0 && rep.Keys == 0 { // written before these were kept
		rep.ValueSize, rep.Keys, rep.GetPercent = d.ValueSize, d.Keys, d.GetPercent
	}
	rep.loaded()
	return rep, nil
}

// writeReport writes a report's markdown to the file out (stdout if empty)
// and, if jsonOut is set, the report v as JSON to that file.
func writeReport(stdout io.Writer, out, jsonOut string, markdown func(io.Writer) error, v any) error {
	w := stdout
	if out != "" {
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if err := markdown(w); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	if jsonOut == "" {
		return nil
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	return os.WriteFile(jsonOut, append(b, '\n'), 0o644)
}

// readJSON decodes the JSON file name into v.
func readJSON(name string, v any) error {
	b, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// loaded restores what JSON does not keep.
func (r *report) loaded() {
	if r.Rounds == 0 {
		r.Rounds = 1
	}
	for i := range r.Runs {
		res := &r.Runs[i].Result
		res.Elapsed = time.Duration(res.Seconds * float64(time.Second))
	}
}

func errNote(s string) string {
	if s == "" {
		return ""
	}
	return "  FAILED: " + s
}

// clientCounts are the client counts a workload runs at: a contended lock
// needs at least two clients.
func clientCounts(wl bench.Workload, all []int) []int {
	if wl != bench.Contended {
		return all
	}
	var out []int
	for _, c := range all {
		if c > 1 {
			out = append(out, c)
		}
	}
	return out
}

// find returns the run of system on workload wl with that many clients
// whose throughput is the median over the rounds that succeeded; false if
// none did.
func (r *report) find(system string, wl bench.Workload, clients int) (runResult, bool) {
	var ok []runResult
	for _, rr := range r.Runs {
		if rr.System == system && rr.Result.Workload == wl && rr.Result.Clients == clients && succeeded(rr) {
			ok = append(ok, rr)
		}
	}
	if len(ok) == 0 {
		return runResult{}, false
	}
	slices.SortFunc(ok, func(a, b runResult) int { return cmp.Compare(a.Result.OpsPerSec, b.Result.OpsPerSec) })
	return ok[(len(ok)-1)/2], true
}

func succeeded(rr runResult) bool { return rr.Error == "" && rr.Result.Ops > 0 }

// ratios returns fencekv's throughput over peer's in each round where both
// succeeded (the two ran back to back, so noise from the machine is shared
// as much as it can be), sorted.
func (r *report) ratios(peer string, wl bench.Workload, clients int) []float64 {
	return r.ratiosOf(peer, wl, clients, func(rr runResult) float64 { return rr.Result.OpsPerSec })
}

// cpuRatios returns fencekv's server CPU time per op over peer's in each
// round where both were measured, sorted: below 1 is less CPU per request.
func (r *report) cpuRatios(peer string, wl bench.Workload, clients int) []float64 {
	return r.ratiosOf(peer, wl, clients, func(rr runResult) float64 { return float64(rr.cpuPerOp()) })
}

// ratiosOf returns metric(fencekv)/metric(peer) in each round where both
// runs succeeded and have the metric (above 0), sorted.
func (r *report) ratiosOf(peer string, wl bench.Workload, clients int, metric func(runResult) float64) []float64 {
	var xs []float64
	for round := 1; round <= r.Rounds; round++ {
		var f, p float64
		for _, rr := range r.Runs {
			if rr.Round != round || rr.Result.Workload != wl || rr.Result.Clients != clients || !succeeded(rr) {
				continue
			}
			switch rr.System {
			case "fencekv":
				f = metric(rr)
			case peer:
				p = metric(rr)
			}
		}
		if f > 0 && p > 0 {
			xs = append(xs, f/p)
		}
	}
	slices.Sort(xs)
	return xs
}

// medianCPU is the median of a system's server CPU per op over the rounds,
// or 0 if it was not measured.
func (r *report) medianCPU(system string, wl bench.Workload, clients int) time.Duration {
	return r.medianOf(system, wl, clients, runResult.cpuPerOp)
}

// medianOf is the median of f (a CPU time per op, 0 if not measured) over
// a system's successful runs of the cell, or 0 if none measured it.
func (r *report) medianOf(system string, wl bench.Workload, clients int, f func(runResult) time.Duration) time.Duration {
	var xs []float64
	for _, rr := range r.Runs {
		if rr.System == system && rr.Result.Workload == wl && rr.Result.Clients == clients && succeeded(rr) && f(rr) > 0 {
			xs = append(xs, float64(f(rr)))
		}
	}
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return time.Duration(median(xs))
}

// measuredCPU reports whether any run has the server's CPU time.
func (r *report) measuredCPU() bool {
	return slices.ContainsFunc(r.Runs, func(rr runResult) bool { return rr.ServerCPU > 0 })
}

// measuredClientCPU reports whether any run has the load generator's CPU
// time (reports from before it was measured have none).
func (r *report) measuredClientCPU() bool {
	return slices.ContainsFunc(r.Runs, func(rr runResult) bool { return rr.ClientCPU > 0 })
}

// clientCPUTable writes, for every system, the load generator's CPU time
// per request (its client library's cost, and the kernel's on its side of
// the sockets), and that plus the server's: what the two cores spend per
// request.
func (r *report) clientCPUTable(p func(string, ...any), clients []int) {
	var heads []string
	for _, s := range r.Systems {
		heads = append(heads, s.Name+" load gen.")
	}
	for _, s := range r.Systems {
		heads = append(heads, s.Name+" total")
	}
	total := func(rr runResult) time.Duration {
		if rr.cpuPerOp() == 0 || rr.clientCPUPerOp() == 0 {
			return 0
		}
		return rr.cpuPerOp() + rr.clientCPUPerOp()
	}
	r.table(p, clients, heads, func(wl bench.Workload, c int) (cells []string) {
		for _, s := range r.Systems {
			cells = append(cells, us(r.medianOf(s.Name, wl, c, runResult.clientCPUPerOp)))
		}
		for _, s := range r.Systems {
			cells = append(cells, us(r.medianOf(s.Name, wl, c, total)))
		}
		return cells
	})
}

// cpuTable writes the server CPU time per request of every system, and
// fencekv's over each peer's.
func (r *report) cpuTable(p func(string, ...any), clients []int, peers []string) {
	var heads []string
	for _, s := range r.Systems {
		heads = append(heads, s.Name)
	}
	for _, peer := range peers {
		heads = append(heads, "fencekv/"+peer)
	}
	r.table(p, clients, heads, func(wl bench.Workload, c int) (cells []string) {
		for _, s := range r.Systems {
			cells = append(cells, us(r.medianCPU(s.Name, wl, c)))
		}
		for _, peer := range peers {
			cells = append(cells, rangeText(r.cpuRatios(peer, wl, c)))
		}
		return cells
	})
}

// table writes a table with a row per workload and client count that ran:
// the columns named by heads, filled by row.
func (r *report) table(p func(string, ...any), clients []int, heads []string, row func(wl bench.Workload, clients int) []string) {
	p("| workload | clients |")
	align := "| --- | ---: |"
	for _, h := range heads {
		p(" %s |", h)
		align += " ---: |"
	}
	p("\n%s\n", align)
	for _, wl := range bench.Workloads {
		for _, c := range clients {
			if !r.ran(wl, c) {
				continue
			}
			p("| %s | %d |", wl, c)
			for _, cell := range row(wl, c) {
				p(" %s |", cell)
			}
			p("\n")
		}
	}
	p("\n")
}

func (r *report) has(system string) bool {
	for _, s := range r.Systems {
		if s.Name == system {
			return true
		}
	}
	return false
}

// ratio is the median of ratios, or 0 if there are none.
func (r *report) ratio(peer string, wl bench.Workload, clients int) float64 {
	xs := r.ratios(peer, wl, clients)
	if len(xs) == 0 {
		return 0
	}
	return median(xs)
}

func median(xs []float64) float64 {
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// ratioText is the median throughput ratio, with its range over the
// rounds when there were several.
func (r *report) ratioText(peer string, wl bench.Workload, clients int) string {
	return rangeText(r.ratios(peer, wl, clients))
}

// rangeText is the median of sorted ratios xs, with their range when there
// are several.
func rangeText(xs []float64) string {
	switch len(xs) {
	case 0:
		return "—"
	case 1:
		return times(xs[0])
	}
	return fmt.Sprintf("%s (%s–%s)", times(median(xs)), strconv.FormatFloat(xs[0], 'f', 2, 64), strconv.FormatFloat(xs[len(xs)-1], 'f', 2, 64))
}

func (r *report) markdown(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# fencekv against etcd and Redis\n\n")
	how := "make bench-peers"
	if r.Rounds > 1 {
		how = fmt.Sprintf("ROUNDS=%d make bench-peers", r.Rounds)
	}
	p("Generated by `%s` (bench/peers/run.sh, bench/peers/cmd/benchpeers); rerun it rather than editing the tables by hand.\n\n", how)
	p("## Machine and setup\n\n")
	p("- Date: %s\n", r.Date.Format("2006-01-02 15:04 MST"))
	p("- CPU: %s, %d cores (nproc); kernel %s; %s\n", r.CPU, r.Cores, r.Kernel, r.Go)
	for _, s := range r.Systems {
		v := s.Version
		if v == "" {
			v = "version unknown"
		}
		p("- %s %s: %s\n", s.Name, v, s.Setup)
	}
	p("- Each run: %v warm-up, then %v measured; %d-byte values; %d keys for get and mixed (%d%% gets); closed-loop clients, one connection each, one request in flight each.\n",
		r.Warmup, r.Duration, r.ValueSize, r.Keys, r.GetPercent)
	if r.Rounds > 1 {
		p("- The whole matrix ran %d times, systems back to back within each round, each round starting with the next system. Each cell shows the run with the median throughput over the rounds; each ratio is the median of the per-round ratios, with their range in brackets.\n", r.Rounds)
	}
	p("- Each run starts once the machine is quiet (under %d%% of its CPU busy over %v, waiting at most %v), so that a server's background work after its run (Redis rewriting its append-only file, etcd compacting) does not land in the next one.\n", int(settleBusy*100), settleWindow, settleMax)
	p("- Servers, their data (temp dirs on the same disk) and the load generator all share the machine's cores, and other work may have run beside them (load average %s at the start, %s at the end): compare the ratios, measured back to back, more than the absolute numbers.\n\n", r.LoadStart, r.LoadEnd)

	p("## Baselines\n\n")
	p("| what | p50 | p99 |\n| --- | ---: | ---: |\n")
	bl := r.Baselines
	p("| loopback TCP round trip (64 B echo, in process) | %s | %s |\n", ms(bl.LoopbackRTT.P50), ms(bl.LoopbackRTT.P99))
	if bl.FencekvPing.Count > 0 {
		p("| fencekv `ping` (raw RTT through the server) | %s | %s |\n", ms(bl.FencekvPing.P50), ms(bl.FencekvPing.P99))
	}
	p("| fsync after a 4 KiB overwrite (the data dirs' disk) | %s | %s |\n", ms(bl.Fsync.P50), ms(bl.Fsync.P99))
	if bl.SyncedEcho.Count > 0 {
		p("| round trip to another process that writes the message to a file and fsyncs before echoing it (%d B; no store) | %s | %s |\n", bench.SyncedEchoSize, ms(bl.SyncedEcho.P50), ms(bl.SyncedEcho.P99))
	}
	p("\n")

	p("## Throughput and latency\n\n")
	p("ops/s over all clients; p50/p99 of one op (for lock-cycle, acquire + put + release; for contended, the wait too). The last columns are fencekv's ops/s over the peer's.\n\n")
	r.throughputTable(p, []int{1, 16, 64, 2, 4, 8, 32, 128, 256}, r.peers())

	if r.measuredCPU() {
		p("## Server CPU per request\n\n")
		p("CPU time (user + system, all threads) of each server process over the measured window, divided by the ops measured in it: µs per op, median over the rounds. The load generator shares the machine's two cores with the servers, so this, more than ops/s, is what a server costs. The last columns are fencekv's CPU per op over the peer's (below 1× is cheaper), median of the per-round ratios.\n\n")
		r.cpuTable(p, []int{1, 16, 64, 2, 4, 8, 32, 128, 256}, r.peers())
	}
	if r.measuredClientCPU() {
		p("## Load generator CPU per request\n\n")
		p("CPU time (user + system) of the load generator (this tool, driving one system at a time through that system's client library: fencekv's wire.Client, go-redis, clientv3) over the same window, divided by the ops measured: µs per op, median over the rounds. It includes the kernel's work for the client's side of each socket: a loopback write runs the receiving side's TCP stack too. Total is server plus load generator, median of the per-round sums. Both share the machine's two cores, so when the cores are busy, throughput is bounded by the total, not by the server's share alone.\n\n")
		r.clientCPUTable(p, []int{1, 16, 64, 2, 4, 8, 32, 128, 256})
	}

	if r.has("fencekv") {
		p("fencekv's group commit: commands applied per transaction (so per fsync), over the whole run of the median cell, warm-up included; gets are not commands.\n\n")
		p("| workload | clients | commands per commit |\n| --- | ---: | ---: |\n")
		rows := 0
		for _, wl := range bench.Workloads {
			for _, c := range []int{1, 2, 4, 8, 16, 32, 64, 128, 256} {
				if rr, ok := r.find("fencekv", wl, c); ok && rr.GroupCommit != nil && rr.GroupCommit.Commits > 0 && wl != bench.Get {
					p("| %s | %d | %.1f |\n", wl, c, rr.GroupCommit.PerTx)
					rows++
				}
			}
		}
		if rows == 0 {
			p("| (not recorded) | | |\n")
		}
		p("\n")
	}

	p("## Contended lock\n\n")
	p("Every client queues for one lock; each grant is acquire, fenced put, release. Grants per client over the measured window, and Jain's fairness index over them (1 = perfectly even, 1/n = one client got all).\n\n")
	p("| clients | system | grants/s | grants per client (min..max) | fairness |\n| ---: | --- | ---: | ---: | ---: |\n")
	for _, c := range []int{2, 4, 8, 16, 32, 64, 128, 256} {
		for _, s := range r.Systems {
			rr, ok := r.find(s.Name, bench.Contended, c)
			if !ok {
				continue
			}
			p("| %d | %s | %.0f | %d..%d | %.4f |\n", c, s.Name, rr.Result.OpsPerSec, rr.Result.GrantsMin, rr.Result.GrantsMax, rr.Result.Fairness)
		}
	}
	p("\n")

	p("## Goals\n\n")
	p("From the speed issues (single node: ahead of Redis at no more server CPU per request; against etcd). A goal is checked only if its runs succeeded; throughput goals are judged on the median of the per-round ratios.\n\n")
	p("| goal | measured | verdict |\n| --- | --- | --- |\n")
	for _, g := range r.goals() {
		p("| %s | %s | %s |\n", g.goal, g.measured, g.verdict)
	}
	p("\n")

	p("## How each system is driven\n\n")
	p("- **fencekv**: the Go client (wire.Client). A fenced put is one `put` with `token`; a lock is `acquire` (with `wait_ms` for the contended lock: the server queues waiters first come, first served and hands the lock over in the transaction that frees it); `release` by token.\n")
	p("- **etcd**: clientv3 (one client, so one gRPC connection, per bench client) and one `concurrency.Session` per client. A lock is a `concurrency.Mutex` (waiters queue by key revision and watch their predecessor); its token is the revision the grant was made at (the lock key's create revision when uncontended). A fenced put is one Txn: if `fence/<key>` holds a higher token, refuse; else put the value and the token. Gets are linearizable (etcd's default).\n")
	p("- **Redis**: go-redis with one connection per client. A lock is a Lua script doing `SET lock holder NX PX ttl` then `INCR` of one token counter; release is a Lua compare-and-delete on the holder value; a fenced put is a Lua script checking the token against the fence kept beside the value (one hash, fields `v` and `f`) and writing both. Redis has no lock queue: a waiting acquire polls, backing off from 1 ms doubling to 16 ms with jitter. With `appendfsync always` Redis fsyncs its AOF once per event-loop pass before replying, so concurrent writes share an fsync, as fencekv's group commit does.\n")
	p("- Every store compares tokens the same way: a put is accepted if its token is at or above the key's fence.\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// peers are the systems other than fencekv that ran.
func (r *report) peers() []string {
	if !r.has("fencekv") {
		return nil
	}
	var out []string
	for _, s := range r.Systems {
		if s.Name != "fencekv" {
			out = append(out, s.Name)
		}
	}
	return out
}

func (r *report) ran(wl bench.Workload, clients int) bool {
	for _, rr := range r.Runs {
		if rr.Result.Workload == wl && rr.Result.Clients == clients {
			return true
		}
	}
	return false
}

type goal struct{ goal, measured, verdict string }

func (r *report) goals() []goal {
	var gs []goal
	ratioGoal := func(wl bench.Workload, clients int, peer string, target float64) {
		name := fmt.Sprintf("%s at %d clients ≥ %s %s", wl, clients, times(target), peerName(peer))
		if !r.has(peer) || !r.has("fencekv") {
			gs = append(gs, goal{name, "not run", "—"})
			return
		}
		if !r.ran(wl, clients) {
			gs = append(gs, goal{name, "not run", "—"})
			return
		}
		x := r.ratio(peer, wl, clients)
		if x == 0 {
			gs = append(gs, goal{name, "a run failed", "not checked"})
			return
		}
		f, _ := r.find("fencekv", wl, clients)
		p, _ := r.find(peer, wl, clients)
		m := fmt.Sprintf("%s (%.0f vs %.0f ops/s)", times(x), f.Result.OpsPerSec, p.Result.OpsPerSec)
		if xs := r.ratios(peer, wl, clients); len(xs) > 1 {
			each := make([]string, len(xs))
			for i, x := range xs {
				each[i] = times(x)
			}
			m = fmt.Sprintf("%s: median of the rounds' %s (median cells: %.0f vs %.0f ops/s)", times(x), strings.Join(each, ", "), f.Result.OpsPerSec, p.Result.OpsPerSec)
		}
		gs = append(gs, goal{name, m, verdict(x, target)})
	}
	// Single-node speed: ahead of Redis, at less server CPU per request.
	for _, wl := range []bench.Workload{bench.FencedPut, bench.LockCycle, bench.Get, bench.Mixed} {
		for _, c := range []int{16, 64} {
			ratioGoal(wl, c, "redis", 1.15)
		}
	}
	for _, c := range []int{16, 64} {
		ratioGoal(bench.Contended, c, "redis", 1.2)
		if f, ok := r.find("fencekv", bench.Contended, c); ok {
			v := "met"
			if f.Result.Fairness < 0.999 {
				v = fmt.Sprintf("**missed** by %.4f", 0.999-f.Result.Fairness)
			}
			gs = append(gs, goal{fmt.Sprintf("contended at %d clients: fairness 1.0 (≥ 0.999)", c), fmt.Sprintf("%.4f", f.Result.Fairness), v})
		}
	}
	if r.measuredCPU() {
		for _, wl := range []bench.Workload{bench.FencedPut, bench.LockCycle, bench.Get} {
			for _, c := range []int{16, 64} {
				name := fmt.Sprintf("%s at %d clients: server CPU per request ≤ Redis's", wl, c)
				xs := r.cpuRatios("redis", wl, c)
				if len(xs) == 0 {
					gs = append(gs, goal{name, "not measured", "—"})
					continue
				}
				x := median(xs)
				m := fmt.Sprintf("%s (%s vs %s per op)", rangeText(xs), us(r.medianCPU("fencekv", wl, c)), us(r.medianCPU("redis", wl, c)))
				v := "met"
				if x > 1 {
					v = fmt.Sprintf("**missed**: %.0f%% more", 100*(x-1))
				}
				gs = append(gs, goal{name, m, v})
			}
		}
	}
	if g, ok := r.floorGoal(); ok {
		gs = append(gs, g)
	}
	// Against etcd (the first speed issue).
	for _, wl := range []bench.Workload{bench.FencedPut, bench.LockCycle} {
		ratioGoal(wl, 64, "etcd", 4)
	}
	ratioGoal(bench.Contended, 64, "etcd", 3)
	return gs
}

// floorGoal judges fencekv's 1-client fenced-put p50 against the synced
// echo: per round, against the echo measured just before that round's run
// (the median of the rounds' ratios); from reports without those, against
// the one baseline taken at the start.
func (r *report) floorGoal() (goal, bool) {
	const name = "fenced-put at 1 client: p50 at the synced-echo floor (≤ its p50 + 5%)"
	var xs []float64
	var gots, floors []float64
	for _, rr := range r.Runs {
		if rr.System == "fencekv" && rr.Result.Workload == bench.FencedPut && rr.Result.Clients == 1 && succeeded(rr) &&
			rr.SyncedEcho != nil && rr.SyncedEcho.P50 > 0 {
			xs = append(xs, float64(rr.Result.Latency.P50)/float64(rr.SyncedEcho.P50))
			gots = append(gots, float64(rr.Result.Latency.P50))
			floors = append(floors, float64(rr.SyncedEcho.P50))
		}
	}
	verdict := func(x float64, over time.Duration) string {
		if x > 1.05 {
			return fmt.Sprintf("**missed** by %s (%.0f%% over)", ms(over), 100*(x-1))
		}
		return "met"
	}
	if len(xs) > 0 {
		slices.Sort(xs)
		slices.Sort(gots)
		slices.Sort(floors)
		x, got, floor := median(xs), time.Duration(median(gots)), time.Duration(median(floors))
		return goal{name, fmt.Sprintf("p50 over the synced echo measured just before each round's run: %s (medians: p50 %s, echo %s)",
			rangeText(xs), ms(got), ms(floor)), verdict(x, got-floor)}, true
	}
	f, ok := r.find("fencekv", bench.FencedPut, 1)
	if !ok || r.Baselines.SyncedEcho.Count == 0 {
		return goal{}, false
	}
	floor, got := r.Baselines.SyncedEcho.P50, f.Result.Latency.P50
	x := float64(got) / float64(floor)
	return goal{name, fmt.Sprintf("p50 %s; a bare synced echo in another process, at the start of the run: p50 %s (fencekv %+.0f%%)",
		ms(got), ms(floor), 100*(x-1)), verdict(x, got-floor)}, true
}

func peerName(s string) string {
	switch s {
	case "redis":
		return "Redis (appendfsync always)"
	case "etcd":
		return "etcd"
	}
	return s
}

func verdict(x, target float64) string {
	if x >= target {
		return "met"
	}
	return fmt.Sprintf("**missed**: %.0f%% short of %s", 100*(1-x/target), times(target))
}

func times(x float64) string {
	if x == 0 {
		return "—"
	}
	return strconv.FormatFloat(x, 'f', 2, 64) + "×"
}

// us is a duration in microseconds, for CPU time per request.
func us(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
}

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "—"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func cpuModel() string {
	for _, line := range strings.Split(readFile("/proc/cpuinfo"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// loadavg is the 1, 5 and 15 minute load averages.
func loadavg() string {
	f := strings.Fields(readFile("/proc/loadavg"))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func readFile(name string) string {
	b, _ := os.ReadFile(name)
	return string(b)
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseWorkloads(s string) ([]bench.Workload, error) {
	if s == "all" {
		return bench.Workloads, nil
	}
	var out []bench.Workload
	for _, f := range strings.Split(s, ",") {
		wl, err := bench.ParseWorkload(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, wl)
	}
	return out, nil
}

// ports prints n free TCP ports on 127.0.0.1, space-separated: all held
// open at once, so they differ, then closed for the caller to use.
// measureSyncedEcho starts this program again as a synced-echo server
// (another process, as a store is) and measures n round trips to it.
func measureSyncedEcho(dir string, n int) (bench.Latency, error) {
	self, err := os.Executable()
	if err != nil {
		return bench.Latency{}, err
	}
	cmd := exec.Command(self, "synced-echo", dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // closing it stops the server
	if err != nil {
		return bench.Latency{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return bench.Latency{}, err
	}
	if err := cmd.Start(); err != nil {
		return bench.Latency{}, err
	}
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			cmd.Process.Kill()
		}
	}()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return bench.Latency{}, fmt.Errorf("the server did not say its address: %w", err)
	}
	return bench.SyncedEchoRTT(strings.TrimSpace(addr), n)
}

// syncedEcho serves bench.ServeSyncedEcho on a free loopback port, which it
// prints, until its standard input closes.
func syncedEcho(dir string, stdout, stderr io.Writer) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(stderr, "benchpeers synced-echo: %v\n", err)
		return 1
	}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		ln.Close()
	}()
	fmt.Fprintln(stdout, ln.Addr())
	if err := bench.ServeSyncedEcho(ln, dir); err != nil && !errors.Is(err, net.ErrClosed) {
		fmt.Fprintf(stderr, "benchpeers synced-echo: %v\n", err)
		return 1
	}
	return 0
}

func ports(args []string, stdout, stderr io.Writer) int {
	n := 1
	if len(args) == 1 {
		var err error
		if n, err = strconv.Atoi(args[0]); err != nil || n < 1 {
			fmt.Fprintf(stderr, "benchpeers ports: %q is not a positive number\n", args[0])
			return 2
		}
	}
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ps []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintf(stderr, "benchpeers ports: %v\n", err)
			return 1
		}
		lns = append(lns, ln)
		ps = append(ps, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	fmt.Fprintln(stdout, strings.Join(ps, " "))
	return 0
}

// throughputTable writes the table of every workload and client count that
// ran (in the order of clients): each system's ops/s, p50 and p99, then
// fencekv's ops/s over each peer's; and the runs that failed or had errors.
func (r *report) throughputTable(p func(string, ...any), clients []int, peers []string) {
	p("| workload | clients |")
	align := "| --- | ---: |"
	for _, s := range r.Systems {
		p(" %s ops/s | p50 | p99 |", s.Name)
		align += " ---: | ---: | ---: |"
	}
	for _, peer := range peers {
		p(" fencekv/%s |", peer)
		align += " ---: |"
	}
	p("\n%s\n", align)
	var failures []string
	for _, wl := range bench.Workloads {
		for _, c := range clients {
			if !r.ran(wl, c) {
				continue
			}
			p("| %s | %d |", wl, c)
			for _, s := range r.Systems {
				rr, ok := r.find(s.Name, wl, c)
				if !ok {
					p(" failed | | |")
				} else {
					mark := ""
					if rr.Result.Errors > 0 {
						mark = " (!)"
					}
					p(" %.0f%s | %s | %s |", rr.Result.OpsPerSec, mark, ms(rr.Result.Latency.P50), ms(rr.Result.Latency.P99))
				}
				for _, rr := range r.Runs {
					if rr.System == s.Name && rr.Result.Workload == wl && rr.Result.Clients == c && (rr.Error != "" || rr.Result.Errors > 0) {
						failures = append(failures, fmt.Sprintf("%s, %s, %d clients, round %d: %d errors; %s %s", s.Name, wl, c, rr.Round, rr.Result.Errors, rr.Error, rr.Result.FirstError))
					}
				}
			}
			for _, peer := range peers {
				p(" %s |", r.ratioText(peer, wl, c))
			}
			p("\n")
		}
	}
	p("\n")
	if len(failures) > 0 {
		p("Errors (runs marked (!) or failed):\n\n")
		for _, f := range failures {
			p("- %s\n", f)
		}
		p("\n")
	}
}
