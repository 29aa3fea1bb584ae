package wire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// fuzzSeeds are valid and malformed inputs to start from.
func fuzzSeeds(t testing.TB) [][]byte {
	req := func(id int, method string, params ...any) []byte {
		if params == nil {
			params = []any{}
		}
		return marshalT(t, []any{0, id, method, params})
	}
	p := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	seeds := [][]byte{
		req(1, "ping"),
		req(2, "status", map[string]any{}),
		req(3, "put", p("key", "k", "value", []byte("v"), "token", 34)),
		req(4, "put", p("key", []byte("k"), "value", "v", "token", 3, "strict", true, "lock", "L")),
		req(5, "get", p("key", "k")),
		req(6, "delete", p("key", "k", "token", 40)),
		req(7, "cas", p("key", "c", "revision", 0, "value", "x")),
		req(8, "incr", p("key", "n", "delta", -5)),
		req(9, "scan", p("prefix", "", "start", "a", "limit", 10)),
		req(10, "acquire", p("lock", "L", "ttl_ms", 1000, "holder", "h", "wait_ms", 5, "lock_delay_ms", 10)),
		req(11, "renew", p("lock", "L", "token", 1)),
		req(12, "release", p("lock", "L", "token", 1)),
		req(13, "lock_info", p("lock", "L")),
		req(14, "locks", p("prefix", "", "limit", 5)),
		req(15, "nosuch"),
		req(16, "put", p("key", 5, "value", 3.5)),
		marshalT(t, []any{2, "put", []any{p("key", "note", "value", "v")}}),
		bytes.Join([][]byte{req(1, "ping"), req(2, "get", p("key", "k")), req(3, "ping")}, nil),
		unhex(t, "94 00 07 a3 707574 91 83 a3 6b6579 af 696e76656e746f72792f736b752d31 a5 76616c7565 c4 01 37 a5 746f6b656e 22"),
		unhex(t, "94 00 01 a3 707574 91 81 a3 6b6579 c6 ffffffff"),
		unhex(t, "94 00 01 a3 707574 dd ffffffff c0 c0"),
		unhex(t, "dd ffffffff"),
		unhex(t, "94 00 01 db ffffffff"),
		append(bytes.Repeat([]byte{0x91}, 40), 0xc0),
		unhex(t, "94 00 ff a4 70696e67 90"),
		unhex(t, "94 00 01 a4 70696e67 80"),
		unhex(t, "c1"),
		unhex(t, "94 00 01"),
		{},
	}
	return seeds
}

// fuzzConn is a net.Conn whose reads come from a fixed input and whose
// writes are kept: one connection's whole life, with no network.
type fuzzConn struct {
	r io.Reader

	mu     sync.Mutex // guards out, closed
	out    bytes.Buffer
	closed bool
}

func (c *fuzzConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return c.r.Read(p)
}

func (c *fuzzConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return c.out.Write(p)
}

func (c *fuzzConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

func (c *fuzzConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.out.Bytes())
}

func (c *fuzzConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *fuzzConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// errorLog keeps, as text, what a server logs at Error: a recovered
// panic. (This file is package wire, which fencekvtest imports, so it
// cannot use fencekvtest.Logs.)
type errorLog struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (l *errorLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// take returns the lines logged so far and forgets them.
func (l *errorLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.buf.Reset()
	return strings.FieldsFunc(l.buf.String(), func(r rune) bool { return r == '\n' })
}

// FuzzDecode feeds arbitrary bytes through the server's input path: the
// frame reader, parseMessage and parseArgs, the methods against a real
// store, and a whole connection of the server. Nothing may panic or hang;
// framing must not depend on how the bytes arrive; every frame must be
// one msgpack object; every refusal must carry a code; and everything the
// server writes must be well-formed responses.
//
//	go test -run '^$' -fuzz FuzzDecode -fuzztime 10s ./wire
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	o := fencekv.DefaultOptions()
	o.NoSync = true
	o.MaxWait = 5 * time.Millisecond // a fuzzed blocking acquire must not stall the fuzzer
	db, err := fencekv.Open(f.TempDir(), &o)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	logs := &errorLog{}
	cfg := DefaultConfig()
	cfg.MaxMessageSize = 64 << 10
	cfg.MaxInFlight = 16
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelError}))
	srv, err := NewServer(db, cfg)
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		// 1. Framing: the same frames whether the bytes come at once or
		// one at a time, and each frame is exactly one msgpack object.
		frames, ferr := readAll(bytes.NewReader(data), cfg.MaxMessageSize)
		frames1, ferr1 := readAll(iotest.OneByteReader(bytes.NewReader(data)), cfg.MaxMessageSize)
		if len(frames) != len(frames1) || (ferr == nil) != (ferr1 == nil) || errors.Is(ferr, errFrameTooLarge) != errors.Is(ferr1, errFrameTooLarge) {
			t.Fatalf("framing depends on reads: %d frames (%v) vs %d (%v)", len(frames), ferr, len(frames1), ferr1)
		}
		for i, fr := range frames {
			if !bytes.Equal(fr, frames1[i]) {
				t.Fatalf("frame %d differs read one byte at a time", i)
			}
			dec := msgpack.NewDecoder(bytes.NewReader(fr))
			if err := dec.Skip(); err != nil {
				t.Fatalf("frame %d (% x) is not a msgpack object: %v", i, head(fr), err)
			}
			if n := dec.Buffered().(*bytes.Reader).Len(); n != 0 {
				t.Fatalf("frame %d has %d bytes after its object", i, n)
			}
		}

		// 2. Parsing and dispatch, without the server's panic recovery.
		dec := msgpack.NewDecoder(nil)
		for _, fr := range frames {
			m, hasID, err := parseMessage(dec, fr)
			if err != nil {
				if hasID && asError(err).Code != fencekv.CodeBadRequest {
					t.Fatalf("parseMessage refusal %v; want bad_request", err)
				}
				continue
			}
			var a args
			if err := parseArgs(dec, m.params, &a); err != nil {
				if asError(err).Code != fencekv.CodeBadRequest {
					t.Fatalf("parseArgs refusal %v; want bad_request", err)
				}
				continue
			}
			info, ok := methodTable[m.method]
			if !ok || info.call == nil {
				continue
			}
			call := info.call
			e := newEncoder()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = call(ctx, db, &a, e)
			cancel()
			if err != nil {
				if fe := asError(err); fe.Code == "" || fe.Code == fencekv.CodeUnavailable || fe.Code == fencekv.CodeInternal {
					t.Fatalf("%s refused with %v", m.method, err)
				}
				continue
			}
			rd := msgpack.NewDecoder(bytes.NewReader(e.buf.Bytes()))
			var res map[string]any
			if err := rd.Decode(&res); err != nil || rd.Buffered().(*bytes.Reader).Len() != 0 {
				t.Fatalf("%s wrote a result that is not one map: %v", m.method, err)
			}
		}

		// 3. A whole connection through the server.
		fc := &fuzzConn{r: bytes.NewReader(data)}
		done := make(chan struct{})
		go func() {
			srv.accept(fc)
			srv.connWG.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("the connection did not end after its input did")
		}
		if msgs := logs.take(); len(msgs) > 0 {
			t.Fatalf("server logged: %s", strings.Join(msgs, "\n"))
		}
		out := fc.written()
		rd := msgpack.NewDecoder(bytes.NewReader(out))
		for n := 0; ; n++ {
			var m []any
			err := rd.Decode(&m)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("response %d is not msgpack: %v (% x)", n, err, head(out))
			}
			if len(m) != 4 || m[0] != int8(1) || (m[2] == nil) == (m[3] == nil) {
				t.Fatalf("response %d is malformed: %#v", n, m)
			}
			if m[2] != nil {
				em, isMap := m[2].(map[string]any)
				if !isMap || em["code"] == nil || em["code"] == "" || em["code"] == string(fencekv.CodeInternal) {
					t.Fatalf("response %d has a bad error: %#v", n, m[2])
				}
			}
			if n > len(frames) {
				t.Fatalf("%d responses to %d frames", n+1, len(frames))
			}
		}
	})
}
