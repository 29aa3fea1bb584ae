package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/metrics"
	"github.com/fencekv/fencekv/state"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeStore is a store whose status and readiness the test sets.
type fakeStore struct {
	st    fencekv.Status
	ready error
}

func (f *fakeStore) Status(context.Context) (fencekv.Status, error) { return f.st, nil }
func (f *fakeStore) Ready(context.Context) error                    { return f.ready }

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

func TestReadyz(t *testing.T) {
	m := metrics.New()
	h := m.Handler()
	if code, body := get(t, h, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz = %d %q; want 200 ok", code, body)
	}
	// Before the store is open: 503 and why.
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "not open yet") {
		t.Fatalf("/readyz before Attach = %d %q; want 503 saying the store is not open yet", code, body)
	}
	s := &fakeStore{ready: errors.New("no leader known")}
	m.Attach(s, nil)
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "no leader known") {
		t.Fatalf("/readyz with a store not ready = %d %q; want 503 with its reason", code, body)
	}
	s.ready = nil
	if code, body := get(t, h, "/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("/readyz with a ready store = %d %q; want 200 ok", code, body)
	}
	m.Detach("the server is shutting down")
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "shutting down") {
		t.Fatalf("/readyz after Detach = %d %q; want 503 shutting down", code, body)
	}
}

func TestObserve(t *testing.T) {
	m := metrics.New()
	m.Observe("put", "", time.Millisecond)
	m.Observe("put", fencekv.CodeStaleToken, time.Millisecond)
	m.Observe("put", fencekv.CodeStaleToken, time.Millisecond)
	m.Observe("renew", fencekv.CodeLeaseExpired, time.Millisecond)
	m.Observe("no-such-method-\x00", fencekv.CodeUnknownMethod, 0)
	m.Observe("get", "some_future_code", 0)

	want := `
# HELP fencekv_requests_total Requests served, by method and result code (ok, or the refusal's code).
# TYPE fencekv_requests_total counter
fencekv_requests_total{code="lease_expired",method="renew"} 1
fencekv_requests_total{code="ok",method="put"} 1
fencekv_requests_total{code="other",method="get"} 1
fencekv_requests_total{code="stale_token",method="put"} 2
fencekv_requests_total{code="unknown_method",method="unknown"} 1
# HELP fencekv_fencing_refusals_total Writes and lease operations fencing refused, by code: stale_token (a token below the key's fence), not_holder (the lock is not held by the token), lease_expired (the token's lease ran out).
# TYPE fencekv_fencing_refusals_total counter
fencekv_fencing_refusals_total{code="lease_expired"} 1
fencekv_fencing_refusals_total{code="not_holder"} 0
fencekv_fencing_refusals_total{code="stale_token"} 2
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "fencekv_requests_total", "fencekv_fencing_refusals_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), "fencekv_request_duration_seconds"); n != 4 {
		t.Fatalf("latency histograms: %d series; want 4 (put, renew, unknown, get)", n)
	}
}

func TestStoreMetrics(t *testing.T) {
	m := metrics.New()
	m.Attach(&fakeStore{st: fencekv.Status{Role: "follower",
		Counters: state.Counters{LastToken: 42, Revision: 7, Locks: 3, Waiters: 2, Grants: 9, Expiries: 4}, Term: 5, CommitIndex: 100, AppliedIndex: 99, Leader: "127.0.0.1:7420"}}, nil)
	want := `
# HELP fencekv_last_token The highest fencing token the store has issued.
# TYPE fencekv_last_token gauge
fencekv_last_token 42
# HELP fencekv_leases_expired_total Leases that ran out without a renew, applied since the process started.
# TYPE fencekv_leases_expired_total counter
fencekv_leases_expired_total 4
# HELP fencekv_cluster_role 1 for this node's raft role, 0 for the others (single: not a cluster).
# TYPE fencekv_cluster_role gauge
fencekv_cluster_role{role="candidate"} 0
fencekv_cluster_role{role="follower"} 1
fencekv_cluster_role{role="leader"} 0
fencekv_cluster_role{role="single"} 0
# HELP fencekv_raft_applied_index The last raft index this node applied.
# TYPE fencekv_raft_applied_index gauge
fencekv_raft_applied_index 99
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"fencekv_last_token", "fencekv_leases_expired_total", "fencekv_cluster_role", "fencekv_raft_applied_index"); err != nil {
		t.Fatal(err)
	}
	// The registry's own consistency checks pass over everything.
	if _, err := m.Registry().Gather(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkObserve is the cost a request pays for metrics.
func BenchmarkObserve(b *testing.B) {
	m := metrics.New()
	for b.Loop() {
		m.Observe("put", "", 150*time.Microsecond)
	}
}
