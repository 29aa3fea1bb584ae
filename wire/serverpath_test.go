package wire_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/metrics"
	"github.com/fencekv/fencekv/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// BenchmarkServerPath drives the server with requests encoded once, over
// a raw connection, and reads the answers with a reused decoder that
// allocates nothing: so allocs/op are the server's own, from the socket
// through the engine and back (fsync off: this measures CPU and memory,
// not the disk).
//
//	go test -run '^$' -bench ServerPath -benchmem ./wire
func BenchmarkServerPath(b *testing.B) { benchServerPath(b, nil) }

// BenchmarkServerPathMetrics is BenchmarkServerPath with the metrics of
// fencekv serve observing every request and commit: the two side by side
// show what metrics cost the request path.
func BenchmarkServerPathMetrics(b *testing.B) {
	m := metrics.New()
	benchServerPath(b, func(o *fencekv.Options, c *wire.Config) {
		o.Observer = m
		c.Observe = m.Observe
	})
}

func benchServerPath(b *testing.B, edit func(*fencekv.Options, *wire.Config)) {
	ts := startServer(b, edit)
	nc, err := net.Dial("tcp", ts.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	dec := msgpack.NewDecoder(bufio.NewReader(nc))
	request := func(method string, params map[string]any) []byte {
		ps := []any{}
		if params != nil {
			ps = []any{params}
		}
		raw, err := msgpack.Marshal([]any{0, 1, method, ps})
		if err != nil {
			b.Fatal(err)
		}
		return raw
	}
	// call sends req and reads the answer; with result, it returns the
	// first field's value of the result map (token, for acquire).
	call := func(req []byte, result bool) uint64 {
		if _, err := nc.Write(req); err != nil {
			b.Fatal(err)
		}
		if n, err := dec.DecodeArrayLen(); err != nil || n != 4 {
			b.Fatalf("answer: %d, %v", n, err)
		}
		dec.Skip() // type
		dec.Skip() // msgid
		if c, _ := dec.PeekCode(); c != 0xc0 {
			var refusal map[string]any
			dec.Decode(&refusal)
			b.Fatalf("refused: %v", refusal)
		}
		dec.Skip() // nil error
		if !result {
			dec.Skip()
			return 0
		}
		n, err := dec.DecodeMapLen()
		if err != nil {
			b.Fatal(err)
		}
		dec.Skip() // the first key
		v, err := dec.DecodeUint64()
		if err != nil {
			b.Fatal(err)
		}
		for range 2*n - 2 {
			dec.Skip()
		}
		return v
	}

	value := bytes.Repeat([]byte("v"), 128)
	put := request("put", map[string]any{"key": "k", "value": value, "token": 1})
	get := request("get", map[string]any{"key": "k"})
	ping := request("ping", nil)
	acquire := request("acquire", map[string]any{"lock": "L", "ttl_ms": 10_000})
	// The release's token is encoded as a uint64 (0xcf and 8 bytes),
	// rewritten in place for each grant.
	const marker = uint64(0x0102030405060708)
	release := request("release", map[string]any{"lock": "L", "token": marker})
	var mb [8]byte
	binary.BigEndian.PutUint64(mb[:], marker)
	at := bytes.Index(release, mb[:])
	if at < 0 {
		b.Fatal("no token in the release request")
	}

	run := func(name string, op func()) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				op()
			}
		})
	}
	run("ping", func() { call(ping, false) })
	run("get", func() { call(get, false) })
	run("put", func() { call(put, false) })
	run("acquire+release", func() {
		token := call(acquire, true)
		binary.BigEndian.PutUint64(release[at:], token)
		call(release, false)
	})
}
