package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/urfave/cli/v2"
)

// Semaphores on the command line: --limit N on 'lock acquire' and
// 'run-locked' takes one of N permits of the lock (docs/semaphores.md);
// 'lock info' and 'lock list' show a semaphore's limit and holders.

func limitFlag() cli.Flag {
	return &cli.IntFlag{Name: "limit", Usage: fmt.Sprintf("take one of `N` permits of the lock (a semaphore, 2 to %d): up to N holders at once, each with a token of its own; every acquire of the lock must give the same N while any permit is held (limit_mismatch)", fencekv.MaxPermits)}
}

// semLine is lockLine for a semaphore: its limit, each live permit, the
// queue.
func semLine(in fencekv.LockInfo) string {
	hs := in.Holders()
	s := fmt.Sprintf("%s\t%d of %d permits held", in.Name, len(hs), in.Limit())
	if len(hs) == 0 {
		s = fmt.Sprintf("%s\tfree (a semaphore of %d permits; last token %d)", in.Name, in.Limit(), in.Token)
	}
	if in.Waiters > 0 {
		s += fmt.Sprintf(", %d waiting", in.Waiters)
	}
	var b strings.Builder
	b.WriteString(s)
	for _, h := range hs {
		fmt.Fprintf(&b, "\n\ttoken %d", h.Token)
		if h.TTL > 0 {
			fmt.Fprintf(&b, " for %v", h.TTL.Round(time.Millisecond))
		} else {
			b.WriteString(", whose lease has just run out")
		}
		if h.Holder != "" {
			fmt.Fprintf(&b, " (holder %q)", h.Holder)
		}
	}
	return b.String()
}

// semJSON adds a semaphore's "limit" and "holders" to its lockJSON map.
func semJSON(m map[string]any, in fencekv.LockInfo) map[string]any {
	if in.Sem == nil {
		return m
	}
	hs := make([]map[string]any, 0, len(in.Sem.Holders))
	for _, h := range in.Sem.Holders {
		hs = append(hs, setText(map[string]any{"token": h.Token, "ttl_ms": h.TTL.Milliseconds()}, "holder", []byte(h.Holder)))
	}
	m["limit"], m["holders"] = in.Sem.Limit, hs
	return m
}
