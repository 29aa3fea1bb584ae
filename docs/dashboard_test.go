package docs

import (
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv/fencekvtest"
)

var metricName = regexp.MustCompile(`\bfencekv_[a-z0-9_]+`)

// dashboardMetrics returns every metric name a query of the Grafana
// dashboard reads (expr fields, and the template variables' queries).
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	var doc any
	if err := json.Unmarshal([]byte(read(t, "../contrib/grafana-dashboard.json")), &doc); err != nil {
		t.Fatalf("contrib/grafana-dashboard.json: %v", err)
	}
	names := map[string]bool{}
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(x, k)
			}
		case []any:
			for _, x := range v {
				walk(x, key)
			}
		case string:
			if key == "expr" || key == "query" || key == "definition" {
				for _, n := range metricName.FindAllString(v, -1) {
					names[n] = true
				}
			}
		}
	}
	walk(doc, "")
	var out []string
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// scrape returns the names of the series a server's /metrics serves.
func scrape(t *testing.T, httpAddr string) map[string]bool {
	t.Helper()
	var body string
	fencekvtest.Eventually(t, 10*time.Second, "/metrics on "+httpAddr, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == 200
	})
	names := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.IndexAny(l, "{ "); i > 0 {
			names[l[:i]] = true
		}
	}
	return names
}

// run runs a fencekv client command against addr.
func run(t *testing.T, addr string, args ...string) string {
	t.Helper()
	out, _ := exec.Command(bin, append(args, "--addr", addr)...).CombinedOutput()
	return string(out)
}

// TestDashboardMetrics checks that every metric the Grafana dashboard
// reads is in the /metrics of a real server: a single node and a one-node
// cluster, after requests that fill the labelled series (a refused stale
// write among them).
func TestDashboardMetrics(t *testing.T) {
	want := dashboardMetrics(t)
	if len(want) < 20 {
		t.Fatalf("the dashboard reads only %d metrics: %v", len(want), want)
	}

	have := map[string]bool{}
	single := fmtAddr(freePort(t))
	addr := serve(t, "--http", single)
	node := fmtAddr(freePort(t))
	caddr := serve(t, "--http", node, "--node", "n1", "--bootstrap-expect", "1",
		"--raft", fmtAddr(freePort(t)), "--gossip", fmtAddr(freePort(t)))
	for _, a := range []string{addr, caddr} {
		fencekvtest.Eventually(t, 20*time.Second, "a leader at "+a, func() bool {
			return strings.HasPrefix(run(t, a, "put", "k", "v"), "OK")
		})
		tok := strings.TrimSpace(run(t, a, "lock", "acquire", "l", "--ttl", "10s"))
		run(t, a, "put", "f", "1", "--token", tok)
		run(t, a, "put", "f", "0", "--token", "0") // stale: a fencing refusal
	}
	for n := range scrape(t, single) {
		have[n] = true
	}
	for n := range scrape(t, node) {
		have[n] = true
	}
	for _, n := range want {
		if !have[n] {
			t.Errorf("contrib/grafana-dashboard.json reads %s, which no server's /metrics serves", n)
		}
	}
	if t.Failed() {
		var all []string
		for n := range have {
			if strings.HasPrefix(n, "fencekv_") {
				all = append(all, n)
			}
		}
		sort.Strings(all)
		t.Logf("/metrics serves: %s", strings.Join(all, " "))
	}
}

func fmtAddr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }
