package diskfault_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/diskfault"
)

// Power loss, not only kill -9: a process killed with SIGKILL leaves the
// page cache, so every write it made, synced or not, is still in its
// files. The recorder (FENCEKV_POWERLOSS_DIR, package doc) keeps what the
// fsyncs made durable; diskfault.PowerCut rebuilds the files from it after
// the kill; the tests restart on what a power cut would have left.

// singleLoad runs two writers on the single node at addr, each putting its
// own keys and taking its own locks, until stop is closed.
func singleLoad(t *testing.T, addr string, h *history, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for wi := range 2 {
		cl := mustDial(t, addr)
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%05d", wi, i), fmt.Sprintf("v%d", i)
				cx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				_, err := cl.Put(cx, []byte(k), []byte(v), fencekv.WriteOptions{})
				if err == nil {
					h.mu.Lock()
					h.acked[k] = v
					h.mu.Unlock()
				}
				name := fmt.Sprintf("lock-w%d-%05d", wi, i)
				l, err := cl.Acquire(cx, name, 10*time.Minute, nil)
				cancel()
				if err == nil {
					h.mu.Lock()
					if prev, ok := h.tokens[l.Token]; ok {
						h.dupes = append(h.dupes, fmt.Sprintf("token %d granted for %s and %s", l.Token, prev, name))
					}
					h.tokens[l.Token] = name
					h.mu.Unlock()
				}
				if err != nil {
					return // the server was killed (or stalls): this writer is done
				}
			}
		})
	}
	return &wg
}

func newHistory() *history {
	return &history{acked: map[string]string{}, tokens: map[fencekv.Token]string{}}
}

func (h *history) counts() (int, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.acked), len(h.tokens)
}

// checkSingle reads every acknowledged write and grant back through cl,
// and takes a lock: its token must be above every one granted.
func (h *history) checkSingle(t *testing.T, addr string) {
	t.Helper()
	cl := mustDial(t, addr)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.dupes {
		t.Error(d)
	}
	lost := 0
	for k, v := range h.acked {
		e, err := cl.Get(ctx(t), []byte(k))
		if err != nil || string(e.Value) != v {
			if lost++; lost <= 5 {
				t.Errorf("acknowledged %s=%s reads %q, %v", k, v, e.Value, err)
			}
		}
	}
	var top fencekv.Token
	for tok, name := range h.tokens {
		top = max(top, tok)
		in, err := cl.LockInfo(ctx(t), name)
		if err != nil || in.Token != tok {
			if lost++; lost <= 10 {
				t.Errorf("lock %s was granted with token %d; it reads %+v, %v", name, tok, in, err)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d acknowledged writes and grants lost", lost)
	}
	l, err := cl.Acquire(ctx(t), "after-the-power-cut", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= top {
		t.Errorf("after the power cut, token %d was issued; %d was granted before", l.Token, top)
	}
	t.Logf("history: %d writes and %d grants acknowledged, %d of them lost; the next token is %d (top granted %d)", len(h.acked), len(h.tokens), lost, l.Token, top)
	if len(h.acked) == 0 || len(h.tokens) == 0 {
		t.Errorf("the history is empty: %d writes, %d grants acknowledged", len(h.acked), len(h.tokens))
	}
}

// checkReport is what the tests read of `fencekv check --json`.
type checkReport struct {
	OK   bool `json:"ok"`
	Data struct {
		Applied uint64 `json:"applied"`
	} `json:"data_file"`
	Log struct {
		OK      bool   `json:"ok"`
		Records int    `json:"records"`
		Torn    bool   `json:"torn"`
		End     string `json:"end"`
		Error   string `json:"error"`
		Offset  *int64 `json:"corrupt_offset"`
	} `json:"log"`
	RaftLog *struct { // a cluster node's
		OK      bool   `json:"ok"`
		Entries uint64 `json:"entries"`
		Last    uint64 `json:"last"`
		Torn    bool   `json:"torn"`
		Error   string `json:"error"`
	} `json:"raft_log"`
}

// fencekvCheck runs `fencekv check --json` on dir: its report and exit
// status.
func fencekvCheck(t *testing.T, bin, dir string) (checkReport, int, string) {
	t.Helper()
	out, err := exec.Command(bin, "check", "--data", dir, "--json").Output()
	status := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		status = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var r checkReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("fencekv check --json: %v: %s", err, out)
	}
	return r, status, string(out)
}

// runToCut starts a single node recording for power loss on dir, puts it
// under load until checkpoints have come and gone, stalls the fsync of
// its next log append (so that one write is in the page cache, unsynced,
// unacknowledged), and kills it.
func runToCut(t *testing.T, s *single, rec string, h *history) {
	t.Helper()
	s.start()
	stop := make(chan struct{})
	wg := singleLoad(t, s.addr, h, stop)
	journal := filepath.Join(rec, "journal")
	waitFor(t, 20*time.Second, "load and checkpoints", func() error {
		b, _ := os.ReadFile(journal)
		ckpts := strings.Count(string(b), "\nd ")
		if w, g := h.counts(); w < 100 || g < 100 || ckpts < 3 {
			return fmt.Errorf("%d writes, %d grants acknowledged, %d data file commits recorded", w, g, ckpts)
		}
		return nil
	})
	arm(t, s.fp, "wal.sync=stall:1m@1")
	waitLog(t, s.log.String, "wal.sync hit 1: stalling")
	s.kill()
	close(stop)
	wg.Wait()
}

// TestPowerLossSingle: a single node under puts and lock grants, cut off
// at once (SIGKILL, then every file rebuilt as a power cut leaves it: the
// logs as their fsyncs left them, the data file as its last commit),
// with one log append written but not synced: dropped (clean), kept whole
// (partial) or half written (torn). Before the restart `fencekv check`
// says the dir is sound, and that its log ends torn exactly in the torn
// mode; the server starts (dropping the torn append, with a warning);
// every acknowledged write and grant is there, and the next grant's token
// is above every one granted.
func TestPowerLossSingle(t *testing.T) {
	for _, mode := range []diskfault.Mode{diskfault.Clean, diskfault.Partial, diskfault.Torn} {
		t.Run(string(mode), func(t *testing.T) {
			dir, rec := t.TempDir(), t.TempDir()
			s := newSingle(t, dir)
			s.env = []string{diskfault.PowerLossEnv + "=" + rec}
			h := newHistory()
			runToCut(t, s, rec, h)

			cut, err := diskfault.PowerCut(dir, rec, mode)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(cut)
			if cut.Unsynced() == 0 {
				t.Fatalf("the kill left no unsynced write to lose")
			}
			if want := map[diskfault.Mode]int{diskfault.Torn: 1}[mode]; cut.Torn() != want {
				t.Fatalf("%d logs torn, want %d", cut.Torn(), want)
			}
			r, status, out := fencekvCheck(t, s.bin, dir)
			if status != 0 || !r.OK || r.Log.Torn != (mode == diskfault.Torn) {
				t.Errorf("fencekv check after a %s power cut: exit %d: %s\nwant exit 0, torn %v", mode, status, out, mode == diskfault.Torn)
			}
			t.Logf("fencekv check: %d records after the checkpoint, torn %v, end: %s", r.Log.Records, r.Log.Torn, r.Log.End)

			arm(t, s.fp, "")
			s.start()
			if torn := strings.Contains(s.log.String(), "dropped it as a torn append"); torn != (mode == diskfault.Torn) {
				t.Errorf("the restart's log says it dropped a torn append: %v, want %v:\n%s", torn, mode == diskfault.Torn, s.log)
			}
			h.checkSingle(t, s.addr)
		})
	}
}

// TestPowerLossCorrupt: after a clean power cut, a byte of a synced log
// record flips (a record with good ones after it, so not a torn last
// append): `fencekv check` reports corruption at that record's offset
// (exit 7), and the server refuses to start rather than lose the records
// after it.
func TestPowerLossCorrupt(t *testing.T) {
	var dir string
	var s *single
	var r checkReport
	// The log holds the records since the last checkpoint (200ms); a
	// kill just after one can leave fewer than the two this needs: go
	// again, on a new dir.
	for attempt := 1; ; attempt++ {
		dir = t.TempDir()
		rec := t.TempDir()
		s = newSingle(t, dir)
		s.env = []string{diskfault.PowerLossEnv + "=" + rec}
		runToCut(t, s, rec, newHistory())
		if _, err := diskfault.PowerCut(dir, rec, diskfault.Clean); err != nil {
			t.Fatal(err)
		}
		var status int
		var out string
		r, status, out = fencekvCheck(t, s.bin, dir)
		if status != 0 || !r.OK || r.Log.Torn {
			t.Fatalf("fencekv check after a clean power cut: exit %d: %s", status, out)
		}
		if r.Log.Records >= 2 {
			break
		}
		if attempt == 5 {
			t.Fatalf("5 runs left fewer than 2 log records after the checkpoint")
		}
	}
	// Records after a checkpoint start at offset 0: flip a byte in the
	// first one's payload.
	logPath := filepath.Join(dir, fencekv.LogFile)
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	b[20] ^= 0x40
	if err := os.WriteFile(logPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r, status, out := fencekvCheck(t, s.bin, dir)
	if status != 7 || r.OK || r.Log.OK || r.Log.Offset == nil || *r.Log.Offset != 0 || !strings.Contains(r.Log.Error, "not a torn last write") {
		t.Errorf("fencekv check after a flipped byte in a synced record: exit %d: %s\nwant exit 7, the log corrupt at offset 0", status, out)
	}
	cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	serve, err := exec.CommandContext(cx, s.bin, "serve", "--data", dir, "--listen", s.addr, "--http", "").CombinedOutput()
	if err == nil || !strings.Contains(string(serve), "is corrupt at offset 0") {
		t.Errorf("serve on a corrupt log: %v\n%s\nwant it to refuse, naming the corruption", err, serve)
	}
}
