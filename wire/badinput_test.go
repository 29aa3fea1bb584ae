package wire_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// nested returns [0, 1, "put", [X]] where X is depth levels of arrays (or
// of maps {"a": ...}) around a nil.
func nested(t *testing.T, depth int, maps bool) []byte {
	var inner any
	for range depth {
		if maps {
			inner = map[string]any{"a": inner}
		} else {
			inner = []any{inner}
		}
	}
	return marshal(t, []any{0, 1, "put", []any{inner}})
}

// TestBadInput sends malformed input and checks the server's answer: an
// error response when a msgid can be read, a closed connection when the
// stream cannot be trusted any more, and never a panic or a hang. A client
// on another connection keeps working throughout.
func TestBadInput(t *testing.T) {
	const limit = 64 << 10
	ts := startServer(t, func(_ *fencekv.Options, cfg *wire.Config) { cfg.MaxMessageSize = limit })
	ctx := context.Background()
	bystander := dial(t, ts.Addr)

	put := marshal(t, []any{0, 1, "put", []any{map[string]any{"key": "k", "value": "v"}}})
	filler := bytes.Repeat([]byte{0xc0}, limit+1) // nils: enough elements to pass the limit
	req := func(params ...string) []byte {
		// [0, 1, "put", <params>] with params given as hex.
		return append(mustHex(t, "94 00 01 a3 707574"), mustHex(t, strings.Join(params, ""))...)
	}
	for _, tc := range []struct {
		name      string
		in        []byte
		halfClose bool     // then close our side, as a client that gave up mid-message
		replies   []string // codes of the responses to msgid 1, 2, ... ("" for success)
		open      bool     // the connection stays usable afterwards
	}{
		// Framing: the stream cannot be resynchronised, so it is closed.
		{name: "nothing", halfClose: true},
		{name: "truncated request", in: put[:10], halfClose: true},
		{name: "truncated inside a str", in: mustHex(t, "94 00 01 a3 70"), halfClose: true},
		{name: "truncated after a huge array header", in: req("dd ffffffff c0 c0"), halfClose: true},
		{name: "invalid code 0xc1", in: mustHex(t, "c1")},
		{name: "not an array", in: mustHex(t, "a5 68656c6c6f")},
		{name: "array of 2", in: mustHex(t, "92 00 01")},
		{name: "array of 5", in: mustHex(t, "95 00 01 a4 70696e67 90 c0")},
		{name: "a response sent to the server", in: mustHex(t, "94 01 01 c0 c0")},
		{name: "unknown message type", in: mustHex(t, "94 07 01 a4 70696e67 90")},
		{name: "type is a string", in: mustHex(t, "94 a1 30 01 a4 70696e67 90")},
		{name: "negative msgid", in: mustHex(t, "94 00 ff a4 70696e67 90")},
		{name: "msgid over 32 bits", in: mustHex(t, "94 00 cf 0000000100000000 a4 70696e67 90")},
		{name: "msgid is a string", in: mustHex(t, "94 00 a1 31 a4 70696e67 90")},
		{name: "notification of 4", in: mustHex(t, "94 02 a4 70696e67 90 c0")},
		{name: "valid request then garbage", in: append(bytes.Clone(put), 0xc1), replies: []string{""}},

		// Oversized headers: refused from the header, before anything is
		// allocated for the claimed length.
		{name: "bin32 of 4 GiB", in: req("91 82 a3 6b6579 a1 6b a5 76616c7565 c6 ffffffff"), replies: []string{"too_large"}},
		{name: "str32 of 4 GiB method", in: mustHex(t, "94 00 01 db ffffffff"), replies: []string{"too_large"}},
		{name: "ext32 of 4 GiB", in: req("91 81 a3 6b6579 c9 ffffffff 01"), replies: []string{"too_large"}},
		{name: "array32 of 4G params", in: append(req("dd ffffffff"), filler...), replies: []string{"too_large"}},
		{name: "map32 of 4G entries", in: append(req("91 df ffffffff"), filler...), replies: []string{"too_large"}},
		{name: "array32 of 4G at the top", in: append(mustHex(t, "dd ffffffff"), filler...)},
		{name: "deeply nested arrays", in: nested(t, 100, false), replies: []string{"bad_request"}},
		{name: "deeply nested maps", in: nested(t, 100, true), replies: []string{"bad_request"}},

		// Well-framed but wrong: answered, and the connection goes on.
		{name: "method is a number", in: mustHex(t, "94 00 01 05 90"), replies: []string{"bad_request"}, open: true},
		{name: "params is a map", in: mustHex(t, "94 00 01 a4 70696e67 80"), replies: []string{"bad_request"}, open: true},
		{name: "params is nil", in: mustHex(t, "94 00 01 a4 70696e67 c0"), replies: []string{""}, open: true},
		{name: "params of 2", in: mustHex(t, "94 00 01 a4 70696e67 92 80 80"), replies: []string{"bad_request"}, open: true},
		{name: "param not a map", in: req("91 05"), replies: []string{"bad_request"}, open: true},
		{name: "param name not a string", in: req("91 81 05 a1 6b"), replies: []string{"bad_request"}, open: true},
		{name: "key is an ext", in: req("91 82 a3 6b6579 d4 01 00 a5 76616c7565 a1 76"), replies: []string{"bad_request"}, open: true},
		{name: "key is a map", in: req("91 82 a3 6b6579 80 a5 76616c7565 a1 76"), replies: []string{"bad_request"}, open: true},
		{name: "token is a float", in: req("91 83 a3 6b6579 a1 6b a5 76616c7565 a1 76 a5 746f6b656e cb 3ff0000000000000"), replies: []string{"bad_request"}, open: true},
		{name: "token is negative", in: req("91 83 a3 6b6579 a1 6b a5 76616c7565 a1 76 a5 746f6b656e ff"), replies: []string{"bad_request"}, open: true},
		{name: "token is true", in: req("91 83 a3 6b6579 a1 6b a5 76616c7565 a1 76 a5 746f6b656e c3"), replies: []string{"bad_request"}, open: true},
		{name: "strict is a string", in: req("91 84 a3 6b6579 a1 6b a5 76616c7565 a1 76 a5 746f6b656e 01 a6 737472696374 a1 31"), replies: []string{"bad_request"}, open: true},
		{name: "missing params", in: mustHex(t, "94 00 01 a6 64656c657465 90"), replies: []string{"bad_request"}, open: true},
		{name: "unknown method", in: mustHex(t, "94 00 01 a3 6e6f70 90"), replies: []string{"unknown_method"}, open: true},
		{name: "empty method", in: mustHex(t, "94 00 01 a0 90"), replies: []string{"unknown_method"}, open: true},
		{name: "ext in an unknown param", in: req("91 83 a3 6b6579 a1 6b a5 76616c7565 a1 76 a1 78 d4 01 00"), replies: []string{""}, open: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			raw := dialRaw(t, ts.Addr)
			if len(tc.in) > 0 {
				// The server may close before reading all of a long input;
				// a failed write is then expected.
				raw.nc.Write(tc.in)
			}
			if tc.halfClose {
				raw.nc.CloseWrite()
			}
			for i, want := range tc.replies {
				p := raw.reply()
				if p.id != uint64(i+1) || p.code() != want {
					t.Fatalf("response %d = {id %d, %v}; want id %d, code %q", i, p.id, p.err, i+1, want)
				}
			}
			if tc.open {
				if p := raw.call(99, "ping"); p.err != nil {
					t.Fatalf("ping on the same connection = %+v", p)
				}
			} else {
				raw.expectClosed()
			}
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
				t.Errorf("the server allocated %d MiB for this input", grew>>20)
			}
			if _, err := bystander.Ping(ctx); err != nil {
				t.Fatalf("the other connection broke: %v", err)
			}
		})
	}
	if st, err := ts.DB.Status(ctx); err != nil || st.Revision != 2 {
		// Only "valid request then garbage" and "ext in an unknown param"
		// wrote.
		t.Errorf("status after bad input = %+v, %v; want revision 2", st, err)
	}
}

// TestRandomBytes throws random bytes at the server, alone and after a
// valid message prefix. Whatever comes back must be well-formed error
// responses, the connection must end once we stop sending, and another
// client keeps working.
func TestRandomBytes(t *testing.T) {
	ts := startServer(t, func(_ *fencekv.Options, cfg *wire.Config) { cfg.MaxMessageSize = 4 << 10 })
	ctx := context.Background()
	bystander := dial(t, ts.Addr)
	rng := rand.New(rand.NewPCG(1, 2)) // fixed: a failure reproduces
	prefixes := [][]byte{nil, mustHex(t, "94"), mustHex(t, "94 00"), mustHex(t, "94 00 01"), mustHex(t, "94 00 01 a3 707574 91")}
	start := time.Now()
	for i := range 300 {
		in := bytes.Clone(prefixes[i%len(prefixes)])
		for range rng.IntN(200) + 1 {
			in = append(in, byte(rng.Uint32()))
		}
		raw := dialRaw(t, ts.Addr)
		raw.nc.Write(in)
		raw.nc.CloseWrite()
		// Read whatever comes until the server closes.
		for {
			raw.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			var m []any
			err := raw.dec.Decode(&m)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("input %d (% x): the server neither answered nor closed", i, in)
				}
				break // closed (EOF or reset)
			}
			if p := asReply(t, m); p.err == nil && p.res == nil {
				t.Fatalf("input %d: odd response %#v", i, m)
			}
		}
		raw.nc.Close()
		if i%50 == 0 {
			if _, err := bystander.Ping(ctx); err != nil {
				t.Fatalf("the other connection broke after input %d: %v", i, err)
			}
		}
	}
	if _, err := bystander.Ping(ctx); err != nil {
		t.Fatalf("the other connection broke: %v", err)
	}
	eventually(t, 10*time.Second, "the random connections to close", func() bool { return ts.Srv.Conns() == 1 })
	t.Logf("300 random inputs in %v", time.Since(start))
}
