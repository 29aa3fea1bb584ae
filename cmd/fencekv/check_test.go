package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wal"
)

// runCheck runs 'fencekv check' in process.
func runCheck(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append([]string{"check"}, args...)
	code := run(append([]string{"fencekv"}, args...), strings.NewReader(""), &out, &errOut)
	return result{args: args, stdout: out.String(), stderr: errOut.String(), code: code}
}

// newDataDir makes a data dir with n keys through the engine, and closes
// it (which checkpoints the log into the data file).
func newDataDir(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	o := fencekv.DefaultOptions()
	o.NoSync = true
	db, err := fencekv.Open(dir, &o)
	if err != nil {
		t.Fatal(err)
	}
	val := bytes.Repeat([]byte("v"), 100)
	for i := range n {
		if _, err := db.Put(context.Background(), fmt.Appendf(nil, "key/%05d", i), val, fencekv.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// snapshot is the names, sizes and contents of a dir's files, its
// subdirectories' included.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, _ := e.Info()
		fmt.Fprintf(&b, "%s %d %x %v\n", path, len(data), sha256.Sum256(data), info.ModTime())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// checkDirCode runs check on dir, wants exit code and an unchanged dir, and
// returns the text report and the JSON one.
func checkDirCode(t *testing.T, dir string, code int) (string, map[string]any) {
	t.Helper()
	before := snapshot(t, dir)
	r := runCheck(t, "--data", dir)
	if r.code != code {
		t.Fatalf("want exit %d, got %v", code, r)
	}
	j := runCheck(t, "--data", dir, "--json")
	if j.code != code {
		t.Fatalf("want exit %d, got %v", code, j)
	}
	if after := snapshot(t, dir); after != before {
		t.Fatalf("check changed the dir:\nbefore %s\nafter  %s", before, after)
	}
	return r.stdout, decodeJSON(t, j.stdout)
}

// appendRecords appends payloads to the log at path and returns where its
// records end (the file goes on with zeros preallocated after them).
func appendRecords(t *testing.T, path string, after uint64, payloads ...string) int64 {
	t.Helper()
	l, _, _, err := wal.Open(path, after)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range payloads {
		if err := l.Append(after+1+uint64(i), []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return l.Size()
}

// TestCheckLog: a sound dir; then log records after the checkpoint, a torn
// last one (still sound), and a damaged first one (corrupt: exit 7, with
// the offset).
func TestCheckLog(t *testing.T) {
	dir := newDataDir(t, 20)
	out, j := checkDirCode(t, dir, 0)
	wantContains(t, "report", out, "no records after the checkpoint")
	wantContains(t, "report", out, "OK\n")
	wantFields(t, j, map[string]any{"ok": true})
	data := j["data_file"].(map[string]any)
	wantFields(t, data, map[string]any{"ok": true, "live_keys": 20, "key_records": 20, "revision": 20})
	applied := uint64(data["applied"].(float64))
	if applied == 0 {
		t.Fatalf("applied = 0 after 20 puts: %v", data)
	}

	logPath := filepath.Join(dir, fencekv.LogFile)
	appendRecords(t, logPath, applied, "first record", "second record")
	out, j = checkDirCode(t, dir, 0)
	wantContains(t, "report", out, fmt.Sprintf("2 records after the checkpoint (%d to %d)", applied+1, applied+2))
	wantContains(t, "report", out, "a clean end at offset 57 (after it: ")
	wantFields(t, j["log"].(map[string]any), map[string]any{"ok": true, "records": 2, "torn": false, "end_offset": 57})

	// The last record's payload damaged: a torn tail, not damage.
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	b[44] ^= 0xff
	os.WriteFile(logPath, b, 0o600)
	out, j = checkDirCode(t, dir, 0)
	wantContains(t, "report", out, "1 records after the checkpoint")
	wantContains(t, "report", out, "torn last record at offset 28")
	wantFields(t, j["log"].(map[string]any), map[string]any{"ok": true, "records": 1, "torn": true, "end_offset": 28})

	// The first record damaged, with one after it: corrupt.
	b[44] ^= 0xff
	b[20] ^= 0x01
	os.WriteFile(logPath, b, 0o600)
	out, j = checkDirCode(t, dir, exitViolation)
	wantContains(t, "report", out, "CORRUPT: wal: "+logPath+" is corrupt at offset 0")
	wantContains(t, "report", out, "DAMAGED")
	wantFields(t, j, map[string]any{"ok": false})
	wantFields(t, j["log"].(map[string]any), map[string]any{"ok": false, "corrupt_offset": 0})
	wantContains(t, "log error", j["log"].(map[string]any)["error"].(string), logPath)
}

// TestCheckDamagedDataFile: garbage over the second half of the data file
// is found (exit 7), and the log, which starts where the data file says,
// is not checked.
// TestCheckRaftLog: on a cluster node's data dir, check also reads raft's
// log (raft-log/): sound, with a torn last entry (still sound), and with a
// damaged entry that newer ones follow (exit 7).
func TestCheckRaftLog(t *testing.T) {
	dir := newDataDir(t, 5)
	logDir := filepath.Join(dir, "raft-log")
	if err := os.Mkdir(logDir, 0o700); err != nil {
		t.Fatal(err)
	}
	older := filepath.Join(logDir, "00000000000000000001.seg")
	newer := filepath.Join(logDir, "00000000000000000004.seg")
	appendRecords(t, older, 0, "entry one", "entry two", "entry three")
	end := appendRecords(t, newer, 3, "entry four", "entry five")
	out, j := checkDirCode(t, dir, 0)
	wantContains(t, "report", out, "raft log "+logDir+": ok: 2 segments, 5 entries (1 to 5); a clean end")
	wantContains(t, "report", out, "OK\n")
	if rl, _ := j["raft_log"].(map[string]any); rl["ok"] != true || rl["last"] != 5.0 {
		t.Fatalf("JSON raft_log = %v", j["raft_log"])
	}

	if err := os.Truncate(newer, end-3); err != nil {
		t.Fatal(err)
	}
	out, _ = checkDirCode(t, dir, 0)
	wantContains(t, "report", out, "4 entries (1 to 4); a torn last entry")

	f, err := os.OpenFile(older, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("X"), 16+2); err != nil { // the first entry's payload
		t.Fatal(err)
	}
	f.Close()
	out, j = checkDirCode(t, dir, exitViolation)
	wantContains(t, "report", out, "raft log "+logDir+": CORRUPT")
	wantContains(t, "report", out, "DAMAGED")
	if j["ok"] != false {
		t.Fatalf("JSON ok = %v, want false", j["ok"])
	}
}

func TestCheckDamagedDataFile(t *testing.T) {
	dir := newDataDir(t, 1000)
	path := filepath.Join(dir, fencekv.DataFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(b) / 2; i < len(b); i++ {
		b[i] = byte(i * 7)
	}
	os.WriteFile(path, b, 0o600)
	out, j := checkDirCode(t, dir, exitViolation)
	wantContains(t, "report", out, "DAMAGED: kv: data file "+path+" is damaged")
	wantContains(t, "report", out, "not checked")
	wantFields(t, j["data_file"].(map[string]any), map[string]any{"ok": false})
	wantFields(t, j["log"].(map[string]any), map[string]any{"checked": false})
}

// TestCheckInUse: check refuses a dir a server has open, and leaves it
// working.
func TestCheckInUse(t *testing.T) {
	dir := t.TempDir()
	o := fencekv.DefaultOptions()
	o.NoSync = true
	db, err := fencekv.Open(dir, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r := runCheck(t, "--data", dir)
	if r.code != exitError || r.stdout != "" {
		t.Fatalf("want exit %d and no report, got %v", exitError, r)
	}
	wantContains(t, "stderr", r.stderr, "in use by a running fencekv server")
	if _, err := db.Put(context.Background(), []byte("k"), []byte("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatalf("Put after check: %v", err)
	}
}

func TestCheckUsage(t *testing.T) {
	if r := runCheck(t, "--data", t.TempDir(), "extra"); r.code != exitUsage {
		t.Fatalf("want exit %d, got %v", exitUsage, r)
	}
	missing := filepath.Join(t.TempDir(), "none")
	r := runCheck(t, "--data", missing)
	if r.code != exitError {
		t.Fatalf("want exit %d, got %v", exitError, r)
	}
	wantContains(t, "stderr", r.stderr, missing)
	if _, err := os.Stat(missing); err == nil {
		t.Fatal("check created the data dir")
	}
	empty := t.TempDir()
	r = runCheck(t, "--data", empty)
	if r.code != exitError {
		t.Fatalf("want exit %d, got %v", exitError, r)
	}
	wantContains(t, "stderr", r.stderr, "no data file")
	if r := runCheck(t, "--help"); r.code != 0 || !strings.Contains(r.stdout, "Examples:") {
		t.Fatalf("want help with examples, got %v", r)
	}
}
