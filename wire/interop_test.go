package wire_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// rawConn speaks MessagePack-RPC by hand over a plain TCP connection, the
// way a client in another language would.
type rawConn struct {
	tb  testing.TB
	nc  *net.TCPConn
	dec *msgpack.Decoder
}

func dialRaw(tb testing.TB, addr string) *rawConn {
	tb.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	tb.Cleanup(func() { nc.Close() })
	// Decoded into any, msgpack bin is []byte and str is string; integers
	// keep their wire width (see num).
	dec := msgpack.NewDecoder(nc)
	return &rawConn{tb: tb, nc: nc.(*net.TCPConn), dec: dec}
}

// write sends bytes as they are.
func (r *rawConn) write(p []byte) {
	r.tb.Helper()
	if _, err := r.nc.Write(p); err != nil {
		r.tb.Fatalf("write: %v", err)
	}
}

// send marshals each message and writes them all at once.
func (r *rawConn) send(msgs ...any) {
	r.tb.Helper()
	var buf []byte
	for _, m := range msgs {
		buf = append(buf, marshal(r.tb, m)...)
	}
	r.write(buf)
}

func marshal(tb testing.TB, v any) []byte {
	tb.Helper()
	p, err := msgpack.Marshal(v)
	if err != nil {
		tb.Fatalf("marshal %#v: %v", v, err)
	}
	return p
}

// next reads one message, failing the test if none comes within 10s.
func (r *rawConn) next() []any {
	r.tb.Helper()
	r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var m []any
	if err := r.dec.Decode(&m); err != nil {
		r.tb.Fatalf("read a message: %v", err)
	}
	return m
}

// nextRaw reads the bytes of one message.
func (r *rawConn) nextRaw() []byte {
	r.tb.Helper()
	r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, err := r.dec.DecodeRaw()
	if err != nil {
		r.tb.Fatalf("read a message: %v", err)
	}
	return raw
}

// reply is a response taken apart.
type reply struct {
	id  uint64
	err map[string]any // nil on success
	res map[string]any // nil on a refusal
}

func (p reply) code() string {
	if p.err == nil {
		return ""
	}
	c, _ := p.err["code"].(string)
	return c
}

// reply reads one message and checks that it is a response
// [1, msgid, error, result] with exactly one of error and result nil.
func (r *rawConn) reply() reply {
	r.tb.Helper()
	return asReply(r.tb, r.next())
}

func asReply(tb testing.TB, m []any) reply {
	tb.Helper()
	if len(m) != 4 || num(tb, m[0]) != 1 {
		tb.Fatalf("not a response: %#v", m)
	}
	p := reply{id: num(tb, m[1])}
	switch {
	case m[2] == nil && m[3] != nil:
		res, isMap := m[3].(map[string]any)
		if !isMap {
			tb.Fatalf("result is not a map: %#v", m)
		}
		p.res = res
	case m[2] != nil && m[3] == nil:
		em, isMap := m[2].(map[string]any)
		if !isMap {
			tb.Fatalf("error is not a map: %#v", m)
		}
		if _, isStr := em["code"].(string); !isStr {
			tb.Fatalf("error map without a code: %#v", em)
		}
		if _, isStr := em["message"].(string); !isStr {
			tb.Fatalf("error map without a message: %#v", em)
		}
		p.err = em
	default:
		tb.Fatalf("want exactly one of error and result: %#v", m)
	}
	return p
}

// call sends one request and reads its response, which must be the next
// message.
func (r *rawConn) call(id uint64, method string, params ...any) reply {
	r.tb.Helper()
	if params == nil {
		params = []any{}
	}
	r.send([]any{0, id, method, params})
	p := r.reply()
	if p.id != id {
		r.tb.Fatalf("response to %d carries msgid %d", id, p.id)
	}
	return p
}

// expectClosed reads until the server closes the connection, failing on
// any message or if it stays open for 10s.
func (r *rawConn) expectClosed() {
	r.tb.Helper()
	r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var rest bytes.Buffer
	_, err := io.Copy(&rest, r.nc)
	if err != nil && !isReset(err) {
		r.tb.Fatalf("want the connection closed, got %v", err)
	}
	if rest.Len() > 0 {
		r.tb.Fatalf("want the connection closed, got % x", rest.Bytes())
	}
}

// isReset reports a connection reset: the server closed with bytes of
// ours unread, which is also a close.
func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// snum reads a msgpack integer of any width decoded into an interface.
func snum(tb testing.TB, v any) int64 {
	tb.Helper()
	switch n := v.(type) {
	case int8:
		return int64(n)
	case int16:
		return int64(n)
	case int32:
		return int64(n)
	case int64:
		return n
	case uint8:
		return int64(n)
	case uint16:
		return int64(n)
	case uint32:
		return int64(n)
	case uint64:
		if n > math.MaxInt64 {
			tb.Fatalf("%d is out of int64 range", n)
		}
		return int64(n)
	}
	tb.Fatalf("%#v (%T) is not an integer", v, v)
	return 0
}

// num reads a non-negative msgpack integer of any width.
func num(tb testing.TB, v any) uint64 {
	tb.Helper()
	if n, isU64 := v.(uint64); isU64 {
		return n
	}
	n := snum(tb, v)
	if n < 0 {
		tb.Fatalf("negative number %d", n)
	}
	return uint64(n)
}

func isInt(v any) bool {
	switch v.(type) {
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		return true
	}
	return false
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestInteropByteLevel is the protocol's worked example: the exact bytes of
// a put and its response, and of a refused put. PROTOCOL.md may copy them.
func TestInteropByteLevel(t *testing.T) {
	ts := startServer(t, nil)
	raw := dialRaw(t, ts.Addr)

	// [0, 7, "put", [{"key": "inventory/sku-1", "value": <bin "7">, "token": 34}]]
	put := mustHex(t, ""+
		"94"+ // array of 4
		"00"+ // 0: request
		"07"+ // msgid 7
		"a3 707574"+ // "put"
		"91"+ // params: array of 1
		"83"+ // map of 3
		"a3 6b6579"+ // "key"
		"af 696e76656e746f72792f736b752d31"+ // "inventory/sku-1"
		"a5 76616c7565"+ // "value"
		"c4 01 37"+ // bin 8, length 1: "7"
		"a5 746f6b656e"+ // "token"
		"22") // 34
	// [1, 7, nil, {"fence": 34, "revision": 1}]
	wantResp := mustHex(t, ""+
		"94"+ // array of 4
		"01"+ // 1: response
		"07"+ // msgid 7
		"c0"+ // error: nil
		"82"+ // result: map of 2
		"a5 66656e6365 22"+ // "fence": 34
		"a8 7265766973696f6e 01") // "revision": 1
	raw.write(put)
	resp := raw.nextRaw()
	t.Logf("put request  (%d bytes): % x", len(put), put)
	t.Logf("put response (%d bytes): % x", len(resp), resp)
	if !bytes.Equal(resp, wantResp) {
		t.Fatalf("response % x; want % x", resp, wantResp)
	}
	p := asReply(t, decodeAny(t, resp))
	if p.id != 7 || p.err != nil || num(t, p.res["fence"]) != 34 || num(t, p.res["revision"]) != 1 {
		t.Fatalf("response decodes as %+v", p)
	}

	// The same put with token 33 is stale:
	// [0, 8, "put", [{"key": "inventory/sku-1", "value": <bin "6">, "token": 33}]]
	stale := mustHex(t, "94 00 08 a3 707574 91 83 a3 6b6579 af 696e76656e746f72792f736b752d31 a5 76616c7565 c4 01 36 a5 746f6b656e 21")
	raw.write(stale)
	resp = raw.nextRaw()
	t.Logf("stale request  (%d bytes): % x", len(stale), stale)
	t.Logf("stale response (%d bytes): % x", len(resp), resp)
	// [1, 8, {"code": "stale_token", "message": "...", "fence": 34}, nil]
	if !bytes.HasPrefix(resp, mustHex(t, "94 01 08 83 a4 636f6465 ab 7374616c655f746f6b656e a7 6d657373616765")) ||
		!bytes.HasSuffix(resp, mustHex(t, "a5 66656e6365 22 c0")) {
		t.Fatalf("stale response % x", resp)
	}
	p = asReply(t, decodeAny(t, resp))
	if p.id != 8 || p.code() != "stale_token" || num(t, p.err["fence"]) != 34 || p.err["message"] != "token 33 is below fence 34" {
		t.Fatalf("stale response decodes as %+v", p)
	}
	if got := keys(p.err); !slices.Equal(got, []string{"code", "fence", "message"}) {
		t.Fatalf("stale_token error map has keys %v", got)
	}

	// [0, 9, "get", [{"key": "inventory/sku-1"}]] and its response
	// [1, 9, nil, {"found": true, "value": <bin "7">, "fence": 34, "revision": 1}]
	get := mustHex(t, "94 00 09 a3 676574 91 81 a3 6b6579 af 696e76656e746f72792f736b752d31")
	raw.write(get)
	resp = raw.nextRaw()
	t.Logf("get request  (%d bytes): % x", len(get), get)
	t.Logf("get response (%d bytes): % x", len(resp), resp)
	wantGet := mustHex(t, "94 01 09 c0 84 a5 666f756e64 c3 a5 76616c7565 c4 01 37 a5 66656e6365 22 a8 7265766973696f6e 01")
	if !bytes.Equal(resp, wantGet) {
		t.Fatalf("get response % x; want % x", resp, wantGet)
	}
}

func mustHex(tb testing.TB, s string) []byte {
	tb.Helper()
	p, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func decodeAny(tb testing.TB, p []byte) []any {
	tb.Helper()
	dec := msgpack.NewDecoder(bytes.NewReader(p))
	var m []any
	if err := dec.Decode(&m); err != nil {
		tb.Fatalf("decode % x: %v", p, err)
	}
	return m
}

// TestInteropMarshalled speaks the protocol with msgpack.Marshal of plain
// arrays and maps, as any MessagePack-RPC client would.
func TestInteropMarshalled(t *testing.T) {
	ts := startServer(t, nil)
	raw := dialRaw(t, ts.Addr)
	ctx := context.Background()

	// Methods without arguments take [] or [{}] (or [nil]).
	for i, params := range [][]any{{}, {map[string]any{}}, {nil}} {
		p := raw.call(uint64(10+i), "ping", params...)
		if p.err != nil || p.res["version"] != fencekv.Version {
			t.Fatalf("ping with params %#v = %+v", params, p)
		}
		p = raw.call(uint64(20+i), "status", params...)
		if p.err != nil || p.res["version"] != fencekv.Version {
			t.Fatalf("status with params %#v = %+v", params, p)
		}
		if got := keys(p.res); !slices.Equal(got, []string{"applied_index", "checkpoint_us", "checkpoints", "commands", "commit_index", "commits", "data_size", "keys", "last_token", "leader", "locks", "node", "pid", "revision", "role", "sync_us", "term", "version", "waiters"}) {
			t.Fatalf("status fields %v", got)
		}
	}

	// Keys and values as str or as bin, read back either way; the server
	// always answers bin.
	p := raw.call(1, "put", map[string]any{"key": "as-str", "value": "text"})
	if p.err != nil || keys(p.res)[0] != "fence" || len(p.res) != 2 {
		t.Fatalf("put = %+v", p)
	}
	p = raw.call(2, "put", map[string]any{"key": []byte("as-bin"), "value": []byte{0, 1, 2}})
	if p.err != nil {
		t.Fatalf("put bin = %+v", p)
	}
	for _, k := range []any{"as-str", []byte("as-str")} {
		p = raw.call(3, "get", map[string]any{"key": k})
		if v, isBin := p.res["value"].([]byte); !isBin || string(v) != "text" || p.res["found"] != true {
			t.Fatalf("get %#v = %#v; want bin \"text\"", k, p.res)
		}
	}
	p = raw.call(4, "get", map[string]any{"key": "as-bin"})
	if v, _ := p.res["value"].([]byte); !bytes.Equal(v, []byte{0, 1, 2}) {
		t.Fatalf("get as-bin = %#v", p.res)
	}
	p = raw.call(5, "get", map[string]any{"key": "nope"})
	if p.res["found"] != false || p.res["value"] != nil || num(t, p.res["fence"]) != 0 || num(t, p.res["revision"]) != 0 {
		t.Fatalf("get missing = %#v", p.res)
	}
	if got := keys(p.res); !slices.Equal(got, []string{"fence", "found", "revision", "value"}) {
		t.Fatalf("get fields %v", got)
	}
	// Unknown params are ignored (newer clients, older servers); nil
	// params count as absent.
	p = raw.call(6, "get", map[string]any{"key": "as-str", "consistency": "linearizable", "token": nil})
	if p.err != nil || p.res["found"] != true {
		t.Fatalf("get with an unknown param = %+v", p)
	}

	// Integers of every msgpack width are accepted for a token.
	for i, tok := range []any{uint8(40), uint16(41), uint32(42), uint64(43), int8(44), int16(45), int32(46), int64(47), 48} {
		p = raw.call(uint64(100+i), "put", map[string]any{"key": "widths", "value": "v", "token": tok})
		if p.err != nil {
			t.Fatalf("token %T: %+v", tok, p)
		}
	}
	e, err := ts.DB.Get(ctx, b("widths"))
	ok(t, err)
	if e.Fence != 48 {
		t.Fatalf("fence after tokens of every width = %d; want 48", e.Fence)
	}
	// The full msgid range round-trips.
	p = raw.call(math.MaxUint32, "ping")
	if p.err != nil {
		t.Fatalf("ping with msgid 2^32-1 = %+v", p)
	}

	// Locks: names come back as bin in locks.
	p = raw.call(7, "acquire", map[string]any{"lock": "L", "ttl_ms": 5000, "holder": "raw"})
	if p.err != nil || num(t, p.res["ttl_ms"]) != 5000 {
		t.Fatalf("acquire = %+v", p)
	}
	token := num(t, p.res["token"])
	p = raw.call(8, "lock_info", map[string]any{"lock": []byte("L")})
	if p.res["held"] != true || p.res["holder"] != "raw" || num(t, p.res["token"]) != token {
		t.Fatalf("lock_info = %#v", p.res)
	}
	if got := keys(p.res); !slices.Equal(got, []string{"held", "holder", "lock_delay_ms", "token", "ttl_ms", "waiters"}) {
		t.Fatalf("lock_info fields %v", got)
	}
	p = raw.call(9, "locks")
	ls, _ := p.res["locks"].([]any)
	if len(ls) != 1 || p.res["more"] != false {
		t.Fatalf("locks = %#v", p.res)
	}
	if name, isBin := ls[0].(map[string]any)["lock"].([]byte); !isBin || string(name) != "L" {
		t.Fatalf("locks item = %#v; want the name as bin", ls[0])
	}
	p = raw.call(10, "renew", map[string]any{"lock": "L", "token": token})
	if p.err != nil || num(t, p.res["ttl_ms"]) != 5000 {
		t.Fatalf("renew = %+v", p)
	}
	p = raw.call(11, "release", map[string]any{"lock": "L", "token": token})
	if p.err != nil || len(p.res) != 0 {
		t.Fatalf("release = %+v; want an empty map", p)
	}
	p = raw.call(12, "scan", map[string]any{"prefix": "as-"})
	items, _ := p.res["items"].([]any)
	if len(items) != 2 || p.res["more"] != false {
		t.Fatalf("scan = %#v", p.res)
	}
	it := items[0].(map[string]any)
	if k, isBin := it["key"].([]byte); !isBin || string(k) != "as-bin" || len(it) != 4 {
		t.Fatalf("scan item = %#v", it)
	}
	p = raw.call(13, "incr", map[string]any{"key": "n", "delta": -3})
	if p.err != nil || snum(t, p.res["value"]) != -3 {
		t.Fatalf("incr = %#v", p)
	}
	p = raw.call(14, "delete", map[string]any{"key": "n"})
	if p.err != nil || p.res["deleted"] != true {
		t.Fatalf("delete = %#v", p)
	}
	p = raw.call(15, "cas", map[string]any{"key": "n", "revision": 0, "value": "x"})
	if p.err != nil {
		t.Fatalf("cas = %#v", p)
	}

	// A notification is applied but never answered.
	raw.send([]any{2, "put", []any{map[string]any{"key": "note", "value": "by notification"}}})
	eventually(t, 10*time.Second, "the notified put", func() bool {
		e, err := ts.DB.Get(ctx, b("note"))
		return err == nil && e.Found
	})
	// The next message on the connection is the answer to the next request.
	if p := raw.call(16, "ping"); p.err != nil {
		t.Fatalf("ping after a notification = %+v", p)
	}
	// A refused notification is not answered either.
	raw.send([]any{2, "put", []any{map[string]any{"key": ""}}}, []any{2, "nosuch", []any{}})
	if p := raw.call(17, "ping"); p.err != nil {
		t.Fatalf("ping after refused notifications = %+v", p)
	}
}

// TestInteropErrorMaps checks the layout of every error map on the wire:
// {code, message} plus exactly the facts of its code.
func TestInteropErrorMaps(t *testing.T) {
	ts, clock, c := errServer(t, func(o *fencekv.Options, _ *wire.Config) { o.MaxValueSize = 16 })
	ctx := context.Background()
	raw := dialRaw(t, ts.Addr)
	held, err := c.Acquire(ctx, "held", time.Hour, &fencekv.AcquireOptions{Holder: "alice"})
	ok(t, err)
	expiring, err := c.Acquire(ctx, "expiring", time.Second, nil)
	ok(t, err)
	_, err = c.Put(ctx, b("fenced"), b("v"), fencekv.WriteOptions{Token: 10})
	ok(t, err)
	_, err = c.Put(ctx, b("word"), b("abc"), fencekv.WriteOptions{})
	ok(t, err)
	clock.Advance(2 * time.Second)

	for _, tc := range []struct {
		method string
		params map[string]any
		code   string
		facts  map[string]any // wanted facts besides code and message
	}{
		{"put", map[string]any{"key": "fenced", "value": "v", "token": 9}, "stale_token", map[string]any{"fence": uint64(10)}},
		{"renew", map[string]any{"lock": "held", "token": 999}, "not_holder", map[string]any{"token": uint64(held.Token)}},
		{"renew", map[string]any{"lock": "expiring", "token": expiring.Token}, "lease_expired", map[string]any{"token": uint64(expiring.Token)}},
		{"acquire", map[string]any{"lock": "held", "ttl_ms": 1000}, "lock_held", map[string]any{"holder": "alice", "token": uint64(held.Token), "retry_ms": uint64((time.Hour - 2*time.Second).Milliseconds())}},
		{"cas", map[string]any{"key": "word", "revision": 99, "value": "x"}, "compare_failed", map[string]any{"revision": uint64(2)}},
		{"incr", map[string]any{"key": "word", "delta": 1}, "not_integer", nil},
		{"put", map[string]any{"key": "k", "value": strings.Repeat("v", 17)}, "too_large", nil},
		{"put", map[string]any{"key": 1, "value": "v"}, "bad_request", nil},
		{"nosuch", nil, "unknown_method", nil},
	} {
		var p reply
		if tc.params == nil {
			p = raw.call(1, tc.method)
		} else {
			p = raw.call(1, tc.method, tc.params)
		}
		if p.code() != tc.code {
			t.Errorf("%s %v: %#v; want %s", tc.method, tc.params, p.err, tc.code)
			continue
		}
		want := []string{"code", "message"}
		for k, v := range tc.facts {
			want = append(want, k)
			if got := p.err[k]; got != v && !(isInt(got) && isInt(v) && num(t, got) == num(t, v)) {
				t.Errorf("%s: %s = %#v; want %#v", tc.code, k, got, v)
			}
		}
		slices.Sort(want)
		if got := keys(p.err); !slices.Equal(got, want) {
			t.Errorf("%s error map has keys %v; want %v", tc.code, got, want)
		}
	}
}

// TestInteropClientErrors checks that the Go client maps a code back to
// the engine's sentinel, with the same text an embedded DB gives.
func TestInteropClientErrors(t *testing.T) {
	ts := startServer(t, nil)
	ctx := context.Background()
	c := dial(t, ts.Addr)
	_, err := c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: 5})
	ok(t, err)
	_, wireErr := c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: 4})
	_, dbErr := ts.DB.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{Token: 4})
	if !errors.Is(wireErr, fencekv.ErrStaleToken) || !errors.Is(dbErr, fencekv.ErrStaleToken) || wireErr.Error() != dbErr.Error() {
		t.Fatalf("over the wire %v; embedded %v; want the same refusal", wireErr, dbErr)
	}
}
