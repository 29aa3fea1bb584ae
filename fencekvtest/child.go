package fencekvtest

import (
	"bytes"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
)

// childEnv is set in the environment of a process that Child starts, to
// the name of the test it runs.
const childEnv = "FENCEKVTEST_CHILD"

// Child returns a command that runs this test binary again, as a child
// process that runs only the test named test: a top-level test whose body
// begins with AsChild, which skips it in any other process. args are
// handed to the child (AsChild returns them) and env is added to its
// environment. The caller starts the command, and must end it (by its PID)
// and wait for it.
//
//	cmd := fencekvtest.Child("TestHelperServer", nil, "DIR="+dir)
//	...
//	func TestHelperServer(t *testing.T) {
//		fencekvtest.AsChild(t)
//		serve(os.Getenv("DIR"))
//	}
func Child(test string, args []string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^" + test + "$", "-test.count=1", "-test.timeout=2m", "--"}, args...)...)
	cmd.Env = append(os.Environ(), append([]string{childEnv + "=" + test}, env...)...)
	return cmd
}

// AsChild skips the test unless this process is a child that Child started
// to run it, and returns the args Child was given.
func AsChild(t testing.TB) []string {
	t.Helper()
	if os.Getenv(childEnv) != t.Name() {
		t.Skip("the body of a child process of another test; runs only there")
	}
	if i := slices.Index(os.Args, "--"); i >= 0 {
		return os.Args[i+1:]
	}
	return nil
}

// Buffer collects a child process's output (as its cmd.Stdout or
// cmd.Stderr) for the test to read while the process still writes: a
// bytes.Buffer that is safe for concurrent use. The zero value is empty
// and ready.
type Buffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
