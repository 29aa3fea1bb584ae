package diskfault

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Points are the failpoints the code calls Hit at; a rule for any other
// name is refused (a typo would otherwise run a test without its fault).
var Points = []string{"wal.write", "wal.sync", "raftlog.write", "raftlog.sync", "data.checkpoint"}

// Rule is one parsed rule: at Point, on hit Nth (and every later one if
// Sticky), return Errno or, if Stall > 0, sleep that long first.
type Rule struct {
	Point  string
	Errno  syscall.Errno // 0 for a stall
	Stall  time.Duration
	Nth    int // 1-based
	Sticky bool
}

// Fires reports whether the rule fires on the hit numbered n (1-based).
func (r Rule) Fires(n int) bool {
	return n == r.Nth || r.Sticky && n > r.Nth
}

// Parse parses rules separated by ';' (see the package doc). Empty input
// is no rules.
func Parse(spec string) ([]Rule, error) {
	var rules []Rule
	seen := map[string]bool{}
	for _, part := range strings.Split(spec, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		point, action, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("diskfault: rule %q: want point=action[@N[+]]", part)
		}
		r := Rule{Point: strings.TrimSpace(point), Nth: 1, Sticky: true}
		if !known(r.Point) {
			return nil, fmt.Errorf("diskfault: rule %q: no failpoint %q (there are %s)", part, r.Point, strings.Join(Points, ", "))
		}
		if seen[r.Point] {
			return nil, fmt.Errorf("diskfault: rule %q: a second rule for %s", part, r.Point)
		}
		seen[r.Point] = true
		if a, at, ok := strings.Cut(action, "@"); ok {
			action = a
			r.Sticky = strings.HasSuffix(at, "+")
			n, err := strconv.Atoi(strings.TrimSuffix(at, "+"))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("diskfault: rule %q: @%s is not a hit number (1 or more, + for every later one too)", part, at)
			}
			r.Nth = n
		}
		switch a := strings.TrimSpace(action); {
		case a == "eio":
			r.Errno = syscall.EIO
		case a == "enospc":
			r.Errno = syscall.ENOSPC
		case strings.HasPrefix(a, "stall:"):
			d, err := time.ParseDuration(strings.TrimPrefix(a, "stall:"))
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("diskfault: rule %q: %q is not a positive duration", part, strings.TrimPrefix(a, "stall:"))
			}
			r.Stall = d
		default:
			return nil, fmt.Errorf("diskfault: rule %q: no action %q (eio, enospc, stall:DURATION)", part, a)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

func known(p string) bool {
	for _, q := range Points {
		if p == q {
			return true
		}
	}
	return false
}

func errName(e syscall.Errno) string {
	switch e {
	case syscall.EIO:
		return "EIO"
	case syscall.ENOSPC:
		return "ENOSPC"
	}
	return e.Error()
}
