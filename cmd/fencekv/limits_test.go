//go:build linux

package main

// Resource limits of a real 'fencekv serve' process, measured from the
// outside: its resident memory (/proc/PID/status) under clients that leave
// large messages behind.

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// procStatus reads a "kB" field (VmRSS, VmHWM) of /proc/PID/status, in bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the server's status: %v", err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", field, line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

const mib = 1 << 20

// rawConn is a client connection that speaks msgpack by hand, to send
// requests without reading their answers.
type rawConn struct {
	t   *testing.T
	nc  net.Conn
	dec *msgpack.Decoder
}

func dialRawConn(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc, dec: msgpack.NewDecoder(bufio.NewReader(nc))}
}

func encodeMsg(t *testing.T, msg ...any) []byte {
	t.Helper()
	p, err := msgpack.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// read reads one message from the server within d.
func (r *rawConn) read(d time.Duration) ([]any, error) {
	r.nc.SetReadDeadline(time.Now().Add(d))
	defer r.nc.SetReadDeadline(time.Time{})
	var msg []any
	err := r.dec.Decode(&msg)
	return msg, err
}

// TestServeMemoryIdleAfterLargeMessages: connections that each sent one
// valid message near the 4 MiB limit and then stay idle must not keep a
// message-sized buffer each. Before the fix each kept about 12 MB (its
// frame buffer and its decoder's); 200 of them held about 2.5 GB.
func TestServeMemoryIdleAfterLargeMessages(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 800 MB through a real server")
	}
	const (
		conns = 200
		bound = 192 * mib // RSS once they are idle
	)
	s := startServer(t, t.TempDir())
	pid := s.cmd.Process.Pid
	// A ping whose params carry an unknown field of almost 4 MiB: valid,
	// and answered.
	ping := encodeMsg(t, 0, 1, "ping", []any{map[string]any{"pad": bytes.Repeat([]byte("p"), 4<<20-64)}})
	if len(ping) > 4<<20 {
		t.Fatalf("the ping is %d bytes, over the limit", len(ping))
	}
	var idle []*rawConn
	for i := range conns {
		r := dialRawConn(t, s.addr)
		if _, err := r.nc.Write(ping); err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
		msg, err := r.read(10 * time.Second)
		if err != nil || len(msg) != 4 || msg[2] != nil {
			t.Fatalf("conn %d: the large ping was answered %v, %v", i, msg, err)
		}
		idle = append(idle, r)
	}
	// Freed memory goes back to the system in the background: wait for it.
	var rss int64
	deadline := time.Now().Add(20 * time.Second)
	for {
		rss = procStatus(t, pid, "VmRSS")
		if rss <= bound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server RSS %d MB with %d idle connections that each sent 4 MiB; bound %d MB", rss/mib, conns, bound/mib)
		}
		time.Sleep(100 * time.Millisecond) // polling the server's RSS
	}
	t.Logf("server RSS %d MB with %d idle connections after a 4 MiB message each (high-water %d MB)", rss/mib, len(idle), procStatus(t, pid, "VmHWM")/mib)
	// They are still served.
	if _, err := idle[0].nc.Write(encodeMsg(t, 0, 2, "ping", []any{})); err != nil {
		t.Fatal(err)
	}
	if msg, err := idle[0].read(5 * time.Second); err != nil || msg[2] != nil {
		t.Fatalf("ping after idling: %v, %v", msg, err)
	}
	s.stop(t)
}
