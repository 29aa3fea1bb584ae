//go:build failpoints

package diskfault

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// Enabled reports whether this is a build with failpoints (-tags
// failpoints).
const Enabled = true

var (
	mu    sync.Mutex
	rules map[string]*armed
	file  string    // FENCEKV_FAILPOINTS_FILE
	fsize int64     // the file's size when last read
	fmod  time.Time // and its modification time
)

type armed struct {
	Rule
	hits  int
	fired bool
}

func init() {
	rs, err := Parse(os.Getenv("FENCEKV_FAILPOINTS"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "FENCEKV_FAILPOINTS: %v\n", err)
		os.Exit(2)
	}
	rules = arm(rs)
	file = os.Getenv("FENCEKV_FAILPOINTS_FILE")
	if len(rs) > 0 {
		fmt.Fprintf(os.Stderr, "diskfault: armed %q\n", os.Getenv("FENCEKV_FAILPOINTS"))
	}
}

func arm(rs []Rule) map[string]*armed {
	m := map[string]*armed{}
	for _, r := range rs {
		m[r.Point] = &armed{Rule: r}
	}
	return m
}

// reload reads the rules file again if it changed. Called with mu held.
func reload() {
	if file == "" {
		return
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Size() == fsize && fi.ModTime().Equal(fmod) {
		return
	}
	fsize, fmod = fi.Size(), fi.ModTime()
	b, err := os.ReadFile(file)
	if err != nil {
		return
	}
	rs, err := Parse(string(b))
	if err != nil {
		fmt.Fprintf(os.Stderr, "diskfault: %s: %v (rules unchanged)\n", file, err)
		return
	}
	rules = arm(rs)
	fmt.Fprintf(os.Stderr, "diskfault: armed %q from %s\n", b, file)
}

// Hit is the failpoint point: it returns the error a rule injects there
// (the caller must then not do the write or the fsync), after sleeping
// for a stall rule, or nil.
func Hit(point string) error {
	mu.Lock()
	reload()
	a := rules[point]
	if a == nil {
		mu.Unlock()
		return nil
	}
	a.hits++
	n := a.hits
	if !a.Fires(n) {
		if a.fired && a.Errno != 0 {
			fmt.Fprintf(os.Stderr, "diskfault: %s hit %d, after the fault\n", point, n)
		}
		mu.Unlock()
		return nil
	}
	a.fired = true
	r := a.Rule
	mu.Unlock()
	if r.Stall > 0 {
		fmt.Fprintf(os.Stderr, "diskfault: %s hit %d: stalling %v\n", point, n, r.Stall)
		time.Sleep(r.Stall)
		fmt.Fprintf(os.Stderr, "diskfault: %s hit %d: stall over\n", point, n)
		return nil
	}
	fmt.Fprintf(os.Stderr, "diskfault: %s hit %d: injected %s\n", point, n, errName(r.Errno))
	return &os.PathError{Op: point, Path: "(injected by diskfault)", Err: r.Errno}
}
