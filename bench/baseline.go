package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/fencekv/fencekv/wire"
)

// Baselines: what a fenced write cannot be faster than on this machine.
// Compare a 1-client result with them to see how far above the hardware a
// store is.

// LoopbackRTT measures n round trips of a 64-byte message over a TCP
// connection to an echo server on 127.0.0.1 in this process: the network
// part of every request.
func LoopbackRTT(n int) (Latency, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Latency{}, err
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return Latency{}, err
	}
	c.(*net.TCPConn).SetNoDelay(true)
	msg := make([]byte, 64)
	h := NewHistogram()
	for range n {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			c.Close()
			return Latency{}, err
		}
		if _, err := io.ReadFull(c, msg); err != nil {
			c.Close()
			return Latency{}, err
		}
		h.Record(time.Since(start))
	}
	c.Close()
	<-served
	return h.Latency(), nil
}

// FsyncLatency measures n fsyncs of a file in dir, each after overwriting
// one 4 KiB page of it in place: the durable part of every write, on the
// disk the store's data lives on.
func FsyncLatency(dir string, n int) (Latency, error) {
	f, err := os.CreateTemp(dir, "fsync-*.tmp")
	if err != nil {
		return Latency{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	const page, pages = 4096, 256
	buf := make([]byte, page)
	if _, err := f.Write(make([]byte, page*pages)); err != nil {
		return Latency{}, err
	}
	if err := f.Sync(); err != nil {
		return Latency{}, err
	}
	h := NewHistogram()
	for i := range n {
		buf[0] = byte(i)
		start := time.Now()
		if _, err := f.WriteAt(buf, int64(i%pages)*page); err != nil {
			return Latency{}, err
		}
		if err := f.Sync(); err != nil {
			return Latency{}, err
		}
		h.Record(time.Since(start))
	}
	return h.Latency(), nil
}

// PingFencekv measures n pings of the fencekv server at addr on one
// connection: a round trip through its codec that writes nothing.
func PingFencekv(ctx context.Context, addr string, n int) (Latency, error) {
	c, err := wire.Dial(ctx, addr)
	if err != nil {
		return Latency{}, err
	}
	defer c.Close()
	h := NewHistogram()
	for range n {
		start := time.Now()
		if _, err := c.Ping(ctx); err != nil {
			return Latency{}, fmt.Errorf("bench: ping: %w", err)
		}
		h.Record(time.Since(start))
	}
	return h.Latency(), nil
}

// SyncedEchoSize is the size of the messages SyncedEchoRTT sends: about
// a fenced put's log record.
const SyncedEchoSize = 174

// ServeSyncedEcho answers each SyncedEchoSize-byte message on the
// connections of ln with the same bytes, after writing them over a
// preallocated file in dir and syncing it: a round trip with one durable
// write and no store behind it, the floor under a 1-client fenced write.
// Run it in another process than the one measuring, so that the round trip
// crosses processes as a request to a server does (on a VM, the CPU that
// idles through the sync must then be woken twice). It returns when ln is
// closed.
func ServeSyncedEcho(ln net.Listener, dir string) error {
	f, err := os.CreateTemp(dir, "synced-echo-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	const size = 4 << 20
	if _, err := f.Write(make([]byte, size)); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	var mu sync.Mutex // one file offset for every connection
	var off int64
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			msg := make([]byte, SyncedEchoSize)
			for {
				if _, err := io.ReadFull(c, msg); err != nil {
					return
				}
				mu.Lock()
				_, err := f.WriteAt(msg, off)
				if err == nil {
					err = f.Sync()
				}
				off = (off + SyncedEchoSize) % (size - SyncedEchoSize)
				mu.Unlock()
				if err != nil {
					return
				}
				if _, err := c.Write(msg); err != nil {
					return
				}
			}
		}()
	}
}

// SyncedEchoRTT measures n round trips to a ServeSyncedEcho server at addr.
func SyncedEchoRTT(addr string, n int) (Latency, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return Latency{}, err
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	msg := make([]byte, SyncedEchoSize)
	h := NewHistogram()
	for i := range n {
		msg[0] = byte(i)
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return Latency{}, err
		}
		if _, err := io.ReadFull(c, msg); err != nil {
			return Latency{}, err
		}
		h.Record(time.Since(start))
	}
	return h.Latency(), nil
}
