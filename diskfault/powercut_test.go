package diskfault_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencekv/fencekv/diskfault"
	"github.com/fencekv/fencekv/wal"
)

// TestPowerCutRebuild: PowerCut on a journal written by hand (as the
// recorder writes it). A log with record 1 synced and one unsynced write
// of records 2 and 3 comes back as record 1 alone (clean), all three
// (partial: the one write, whole), or 1 and 2 with 3 torn (torn: cut in
// the middle of the write's last record, which wal.Read calls torn); the
// data file comes back as its image; a file of another dir, or one
// removed since, is left alone.
func TestPowerCutRebuild(t *testing.T) {
	for _, mode := range []diskfault.Mode{diskfault.Clean, diskfault.Partial, diskfault.Torn} {
		t.Run(string(mode), func(t *testing.T) {
			dir, rec := t.TempDir(), t.TempDir()
			logPath := filepath.Join(dir, "x.wal")
			l, _, _, err := wal.Open(logPath, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Append(1, []byte("one")); err != nil {
				t.Fatal(err)
			}
			synced := l.Size()
			// Two records as long as each other: half the write is where
			// the second starts.
			if err := l.Append(2, []byte("two, unsynced"), []byte("three, unsync")); err != nil {
				t.Fatal(err)
			}
			l.Close()
			left, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			left = left[:l.Size()] // the records, without the zeros preallocated after them
			dataPath := filepath.Join(dir, "x.db")
			other := filepath.Join(t.TempDir(), "other.wal")
			for path, b := range map[string]string{dataPath: "the data file as the kill left it", other: "another dir's"} {
				if err := os.WriteFile(path, []byte(b), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for sub, files := range map[string]map[string]string{
				"logs": {"x.wal-1": string(left[:synced]), "o-1": "", "gone-1": ""},
				"data": {"x.db-1": "the image"},
			} {
				os.MkdirAll(filepath.Join(rec, sub), 0o700)
				for name, b := range files {
					if err := os.WriteFile(filepath.Join(rec, sub, name), []byte(b), 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			journal := strings.Join([]string{
				fmt.Sprintf("o x.wal-1 %q", logPath),
				fmt.Sprintf("w 0 %d %q", synced, logPath),
				fmt.Sprintf("s %q", logPath),
				fmt.Sprintf("w %d %d %q", synced, int64(len(left))-synced, logPath),
				fmt.Sprintf("d x.db-1 %q", dataPath),
				fmt.Sprintf("o o-1 %q", other),
				fmt.Sprintf("o gone-1 %q", filepath.Join(dir, "gone.wal")),
				`w 12 3 "cut short by the ki`,
			}, "\n")
			if err := os.WriteFile(filepath.Join(rec, "journal"), []byte(journal), 0o600); err != nil {
				t.Fatal(err)
			}

			cut, err := diskfault.PowerCut(dir, rec, mode)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(cut)
			if len(cut.Files) != 2 || cut.Unsynced() != 1 {
				t.Errorf("the cut: %v; want the log (1 unsynced write) and the data file", cut)
			}
			recs, tail, err := wal.Read(logPath, 0)
			if err != nil {
				t.Fatal(err)
			}
			want := map[diskfault.Mode]int{diskfault.Clean: 1, diskfault.Partial: 3, diskfault.Torn: 2}[mode]
			if len(recs) != want || tail.Torn != (mode == diskfault.Torn) {
				t.Errorf("the rebuilt log: %d records, torn %v (%s); want %d, torn %v", len(recs), tail.Torn, tail.Reason, want, mode == diskfault.Torn)
			}
			if b, _ := os.ReadFile(dataPath); string(b) != "the image" {
				t.Errorf("the rebuilt data file: %q, want its image", b)
			}
			if b, _ := os.ReadFile(other); string(b) != "another dir's" {
				t.Errorf("a file of another dir was rebuilt: %q", b)
			}
			if _, err := os.Stat(filepath.Join(dir, "gone.wal")); !os.IsNotExist(err) {
				t.Errorf("a removed log came back: %v", err)
			}
		})
	}
}

// TestPowerCutRefuses: a mode PowerCut does not know, and a dir the
// recorder never wrote, are errors; nothing is changed.
func TestPowerCutRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := diskfault.PowerCut(dir, t.TempDir(), "lightning"); err == nil || !strings.Contains(err.Error(), `no mode "lightning"`) {
		t.Errorf("an unknown mode: %v", err)
	}
	if _, err := diskfault.PowerCut(dir, t.TempDir(), diskfault.Clean); err == nil || !strings.Contains(err.Error(), diskfault.PowerLossEnv) {
		t.Errorf("no journal: %v", err)
	}
	rec := t.TempDir()
	os.WriteFile(filepath.Join(rec, "journal"), []byte(`x 1 2 3 "/a"`+"\n"), 0o600)
	if _, err := diskfault.PowerCut(dir, rec, diskfault.Clean); err == nil || !bytes.Contains([]byte(err.Error()), []byte("line 1")) {
		t.Errorf("a malformed journal line: %v", err)
	}
}
