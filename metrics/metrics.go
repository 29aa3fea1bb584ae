// Package metrics serves a fencekv server's operational endpoints over
// HTTP: /metrics (Prometheus text format, every name prefixed fencekv_),
// /healthz and /readyz.
//
// What it measures comes from three places:
//
//   - the request path: the wire server calls Observe once per request
//     (wire.Config.Observe), which counts it by method and result code
//     and adds its latency to the method's histogram. The series are kept
//     in fixed tables indexed by method and code, resolved once, so a
//     request costs two map lookups and a few atomic adds;
//   - the commit path: the engine calls Committed and Checkpointed
//     (fencekv.Options.Observer) with each group commit's size and sync
//     time and each checkpoint's duration;
//   - the store's counters, read at scrape time from the attached Store
//     (its Status: tokens, revision, locks, waiters, grants, expiries, and
//     on a cluster node its role, term and indexes), the open
//     connections, and on a cluster node its Raft.
//
// The HTTP endpoints start before the store is open (/readyz says so), and
// Attach connects the store once it is.
package metrics

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Store is what the metrics read at scrape time: a *fencekv.DB or a
// cluster node.
type Store interface {
	Status(ctx context.Context) (fencekv.Status, error)
}

// Readiness is a Store that can say whether it serves: nil, or why not.
// A Store without it is ready once attached.
type Readiness interface {
	Ready(ctx context.Context) error
}

// Raft is a cluster node's view of its replication, read at scrape time.
type Raft interface {
	// LeaderChanges counts the changes of leader this node has seen.
	LeaderChanges() uint64
	// LastContact is the time since this node last heard from a leader:
	// 0 on the leader itself, and false if it never has.
	LastContact() (time.Duration, bool)
}

// Conns reports the open client connections (a *wire.Server).
type Conns interface {
	Conns() int
}

// methodNames are the protocol's methods: each gets its own series. Any
// other name a client sends is counted as "unknown", so that clients
// cannot make series without bound.
var methodNames = []string{"ping", "get", "put", "delete", "cas", "incr", "scan", "acquire", "renew", "release",
	"lock_info", "locks", "status", "members", "backup", "backup_read", "auth",
	"txn", "watch", "unwatch", "term", "refusals", "forwarding", "read_index", "unknown"}

// codeNames are the result codes: "ok", then the refusal codes of the
// protocol. A code not listed is counted as "other".
var codeNames = []string{"ok",
	string(fencekv.CodeStaleToken), string(fencekv.CodeNotHolder), string(fencekv.CodeLeaseExpired),
	string(fencekv.CodeLockHeld), string(fencekv.CodeCompareFailed), string(fencekv.CodeNotInteger),
	string(fencekv.CodeTooLarge), string(fencekv.CodeBadRequest), string(fencekv.CodeUnknownMethod),
	string(fencekv.CodeUnavailable), string(fencekv.CodeNotLeader), string(fencekv.CodeLimitExceeded),
	string(fencekv.CodeInternal), "unauthenticated", "permission_denied", "compacted", "other"}

// methodIndex is the index of a method in methodNames: a switch, which
// costs a request a few comparisons where a map costs a hash.
func methodIndex(method string) int {
	switch method {
	case "ping":
		return 0
	case "get":
		return 1
	case "put":
		return 2
	case "delete":
		return 3
	case "cas":
		return 4
	case "incr":
		return 5
	case "scan":
		return 6
	case "acquire":
		return 7
	case "renew":
		return 8
	case "release":
		return 9
	case "lock_info":
		return 10
	case "locks":
		return 11
	case "status":
		return 12
	case "members":
		return 13
	case "backup":
		return 14
	case "backup_read":
		return 15
	case "auth":
		return 16
	case "txn":
		return 17
	case "watch":
		return 18
	case "unwatch":
		return 19
	case "term":
		return 20
	case "refusals":
		return 21
	case "forwarding":
		return 22
	case "read_index":
		return 23
	}
	return 24 // unknown
}

// codeIndex is the index of a refusal code in codeNames.
func codeIndex(code fencekv.Code) int {
	switch code {
	case "", "ok":
		return 0
	case fencekv.CodeStaleToken:
		return 1
	case fencekv.CodeNotHolder:
		return 2
	case fencekv.CodeLeaseExpired:
		return 3
	case fencekv.CodeLockHeld:
		return 4
	case fencekv.CodeCompareFailed:
		return 5
	case fencekv.CodeNotInteger:
		return 6
	case fencekv.CodeTooLarge:
		return 7
	case fencekv.CodeBadRequest:
		return 8
	case fencekv.CodeUnknownMethod:
		return 9
	case fencekv.CodeUnavailable:
		return 10
	case fencekv.CodeNotLeader:
		return 11
	case fencekv.CodeLimitExceeded:
		return 12
	case fencekv.CodeInternal:
		return 13
	case "unauthenticated":
		return 14
	case "permission_denied":
		return 15
	case "compacted":
		return 16
	}
	return 17 // other
}

// fencing are the refusals by which fencing stopped a write or a lease
// operation: a stale token, a lock not held by the token, a lease run out.
var fencing = []fencekv.Code{fencekv.CodeStaleToken, fencekv.CodeNotHolder, fencekv.CodeLeaseExpired}

// Metrics holds a server's metrics and serves them. Its methods are safe
// for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	// The series of requests and latency, resolved on first use: the
	// request path then only loads a pointer.
	reqTab [][]atomic.Pointer[prometheus.Counter]
	latTab []atomic.Pointer[prometheus.Observer]
	refuse []prometheus.Counter // by index in codeNames; nil but for fencing codes

	commitSize prometheus.Histogram
	syncTime   prometheus.Histogram
	ckptTime   prometheus.Histogram
	statusErrs atomic.Uint64 // scrapes whose Status failed (storeCollector)

	state atomic.Pointer[state]

	resolveMu sync.Mutex // serializes the first resolution of a series
}

// state is what the scrape-time metrics and /readyz read: the attached
// store, or why there is none.
type state struct {
	store  Store
	conns  Conns
	reason string // when store is nil
}

// New returns the metrics of one server, with the Go runtime's and the
// process's metrics besides fencekv's own.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	for i, n := range methodNames {
		if methodIndex(n) != i {
			panic("metrics: methodIndex disagrees with methodNames at " + n)
		}
	}
	for i, n := range codeNames[1:] {
		if codeIndex(fencekv.Code(n)) != i+1 {
			panic("metrics: codeIndex disagrees with codeNames at " + n)
		}
	}

	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekv_requests_total",
		Help: "Requests served, by method and result code (ok, or the refusal's code).",
	}, []string{"method", "code"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fencekv_request_duration_seconds",
		Help:    "Time from reading a request to sending its answer, by method (a queued acquire includes its wait).",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 14), // 50µs .. 7.5s
	}, []string{"method"})
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekv_fencing_refusals_total",
		Help: "Writes and lease operations fencing refused, by code: stale_token (a token below the key's fence), not_holder (the lock is not held by the token), lease_expired (the token's lease ran out).",
	}, []string{"code"})
	m.reqTab = make([][]atomic.Pointer[prometheus.Counter], len(methodNames))
	for i := range m.reqTab {
		m.reqTab[i] = make([]atomic.Pointer[prometheus.Counter], len(codeNames))
	}
	m.latTab = make([]atomic.Pointer[prometheus.Observer], len(methodNames))
	m.refuse = make([]prometheus.Counter, len(codeNames))
	for _, c := range fencing {
		// Created now, so that they read 0 before the first refusal.
		m.refuse[codeIndex(c)] = refusals.WithLabelValues(string(c))
	}

	m.commitSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencekv_commit_commands",
		Help:    "Commands per group commit (one log sync each) on a single node.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 11), // 1 .. 1024
	})
	m.syncTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencekv_log_sync_duration_seconds",
		Help:    "Time to append and fdatasync one group commit's record to the write-ahead log, on a single node.",
		Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16), // 25µs .. 0.8s
	})
	m.ckptTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencekv_checkpoint_duration_seconds",
		Help:    "Time to checkpoint the write-ahead log into the data file (commit and fsync), on a single node.",
		Buckets: prometheus.ExponentialBuckets(250e-6, 2, 16), // 0.25ms .. 8s
	})
	m.state.Store(&state{reason: "the store is not open yet"})

	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.requests, m.latency, refusals, m.commitSize, m.syncTime, m.ckptTime,
		&storeCollector{m: m},
	)
	return m
}

// Registry is the registry the metrics are in (to add more, or to gather
// them in tests).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Observe counts one request: its method as the client named it, the
// code of its refusal ("" when it succeeded), and its latency. It is
// wire.Config.Observe.
func (m *Metrics) Observe(method string, code fencekv.Code, d time.Duration) {
	mi, ci := methodIndex(method), 0
	if code != "" {
		ci = codeIndex(code)
	}
	c := m.reqTab[mi][ci].Load()
	if c == nil {
		c = m.resolveCounter(mi, ci)
	}
	(*c).Inc()
	o := m.latTab[mi].Load()
	if o == nil {
		o = m.resolveLatency(mi)
	}
	(*o).Observe(d.Seconds())
	if r := m.refuse[ci]; r != nil {
		r.Inc()
	}
}

func (m *Metrics) resolveCounter(mi, ci int) *prometheus.Counter {
	m.resolveMu.Lock()
	defer m.resolveMu.Unlock()
	if c := m.reqTab[mi][ci].Load(); c != nil {
		return c
	}
	c := m.requests.WithLabelValues(methodNames[mi], codeNames[ci])
	m.reqTab[mi][ci].Store(&c)
	return &c
}

func (m *Metrics) resolveLatency(mi int) *prometheus.Observer {
	m.resolveMu.Lock()
	defer m.resolveMu.Unlock()
	if o := m.latTab[mi].Load(); o != nil {
		return o
	}
	o := m.latency.WithLabelValues(methodNames[mi])
	m.latTab[mi].Store(&o)
	return &o
}

// Committed records a group commit (fencekv.Observer).
func (m *Metrics) Committed(commands int, sync time.Duration) {
	m.commitSize.Observe(float64(commands))
	m.syncTime.Observe(sync.Seconds())
}

// Checkpointed records a checkpoint (fencekv.Observer).
func (m *Metrics) Checkpointed(d time.Duration) { m.ckptTime.Observe(d.Seconds()) }

var _ fencekv.Observer = (*Metrics)(nil)

// Attach connects the open store (and the server's connections, if conns
// is not nil): its counters are scraped from now on, and /readyz asks it.
func (m *Metrics) Attach(s Store, conns Conns) {
	m.state.Store(&state{store: s, conns: conns})
}

// Detach disconnects the store (it is closing), and /readyz answers 503
// with reason from now on.
func (m *Metrics) Detach(reason string) {
	m.state.Store(&state{reason: reason})
}

// Ready reports whether the server serves: nil, or why not.
func (m *Metrics) Ready(ctx context.Context) error {
	st := m.state.Load()
	if st.store == nil {
		return notReady(st.reason)
	}
	if r, ok := st.store.(Readiness); ok {
		return r.Ready(ctx)
	}
	return nil
}

type notReady string

func (e notReady) Error() string { return string(e) }
