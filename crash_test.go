//go:build unix

package fencekv_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

// The crash test runs the engine in a child process (this test binary,
// re-executed with -test.run=^TestCrashChild$), reads the acknowledgements
// the child prints, kills it with SIGKILL after a random number of them,
// reopens the data dir and checks that nothing acknowledged was lost (G6)
// and that the token sequence never went back (G1). The same data dir is
// used for every round, so the checks also cover several crashes in a row.
//
// SIGKILL kills the process, not the machine: data written to the kernel
// survives it even without fsync. So this test proves that a call returns
// only after its commit reached the file, not that the commit was synced.

const (
	crashEnvDir   = "FENCEKV_CRASH_DIR"   // child mode: the data dir
	crashEnvRound = "FENCEKV_CRASH_ROUND" // child mode: the round, to name its locks

	crashAck      = "ack:" // prefix of the child's acknowledgement lines
	crashWriters  = 6      // goroutines writing their own keys under shared locks
	crashSharedLk = 3      // locks the writers share
	crashGranters = 2      // goroutines only acquiring and releasing their own lock
	crashTTL      = 30 * time.Second
)

// crashWriterKeys are the keys of writer w. Each key is written by that
// writer only, one write at a time, so the parent knows every value it can
// hold: the last acknowledged one, or the one after it if that write was in
// flight at the kill.
func crashWriterKeys(w int) (puts []string, counter string) {
	p := fmt.Sprintf("crash/w%d/", w)
	return []string{p + "a", p + "b"}, p + "n"
}

// crashValue is the value of the seq-th put to a key, by a holder of token.
func crashValue(seq int64, token fencekv.Token) []byte {
	return fmt.Appendf(nil, "%d tok=%d %s", seq, token, strings.Repeat("x", 64))
}

// crashSeq parses the sequence number out of a value written by crashValue.
func crashSeq(v []byte) (int64, error) {
	f, _, _ := bytes.Cut(v, []byte(" "))
	return strconv.ParseInt(string(f), 10, 64)
}

// TestCrashChild is the child side of TestCrash; it is skipped unless
// TestCrash started it (fencekvtest.Child). It streams grants and fenced
// writes until it is killed, printing one line per acknowledged call.
func TestCrashChild(t *testing.T) {
	fencekvtest.AsChild(t)
	dir := os.Getenv(crashEnvDir)
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "crash child: "+format+"\n", args...)
		os.Exit(3)
	}
	// An orphaned child (parent gone) must not run on: stdin closes then.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(4)
	}()
	round := os.Getenv(crashEnvRound)
	// Odd rounds never checkpoint: everything they acknowledge lives only
	// in the write-ahead log when they are killed, and must be replayed.
	// Even rounds checkpoint often, so kills also land mid-checkpoint.
	o := fencekv.DefaultOptions()
	if n, _ := strconv.Atoi(round); n%2 == 1 {
		o.CheckpointEvery = time.Hour
	} else {
		o.CheckpointEvery = 5 * time.Millisecond
	}
	db, err := fencekv.Open(dir, &o)
	if err != nil {
		fail("open: %v", err)
	}
	// ack prints one line in one write: a pipe write under PIPE_BUF is
	// atomic, so a kill never leaves half a line.
	ack := func(format string, args ...any) {
		line := fmt.Appendf([]byte(crashAck), format+"\n", args...)
		if _, err := os.Stdout.Write(line); err != nil {
			fail("stdout: %v", err)
		}
	}
	ctx := context.Background()

	writer := func(w int) {
		lock := fmt.Sprintf("crash/r%s/shared%d", round, w%crashSharedLk)
		puts, counter := crashWriterKeys(w)
		seq := make(map[string]int64)
		for _, k := range puts {
			e, err := db.Get(ctx, []byte(k))
			if err != nil {
				fail("get %s: %v", k, err)
			}
			if e.Found {
				if seq[k], err = crashSeq(e.Value); err != nil {
					fail("get %s: %v", k, err)
				}
			}
		}
		for i := 0; ; i++ {
			l, err := db.Acquire(ctx, lock, crashTTL, &fencekv.AcquireOptions{Holder: fmt.Sprint("w", w), Wait: 20 * time.Second})
			if errors.Is(err, fencekv.ErrLockHeld) {
				continue
			}
			if err != nil {
				fail("w%d acquire %s: %v", w, lock, err)
			}
			ack("grant %s %d", lock, l.Token)
			for j := range 1 + (i+w)%3 {
				k := puts[(i+j)%len(puts)]
				// The first write under a new grant is strict: the new token
				// must be above every fence, also after a crash (G1).
				o := fencekv.WriteOptions{Token: l.Token, Strict: j == 0}
				if (i+j)%2 == 1 {
					o.Lock = lock // a held write (G4)
				}
				res, err := db.Put(ctx, []byte(k), crashValue(seq[k]+1, l.Token), o)
				if err != nil {
					fail("w%d put %s with %+v: %v", w, k, o, err)
				}
				seq[k]++
				ack("put %s %d %d %d", k, l.Token, seq[k], res.Revision)
			}
			n, res, err := db.Incr(ctx, []byte(counter), 1, fencekv.WriteOptions{Token: l.Token})
			if err != nil {
				fail("w%d incr %s: %v", w, counter, err)
			}
			ack("incr %s %d %d %d", counter, l.Token, n, res.Revision)
			if err := db.Release(ctx, lock, l.Token); err != nil {
				fail("w%d release %s: %v", w, lock, err)
			}
		}
	}
	granter := func(g int) {
		lock := fmt.Sprintf("crash/r%s/own%d", round, g)
		for {
			l, err := db.Acquire(ctx, lock, crashTTL, nil)
			if err != nil {
				fail("g%d acquire %s: %v", g, lock, err)
			}
			ack("grant %s %d", lock, l.Token)
			if err := db.Release(ctx, lock, l.Token); err != nil {
				fail("g%d release %s: %v", g, lock, err)
			}
		}
	}
	for w := range crashWriters {
		go writer(w)
	}
	for g := range crashGranters {
		go granter(g)
	}
	select {} // until killed; -test.timeout ends a child nobody kills
}

// crashKey is what the parent knows of a key from the acknowledgements.
type crashKey struct {
	val   int64            // last acknowledged sequence number (put) or value (incr)
	token fencekv.Token    // a lower bound of the key's fence
	rev   fencekv.Revision // revision of the last acknowledged write; 0 if none since the last check
}

// crashModel is the parent's record of every acknowledgement, over all
// rounds.
type crashModel struct {
	keys     map[string]*crashKey
	grants   map[fencekv.Token]string // token -> lock, to catch a token issued twice
	lastLock map[string]fencekv.Token // per lock, the last token granted
	floor    fencekv.Token            // every later grant must be above this
	maxToken fencekv.Token
	maxRev   fencekv.Revision
	acks     int
}

func newCrashModel() *crashModel {
	return &crashModel{
		keys:     make(map[string]*crashKey),
		grants:   make(map[fencekv.Token]string),
		lastLock: make(map[string]fencekv.Token),
	}
}

func (m *crashModel) key(k string) *crashKey {
	if m.keys[k] == nil {
		m.keys[k] = &crashKey{}
	}
	return m.keys[k]
}

// ack checks one acknowledgement line against the model and records it.
func (m *crashModel) ack(line string) error {
	f := strings.Fields(strings.TrimPrefix(line, crashAck))
	num := func(i int) uint64 {
		if i >= len(f) {
			return 0
		}
		n, _ := strconv.ParseUint(f[i], 10, 64)
		return n
	}
	m.acks++
	switch {
	case len(f) == 3 && f[0] == "grant":
		lock, tok := f[1], fencekv.Token(num(2))
		switch {
		case tok <= m.floor:
			return fmt.Errorf("%q: token not above %d, the first token after the last restart", line, m.floor)
		case m.grants[tok] != "":
			return fmt.Errorf("%q: token already granted on %s", line, m.grants[tok])
		case tok <= m.lastLock[lock]:
			return fmt.Errorf("%q: token not above the lock's previous grant %d", line, m.lastLock[lock])
		}
		m.grants[tok], m.lastLock[lock] = lock, tok
		m.maxToken = max(m.maxToken, tok)
	case len(f) == 5 && (f[0] == "put" || f[0] == "incr"):
		k, tok, val, rev := m.key(f[1]), fencekv.Token(num(2)), int64(num(3)), fencekv.Revision(num(4))
		switch {
		case m.grants[tok] == "":
			return fmt.Errorf("%q: written with a token never granted", line)
		case val != k.val+1:
			return fmt.Errorf("%q: want value %d after %d", line, k.val+1, k.val)
		case rev <= k.rev:
			return fmt.Errorf("%q: revision not above the key's previous %d", line, k.rev)
		}
		k.val, k.token, k.rev = val, max(k.token, tok), rev
		m.maxRev = max(m.maxRev, rev)
	default:
		return fmt.Errorf("bad ack line %q", line)
	}
	return nil
}

// check reopens the store after a crash and checks it against every
// acknowledgement. It leaves the model at the state found, the base of the
// next round.
func (m *crashModel) check(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	db, err := fencekv.Open(dir, nil)
	if err != nil {
		t.Fatalf("reopen after kill: %v", err)
	}
	defer db.Close()
	st, err := db.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.LastToken < m.maxToken {
		t.Errorf("after kill: last token %d, below acknowledged grant %d", st.LastToken, m.maxToken)
	}
	if st.Revision < m.maxRev {
		t.Errorf("after kill: revision %d, below acknowledged write's %d", st.Revision, m.maxRev)
	}
	for name, k := range m.keys {
		e, err := db.Get(ctx, []byte(name))
		if err != nil {
			t.Fatal(err)
		}
		if !e.Found {
			t.Errorf("after kill: %s is missing; acknowledged value %d", name, k.val)
			continue
		}
		val, err := strconv.ParseInt(string(e.Value), 10, 64)
		if !strings.HasSuffix(name, "/n") {
			val, err = crashSeq(e.Value)
		}
		switch {
		case err != nil:
			t.Errorf("after kill: %s = %.20q: %v", name, e.Value, err)
			continue
		case val != k.val && val != k.val+1:
			// k.val+1 is the one write that may have been in flight.
			t.Errorf("after kill: %s holds %d; acknowledged %d", name, val, k.val)
		case e.Fence < k.token || e.Fence > st.LastToken:
			t.Errorf("after kill: %s fence %d; want %d..%d (acknowledged token..last token)", name, e.Fence, k.token, st.LastToken)
		case val == k.val && k.rev != 0 && e.Revision != k.rev:
			t.Errorf("after kill: %s at revision %d; acknowledged write made %d", name, e.Revision, k.rev)
		case val == k.val+1 && e.Revision <= k.rev:
			t.Errorf("after kill: %s at revision %d after a later write; acknowledged write made %d", name, e.Revision, k.rev)
		}
		k.val, k.token, k.rev = val, e.Fence, 0
		// The fence survived the crash: a token below it is refused.
		if e.Fence > 1 {
			_, err := db.Put(ctx, []byte(name), []byte("stale"), fencekv.WriteOptions{Token: e.Fence - 1})
			if !errors.Is(err, fencekv.ErrStaleToken) {
				t.Errorf("after kill: put %s with token %d under fence %d = %v; want stale_token", name, e.Fence-1, e.Fence, err)
			}
		}
	}
	// A new grant is above every token ever issued (G1).
	probe := fmt.Sprintf("crash/probe%d", len(m.grants))
	l, err := db.Acquire(ctx, probe, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= st.LastToken || l.Token <= m.maxToken {
		t.Errorf("after kill: new grant %d; want above last token %d and acknowledged %d", l.Token, st.LastToken, m.maxToken)
	}
	if err := db.Release(ctx, probe, l.Token); err != nil {
		t.Fatal(err)
	}
	m.floor, m.maxToken = l.Token, l.Token
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// crashRound runs the child on dir, kills it after killAt acknowledgements
// and feeds every acknowledgement it printed to m.
func crashRound(t *testing.T, dir string, round, killAt int, m *crashModel) {
	t.Helper()
	cmd := fencekvtest.Child("TestCrashChild", nil, crashEnvDir+"="+dir, crashEnvRound+"="+strconv.Itoa(round))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	var once sync.Once
	kill := func() {
		once.Do(func() {
			killed = cmd.Process.Signal(syscall.SIGKILL) == nil
		})
	}
	defer kill()
	sc := bufio.NewScanner(stdout)
	acks, bad := 0, error(nil)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, crashAck) {
			continue // the test framework's own output
		}
		if bad == nil {
			bad = m.ack(line)
		}
		if acks++; acks == killAt || bad != nil {
			kill()
		}
	}
	// Lines read after the kill were printed before it: acknowledged too.
	err = cmd.Wait()
	if !killed {
		t.Fatalf("round %d: child ended by itself after %d acks (%v); stderr:\n%s", round, acks, err, stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("round %d: child wait = %v, want killed by SIGKILL; stderr:\n%s", round, err, stderr.String())
	}
	if bad != nil {
		t.Fatalf("round %d: %v", round, bad)
	}
	t.Logf("round %d: killed after %d acks, read %d", round, killAt, acks)
}

// TestCrash kills a process streaming grants and fenced writes at random
// moments and checks that every acknowledged grant and write survived.
func TestCrash(t *testing.T) {
	// Rounds take well under a second where fsync is fast; a slow disk
	// ends the test after the budget, but never before minRounds.
	rounds, minRounds, budget := 25, 5, 10*time.Second
	if testing.Short() {
		rounds = 5
	}
	dir := t.TempDir()
	m := newCrashModel()
	start := time.Now()
	round := 0
	for ; round < rounds && (round < minRounds || time.Since(start) < budget); round++ {
		killAt := 50 + rand.IntN(451)
		crashRound(t, dir, round, killAt, m)
		m.check(t, dir)
		if t.Failed() {
			t.Fatalf("round %d failed (killed after %d acks)", round, killAt)
		}
	}
	if len(m.keys) != crashWriters*3 {
		t.Errorf("acknowledged writes to %d keys; want all %d written", len(m.keys), crashWriters*3)
	}
	t.Logf("%d rounds, %d acks, %d grants in %v", round, m.acks, len(m.grants), time.Since(start).Round(time.Millisecond))
}
