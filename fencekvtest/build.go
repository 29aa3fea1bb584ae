package fencekvtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Build builds the Go package pkg (as go build names it: "." or
// "../cmd/fencekv") into a new temporary directory, as a binary called
// name, and returns the binary's path and a function that removes the
// directory. It is for tests that run the real binary, once per test
// binary (from TestMain, or on first use): a child that Child started
// should not build.
func Build(pkg, name string) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "fencekvtest-bin-")
	if err != nil {
		return "", nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	bin = filepath.Join(dir, name)
	// go test puts its own GOROOT/bin first on PATH: this is the go that
	// built the tests.
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		remove()
		return "", nil, fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, remove, nil
}
