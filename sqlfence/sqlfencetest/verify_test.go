package sqlfencetest

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
)

var (
	verifyOnce sync.Once
	verifyBin  string
	verifyErr  error
	removeBin  = func() {}
)

// verifySQL builds fencekv-verify-sql once per test binary.
func verifySQL(t *testing.T) string {
	t.Helper()
	verifyOnce.Do(func() {
		verifyBin, removeBin, verifyErr = fencekvtest.Build("./cmd/fencekv-verify-sql", "fencekv-verify-sql")
	})
	if verifyErr != nil {
		t.Fatal(verifyErr)
	}
	return verifyBin
}

// TestVerifySQL runs fencekv-verify-sql, as a user would, against a real
// fencekv server and each database: every paused client's write, sent
// with its old token after a newer holder wrote, must be refused by the
// database, and the counters must equal the acknowledged updates.
func TestVerifySQL(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			var dsn string
			if b.d == pgBackend.d {
				_, dsn = pgDB(t)
			} else {
				dsn = "sqlite:" + filepath.Join(t.TempDir(), "verify.db")
			}
			opts := fencekv.DefaultOptions()
			opts.NoSync = true
			addr, _ := fencekvtest.Serve(t, &opts)
			const rounds = 4
			var out, errs bytes.Buffer
			cmd := exec.Command(verifySQL(t), "--addr", addr, "--sql", dsn,
				"--rounds", fmt.Sprint(rounds), "--ttl", "400ms", "--clients", "2", "--updates", "16")
			cmd.Stdout, cmd.Stderr = &out, &errs
			if err := cmd.Run(); err != nil {
				t.Fatalf("fencekv-verify-sql: %v\n%s\n%s", err, out.String(), errs.String())
			}
			for _, want := range []string{
				"target: " + b.name + " database",
				fmt.Sprintf("stale-token writes after a newer holder wrote: %d refused, 0 accepted", rounds),
				"PASS: no stale write was accepted",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// TestVerifySQLBadArguments: a DSN it cannot use is a usage error (2).
func TestVerifySQLBadArguments(t *testing.T) {
	for _, args := range [][]string{{}, {"--sql", "mysql://x"}, {"--sql", "sqlite:/x", "--clients", "0"}} {
		cmd := exec.Command(verifySQL(t), args...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("fencekv-verify-sql %q: %v (%s); want exit status 2", args, err, out)
		}
	}
}
