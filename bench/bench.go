// Package bench is fencekv's load generator: closed-loop clients, each on
// a connection of its own, run one workload against a store for a fixed
// time after a warm-up, and the run reports throughput, latency
// percentiles from an HDR histogram, and (for the contended lock) how
// fairly the grants were shared.
//
// The store is reached through a Driver, so the same workloads run against
// fencekv (DialFencekv, in this package) and against other stores (the
// etcd and Redis drivers live in the module under bench/peers, to keep
// their dependencies out of fencekv's).
//
// # Workloads
//
//   - fenced-put: each client takes a lock of its own once, then every op
//     is one put to its own key carrying that lock's token.
//   - lock-cycle: each op acquires the client's own lock, puts to the
//     client's own key with the new token, and releases.
//   - contended: every client competes for one lock, queueing for it
//     (wait > 0); each op is one grant: acquire, fenced put to one shared
//     key, release. Reports grants per client and Jain's fairness index.
//   - get: each op reads a random key of Keys preloaded keys.
//   - mixed: GetPercent of ops are gets as above, the rest fenced puts to a
//     random key of the client's share of the keys (keys are split between
//     clients so that no client's token fences out another's).
//
// # Caveats
//
// Clients are closed loops: a client sends its next request only when the
// last one was answered, so the load is set by the number of clients, and
// latency under overload is not measured (coordinated omission). Ops that
// straddle the start or end of the measured window are not counted. The
// load generator shares the machine with the server it measures.
package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Workload names a workload; see the package doc.
type Workload string

// The workloads.
const (
	FencedPut Workload = "fenced-put"
	LockCycle Workload = "lock-cycle"
	Contended Workload = "contended"
	Get       Workload = "get"
	Mixed     Workload = "mixed"
)

// Workloads lists every workload, in the order reports show them.
var Workloads = []Workload{FencedPut, LockCycle, Contended, Get, Mixed}

// ParseWorkload returns the workload named s.
func ParseWorkload(s string) (Workload, error) {
	for _, w := range Workloads {
		if string(w) == s {
			return w, nil
		}
	}
	names := make([]string, len(Workloads))
	for i, w := range Workloads {
		names[i] = string(w)
	}
	return "", fmt.Errorf("bench: unknown workload %q (want one of %s)", s, strings.Join(names, ", "))
}

// Config describes one run. Start from DefaultConfig.
type Config struct {
	Workload   Workload
	Clients    int           // concurrent clients, one connection each
	Duration   time.Duration // measured time
	Warmup     time.Duration // unmeasured time before it
	ValueSize  int           // bytes per value written
	Keys       int           // keys preloaded and read by get and mixed
	GetPercent int           // mixed: share of gets, 0..100
	TTL        time.Duration // lease of every lock taken
	Wait       time.Duration // contended: longest wait for the lock
	Prefix     string        // of every key and lock name used

	// Progress, if not nil, receives a status line once a second.
	Progress io.Writer

	// OnMeasure, if not nil, is called as the measured window opens; the
	// func it returns, if not nil, is called as the window closes, before
	// the clients finish their last ops. benchpeers reads each server's
	// CPU time there.
	OnMeasure func() (closed func())
}

// DefaultConfig returns the defaults of 'fencekv bench'.
func DefaultConfig() Config {
	return Config{
		Workload:   FencedPut,
		Clients:    16,
		Duration:   10 * time.Second,
		Warmup:     time.Second,
		ValueSize:  128,
		Keys:       1000,
		GetPercent: 80,
		TTL:        10 * time.Second,
		Wait:       30 * time.Second,
		Prefix:     "bench/",
	}
}

// Validate reports the first bad field of c.
func (c Config) Validate() error {
	if _, err := ParseWorkload(string(c.Workload)); err != nil {
		return err
	}
	switch {
	case c.Clients < 1:
		return fmt.Errorf("bench: clients %d: want at least 1", c.Clients)
	case c.Duration <= 0:
		return fmt.Errorf("bench: duration %v: want more than 0", c.Duration)
	case c.Warmup < 0:
		return fmt.Errorf("bench: warm-up %v: want 0 or more", c.Warmup)
	case c.ValueSize < 0:
		return fmt.Errorf("bench: value size %d: want 0 or more", c.ValueSize)
	case c.Keys < 1:
		return fmt.Errorf("bench: keys %d: want at least 1", c.Keys)
	case c.GetPercent < 0 || c.GetPercent > 100:
		return fmt.Errorf("bench: get percent %d: want 0..100", c.GetPercent)
	case c.TTL <= 0:
		return fmt.Errorf("bench: ttl %v: want more than 0", c.TTL)
	case c.Workload == Contended && c.Wait <= 0:
		return fmt.Errorf("bench: wait %v: the contended workload needs a wait above 0", c.Wait)
	}
	return nil
}

// Result is what a run measured. Only ops that started and ended inside
// the measured window count; errors are counted over the whole run.
type Result struct {
	Workload   Workload      `json:"workload"`
	Clients    int           `json:"clients"`
	ValueSize  int           `json:"value_size"`
	Keys       int           `json:"keys"`
	Elapsed    time.Duration `json:"-"`
	Seconds    float64       `json:"seconds"` // Elapsed, for JSON
	Ops        int64         `json:"ops"`
	OpsPerSec  float64       `json:"ops_per_sec"`
	Errors     int64         `json:"errors"`
	FirstError string        `json:"first_error,omitempty"`
	Latency    Latency       `json:"latency"`
	// Interrupted is set when ctx ended the run early.
	Interrupted bool `json:"interrupted,omitempty"`

	// Contended only: grants per client, their spread, and Jain's
	// fairness index over them (1 is perfectly even).
	Grants    []int64 `json:"grants,omitempty"`
	GrantsMin int64   `json:"grants_min,omitempty"`
	GrantsMax int64   `json:"grants_max,omitempty"`
	Fairness  float64 `json:"fairness,omitempty"`
}

// maxConsecutiveErrors stops a client whose store keeps refusing it.
const maxConsecutiveErrors = 100

// Phases of a run, read by every client before and after each op.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// run is the state shared by the clients of one Run. Its fields are set
// before the clients start and only read after, except phase.
type run struct {
	cfg        Config
	phase      atomic.Int32
	dataKeys   []string // get and mixed
	sharedLock string   // contended
	sharedKey  string   // contended
	lockPrefix string   // own locks: lockPrefix + client number

	abortOnce sync.Once
	abort     chan struct{} // closed when a client gives up: the run ends
}

// worker is one client. Its fields are touched only by its own goroutine,
// except ops and errs (read by the progress line) and the results, read
// after it ends.
type worker struct {
	r       *run
	id      int
	d       Driver
	rng     *rand.Rand
	value   []byte
	ownLock string
	ownKey  string
	token   uint64   // the own lock's token (fenced-put, mixed)
	putKeys []string // mixed: this client's share of the keys

	hist     *Histogram
	measured int64 // ops in the measured window (grants, for contended)
	ops      atomic.Int64
	errs     atomic.Int64
	firstErr error
	fatal    error
}

// Run dials cfg.Clients drivers, prepares the workload (preloading keys and
// taking the clients' own locks as it needs), runs it for cfg.Warmup plus
// cfg.Duration, and closes the drivers. If ctx ends first, the run stops
// and its result so far is returned with Interrupted set. A client that
// sees 100 errors in a row gives up and ends the run: Run returns the
// result so far with an error.
func Run(ctx context.Context, dial Dialer, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	r := newRun(cfg)
	ws := make([]*worker, cfg.Clients)
	defer func() { r.teardown(ws) }()
	if err := r.dial(ctx, dial, ws); err != nil {
		return Result{}, err
	}
	if err := r.prepare(ctx, ws); err != nil {
		return Result{}, err
	}
	elapsed, interrupted := r.drive(ctx, ws)
	res := r.result(ws, elapsed)
	res.Interrupted = interrupted
	for _, w := range ws {
		if w.fatal != nil {
			return res, fmt.Errorf("bench: client %d gave up: %w", w.id, w.fatal)
		}
	}
	return res, nil
}

func newRun(cfg Config) *run {
	// Lock names are new for every run, so that nothing a previous run
	// left (a queue, a lease) is in the way; keys are reused, which works
	// because every store's tokens only grow.
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	r := &run{
		cfg:        cfg,
		sharedLock: cfg.Prefix + "contended/" + id,
		sharedKey:  cfg.Prefix + "contended",
		lockPrefix: cfg.Prefix + "lock/" + id + "/",
		abort:      make(chan struct{}),
	}
	if cfg.Workload == Get || cfg.Workload == Mixed {
		r.dataKeys = make([]string, cfg.Keys)
		for i := range r.dataKeys {
			r.dataKeys[i] = cfg.Prefix + "key/" + strconv.Itoa(i)
		}
	}
	return r
}

// dial connects every client at once.
func (r *run) dial(ctx context.Context, dial Dialer, ws []*worker) error {
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i := range ws {
		wg.Go(func() {
			d, err := dial(ctx)
			if err != nil {
				errs[i] = fmt.Errorf("bench: dial client %d: %w", i, err)
				return
			}
			ws[i] = r.newWorker(i, d)
		})
	}
	wg.Wait()
	return first(errs)
}

// first returns the first error of errs, noting how many more there were.
func first(errs []error) error {
	var err error
	n := 0
	for _, e := range errs {
		if e != nil {
			if err == nil {
				err = e
			}
			n++
		}
	}
	if n > 1 {
		return fmt.Errorf("%w (and %d clients more)", err, n-1)
	}
	return err
}

func (r *run) newWorker(id int, d Driver) *worker {
	cfg := r.cfg
	w := &worker{
		r:       r,
		id:      id,
		d:       d,
		rng:     rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(id))),
		value:   make([]byte, cfg.ValueSize),
		ownLock: r.lockPrefix + strconv.Itoa(id),
		hist:    NewHistogram(),
	}
	for i := range w.value {
		w.value[i] = byte('a' + w.rng.IntN(26))
	}
	switch cfg.Workload {
	case FencedPut:
		w.ownKey = cfg.Prefix + "own/" + strconv.Itoa(id)
	case LockCycle:
		w.ownKey = cfg.Prefix + "cycle/" + strconv.Itoa(id)
	case Mixed:
		for j := id; j < cfg.Keys; j += cfg.Clients {
			w.putKeys = append(w.putKeys, r.dataKeys[j])
		}
		if len(w.putKeys) == 0 { // more clients than keys
			w.putKeys = []string{cfg.Prefix + "own/" + strconv.Itoa(id)}
		}
	}
	return w
}

// prepare preloads the keys get and mixed read (those missing, written
// without a token) and takes the own lock of each fenced-put and mixed
// client.
func (r *run) prepare(ctx context.Context, ws []*worker) error {
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			for j := w.id; j < len(r.dataKeys); j += len(ws) {
				_, found, err := w.d.Get(ctx, r.dataKeys[j])
				if err == nil && !found {
					err = w.d.Put(ctx, r.dataKeys[j], w.value, 0)
				}
				if err != nil {
					errs[w.id] = fmt.Errorf("bench: preload %s: %w", r.dataKeys[j], err)
					return
				}
			}
			if r.cfg.Workload == FencedPut || r.cfg.Workload == Mixed {
				t, err := w.d.Acquire(ctx, w.ownLock, r.cfg.TTL, 0)
				if err != nil {
					errs[w.id] = fmt.Errorf("bench: client %d: acquire %s: %w", w.id, w.ownLock, err)
					return
				}
				w.token = t
			}
		})
	}
	wg.Wait()
	return first(errs)
}

// drive runs the clients through warm-up and the measured window and
// returns the window's length, and whether ctx cut it short.
func (r *run) drive(ctx context.Context, ws []*worker) (time.Duration, bool) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() { w.loop(ctx) })
	}
	stopProgress := r.progress(ws)
	interrupted := false
	sleep := func(d time.Duration) {
		if interrupted || d <= 0 {
			return
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.abort:
		case <-ctx.Done():
			interrupted = true
		}
	}
	sleep(r.cfg.Warmup)
	var closed func()
	if r.cfg.OnMeasure != nil {
		closed = r.cfg.OnMeasure()
	}
	start := time.Now()
	r.phase.Store(phaseMeasure)
	sleep(r.cfg.Duration)
	r.phase.Store(phaseStop)
	elapsed := time.Since(start)
	if closed != nil {
		closed()
	}
	wg.Wait() // each client finishes its op in flight (a queued acquire, too)
	stopProgress()
	return elapsed, interrupted
}

// loop runs ops until the run stops.
func (w *worker) loop(ctx context.Context) {
	consecutive := 0
	for ctx.Err() == nil {
		p := w.r.phase.Load()
		if p == phaseStop {
			return
		}
		start := time.Now()
		err := w.op(ctx)
		took := time.Since(start)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.errs.Add(1)
			if w.firstErr == nil {
				w.firstErr = err
			}
			if consecutive++; consecutive >= maxConsecutiveErrors {
				w.fatal = fmt.Errorf("%d errors in a row, the last: %w", consecutive, err)
				w.r.abortOnce.Do(func() { close(w.r.abort) })
				return
			}
			continue
		}
		consecutive = 0
		w.ops.Add(1)
		if p == phaseMeasure && w.r.phase.Load() == phaseMeasure {
			w.hist.Record(took)
			w.measured++
		}
	}
}

// op runs one op of the workload.
func (w *worker) op(ctx context.Context) error {
	cfg := &w.r.cfg
	switch cfg.Workload {
	case FencedPut:
		return w.d.Put(ctx, w.ownKey, w.value, w.token)
	case LockCycle:
		return w.cycle(ctx, w.ownLock, w.ownKey, 0)
	case Contended:
		return w.cycle(ctx, w.r.sharedLock, w.r.sharedKey, cfg.Wait)
	case Get:
		return w.get(ctx)
	case Mixed:
		if w.rng.IntN(100) < cfg.GetPercent {
			return w.get(ctx)
		}
		return w.d.Put(ctx, w.putKeys[w.rng.IntN(len(w.putKeys))], w.value, w.token)
	}
	return fmt.Errorf("bench: unknown workload %q", cfg.Workload)
}

// cycle acquires lock, writes key with the grant's token and releases.
func (w *worker) cycle(ctx context.Context, lock, key string, wait time.Duration) error {
	t, err := w.d.Acquire(ctx, lock, w.r.cfg.TTL, wait)
	if err != nil {
		return fmt.Errorf("acquire %s: %w", lock, err)
	}
	if err := w.d.Put(ctx, key, w.value, t); err != nil {
		w.d.Release(ctx, lock, t)
		return fmt.Errorf("put %s with token %d: %w", key, t, err)
	}
	if err := w.d.Release(ctx, lock, t); err != nil {
		return fmt.Errorf("release %s token %d: %w", lock, t, err)
	}
	return nil
}

func (w *worker) get(ctx context.Context) error {
	key := w.r.dataKeys[w.rng.IntN(len(w.r.dataKeys))]
	_, found, err := w.d.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("get %s: %w", key, err)
	}
	if !found {
		return fmt.Errorf("get %s: preloaded key is missing", key)
	}
	return nil
}

// teardown releases the clients' own locks (best effort) and closes every
// driver.
func (r *run) teardown(ws []*worker) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range ws {
		if w == nil {
			continue
		}
		wg.Go(func() {
			if w.token != 0 {
				w.d.Release(ctx, w.ownLock, w.token) // the lease may have run out; fine
			}
			w.d.Close()
		})
	}
	wg.Wait()
}

func (r *run) result(ws []*worker, elapsed time.Duration) Result {
	cfg := r.cfg
	res := Result{
		Workload:  cfg.Workload,
		Clients:   cfg.Clients,
		ValueSize: cfg.ValueSize,
		Keys:      cfg.Keys,
		Elapsed:   elapsed,
		Seconds:   elapsed.Seconds(),
	}
	h := NewHistogram()
	for _, w := range ws {
		h.Merge(w.hist)
		res.Ops += w.measured
		res.Errors += w.errs.Load()
		if res.FirstError == "" && w.firstErr != nil {
			res.FirstError = fmt.Sprintf("client %d: %v", w.id, w.firstErr)
		}
	}
	res.Latency = h.Latency()
	if elapsed > 0 {
		res.OpsPerSec = float64(res.Ops) / elapsed.Seconds()
	}
	if cfg.Workload == Contended {
		res.Grants = make([]int64, len(ws))
		for i, w := range ws {
			res.Grants[i] = w.measured
		}
		res.GrantsMin, res.GrantsMax = res.Grants[0], res.Grants[0]
		for _, g := range res.Grants {
			res.GrantsMin, res.GrantsMax = min(res.GrantsMin, g), max(res.GrantsMax, g)
		}
		res.Fairness = Fairness(res.Grants)
	}
	return res
}

// progress writes a status line to cfg.Progress once a second until the
// returned func is called. On a terminal the line is rewritten in place.
func (r *run) progress(ws []*worker) (stop func()) {
	out := r.cfg.Progress
	if out == nil {
		return func() {}
	}
	inPlace := isTerminal(out)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		began := time.Now()
		var last int64
		wrote := false
		for {
			select {
			case <-done:
				if wrote && inPlace {
					fmt.Fprintln(out)
				}
				return
			case <-tick.C:
			}
			var ops, errs int64
			for _, w := range ws {
				ops += w.ops.Load()
				errs += w.errs.Load()
			}
			phase := "measure"
			switch r.phase.Load() {
			case phaseWarmup:
				phase = "warm-up"
			case phaseStop:
				phase = "draining"
			}
			line := fmt.Sprintf("bench: %s, %d clients, %s, %3.0fs: %8d ops/s, %d errors",
				r.cfg.Workload, r.cfg.Clients, phase, time.Since(began).Seconds(), ops-last, errs)
			last = ops
			if inPlace {
				fmt.Fprintf(out, "\r%s\033[K", line)
			} else {
				fmt.Fprintln(out, line)
			}
			wrote = true
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
