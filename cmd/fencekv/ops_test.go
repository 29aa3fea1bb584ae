package main

// Operations, with real processes: metrics over HTTP as requests run, and
// a backup under write load restored into a new server.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// httpGet returns the status and body of a GET.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// scrape reads /metrics into a map from series ("name{labels}") to value.
func scrape(t *testing.T, httpAddr string) map[string]float64 {
	t.Helper()
	code, body := httpGet(t, "http://"+httpAddr+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics: bad line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

func TestMetricsOverHTTP(t *testing.T) {
	httpAddr := freeAddr(t)
	s := startServer(t, t.TempDir(), "--http", httpAddr)
	if code, body := httpGet(t, "http://"+httpAddr+"/healthz"); code != 200 {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	if code, body := httpGet(t, "http://"+httpAddr+"/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("/readyz of a serving single node = %d %q; want 200 ok", code, body)
	}
	before := scrape(t, httpAddr)
	const stale = `fencekv_fencing_refusals_total{code="stale_token"}`
	if v, ok := before[stale]; !ok || v != 0 {
		t.Fatalf("%s before any refusal = %v (present %v); want 0", stale, v, ok)
	}

	c := s.shell(t)
	token := parseToken(t, c.ok("lock", "acquire", "inventory", "--ttl", "30s"))
	c.ok("put", "inventory/sku-1", "41", "--token", fmt.Sprint(token))
	c.fails(exitFenced, "put", "inventory/sku-1", "40", "--token", "0")

	want := map[string]float64{
		stale: 1,
		`fencekv_requests_total{code="stale_token",method="put"}`: 1,
		`fencekv_requests_total{code="ok",method="put"}`:          1,
		`fencekv_requests_total{code="ok",method="acquire"}`:      1,
		`fencekv_last_token`:                                   float64(token),
		`fencekv_locks_held`:                                   1,
		`fencekv_leases_granted_total`:                         1,
		`fencekv_cluster_role{role="single"}`:                  1,
		`fencekv_request_duration_seconds_count{method="put"}`: 2,
	}
	// A request is counted just after its answer is sent: the CLI may
	// have its answer, and exited, a moment before.
	counted := func(m map[string]float64) bool {
		for k, v := range want {
			if m[k] != v {
				return false
			}
		}
		return true
	}
	after := scrape(t, httpAddr)
	for deadline := time.Now().Add(10 * time.Second); !counted(after) && time.Now().Before(deadline); after = scrape(t, httpAddr) {
		time.Sleep(10 * time.Millisecond) // a poll, with a deadline
	}
	for k, v := range want {
		if after[k] != v {
			t.Errorf("%s = %v; want %v", k, after[k], v)
		}
	}
	if after["fencekv_commits_total"] < 2 || after["fencekv_log_sync_duration_seconds_count"] < 2 {
		t.Errorf("commits %v, log syncs observed %v; want at least the grant's and the put's",
			after["fencekv_commits_total"], after["fencekv_log_sync_duration_seconds_count"])
	}
	if after["fencekv_open_connections"] < 0 || after["process_resident_memory_bytes"] <= 0 {
		t.Errorf("open connections %v, resident memory %v", after["fencekv_open_connections"], after["process_resident_memory_bytes"])
	}
}

func TestServeHTTPAddressInUse(t *testing.T) {
	httpAddr := freeAddr(t)
	startServer(t, t.TempDir(), "--http", httpAddr)
	c := &shell{t: t}
	r := c.run("serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--http", httpAddr)
	if r.code == 0 {
		t.Fatalf("a second server on the same --http: want a non-zero exit, got %v", r)
	}
	wantContains(t, "stderr", r.stderr, "each server on a machine needs its own --http")
}

// TestBackupRestoreUnderLoad takes a backup while clients write and take
// locks, keeps them going after it, then restores it into a new data dir
// and serves that: every write acknowledged before the backup started is
// there, and the first token the restored server issues is above every
// token the old one issued, before and after the backup (G1).
func TestBackupRestoreUnderLoad(t *testing.T) {
	old := startServer(t, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// acked[w] is the last i that writer w's put of key w/i was
	// acknowledged for before the backup started (-1: none).
	const writers = 4
	var (
		mu          sync.Mutex
		backupStart bool
		acked       [writers]int
		maxToken    fencekv.Token
		wg          sync.WaitGroup
	)
	for w := range writers {
		acked[w] = -1
		cl, err := wire.Dial(ctx, old.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				_, err := cl.Put(ctx, []byte(fmt.Sprintf("w%d/%06d", w, i)), []byte(strconv.Itoa(i)), fencekv.WriteOptions{})
				if err != nil {
					return
				}
				mu.Lock()
				if !backupStart {
					acked[w] = i
				}
				mu.Unlock()
			}
		})
	}
	lockCl, err := wire.Dial(ctx, old.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer lockCl.Close()
	grants := make(chan struct{}, 1)
	wg.Go(func() {
		for ctx.Err() == nil {
			l, err := lockCl.Acquire(ctx, "jobs", time.Second, nil)
			if err != nil {
				return
			}
			mu.Lock()
			maxToken = max(maxToken, l.Token)
			mu.Unlock()
			select {
			case grants <- struct{}{}:
			default:
			}
			if err := lockCl.Release(ctx, "jobs", l.Token); err != nil {
				return
			}
		}
	})
	// Let the load run, then back up while it goes on.
	waitFor(t, 10*time.Second, "some acknowledged writes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return acked[writers-1] >= 20
	})
	file := filepath.Join(t.TempDir(), "fencekv.fkvb")
	c := old.shell(t)
	mu.Lock()
	backupStart = true
	mu.Unlock()
	out := c.jsonOK("backup", file)
	// Tokens issued after the backup: the restored store must not issue
	// them again.
	mu.Lock()
	tokenAtBackup := maxToken
	mu.Unlock()
	waitFor(t, 10*time.Second, "grants after the backup", func() bool {
		select {
		case <-grants:
		case <-time.After(100 * time.Millisecond):
		}
		mu.Lock()
		defer mu.Unlock()
		return maxToken > tokenAtBackup+5
	})
	cancel()
	wg.Wait()
	st := decodeJSON(t, c.ok("status", "--json"))
	lastIssued := fencekv.Token(st["last_token"].(float64))
	if lastIssued < maxToken {
		t.Fatalf("old server's last token %d < the highest token seen %d", lastIssued, maxToken)
	}
	if uint64(out["last_token"].(float64)) >= uint64(lastIssued) {
		t.Fatalf("the backup's last token %v is not below the old server's %d: no grant came after it", out["last_token"], lastIssued)
	}
	old.stop(t)

	// A damaged and a truncated copy are refused, and leave no dir.
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	damaged := filepath.Join(t.TempDir(), "damaged.fkvb")
	d := append([]byte(nil), data...)
	d[len(d)/2] ^= 0x40
	os.WriteFile(damaged, d, 0o600)
	cut := filepath.Join(t.TempDir(), "cut.fkvb")
	os.WriteFile(cut, data[:len(data)-100], 0o600)
	for name, f := range map[string]string{"a damaged": damaged, "a truncated": cut} {
		dir := filepath.Join(t.TempDir(), "restored")
		r := c.fails(exitViolation, "restore", f, "--data", dir)
		wantContains(t, name+" backup: stderr", r.stderr, map[string]string{"a damaged": "does not match its checksum", "a truncated": "cut short"}[name])
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s backup left %s behind (%v)", name, dir, err)
		}
	}
	// Not into a dir that holds anything.
	busy := t.TempDir()
	os.WriteFile(filepath.Join(busy, "x"), nil, 0o600)
	wantContains(t, "restore into a non-empty dir", c.fails(exitError, "restore", file, "--data", busy).stderr, "not empty")

	dir := filepath.Join(t.TempDir(), "restored")
	res := c.jsonOK("restore", file, "--data", dir)
	if got, want := uint64(res["last_token"].(float64)), uint64(out["last_token"].(float64))+fencekv.DefaultTokenGap; got != want {
		t.Fatalf("restored last token %d; want the backup's plus the gap, %d", got, want)
	}
	restored := startServer(t, dir)
	rc := restored.shell(t)
	cl, err := wire.Dial(context.Background(), restored.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for w := range writers {
		for i := 0; i <= acked[w]; i++ {
			e, err := cl.Get(context.Background(), []byte(fmt.Sprintf("w%d/%06d", w, i)))
			if err != nil || !e.Found || string(e.Value) != strconv.Itoa(i) {
				t.Fatalf("write w%d/%06d, acknowledged before the backup: %+v, %v", w, i, e, err)
			}
		}
	}
	// A lock of its own: "jobs" may have been held when the backup was
	// taken, and then it is held in the restored store too (G7).
	next := parseToken(t, rc.ok("lock", "acquire", "after-restore", "--ttl", "10s"))
	if next <= uint64(lastIssued) {
		t.Fatalf("the restored server issued token %d; the old one had issued up to %d", next, lastIssued)
	}
	t.Logf("backup at token %v (%v bytes); old server issued up to %d; restored server's first token %d",
		out["last_token"], out["size"], lastIssued, next)
}
