package wire

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestAppendMatchesMsgpack checks that the encoder's own methods write
// what msgpack's encoder writes, at every boundary of every width.
func TestAppendMatchesMsgpack(t *testing.T) {
	var uints []uint64
	for _, edge := range []uint64{0, math.MaxInt8, math.MaxUint8, math.MaxUint16, math.MaxUint32, math.MaxInt64, math.MaxUint64} {
		uints = append(uints, edge, edge+1, edge-1)
	}
	var ints []int64
	for _, edge := range []int64{0, -1, -32, -33, math.MinInt8, math.MinInt16, math.MinInt32, math.MinInt64, math.MaxInt8, math.MaxUint8, math.MaxUint16, math.MaxInt32, math.MaxUint32, math.MaxInt64} {
		ints = append(ints, edge, edge+1, edge-1)
	}
	lens := []int{0, 1, 15, 16, 31, 32, 255, 256, math.MaxUint16, math.MaxUint16 + 1}

	type step struct {
		name string
		ours func(e *encoder)
		want func(e *msgpack.Encoder)
	}
	var steps []step
	steps = append(steps,
		step{"nil", func(e *encoder) { e.EncodeNil() }, func(e *msgpack.Encoder) { e.EncodeNil() }},
		step{"true", func(e *encoder) { e.EncodeBool(true) }, func(e *msgpack.Encoder) { e.EncodeBool(true) }},
		step{"false", func(e *encoder) { e.EncodeBool(false) }, func(e *msgpack.Encoder) { e.EncodeBool(false) }},
		step{"nil bytes", func(e *encoder) { e.EncodeBytes(nil) }, func(e *msgpack.Encoder) { e.EncodeBytes(nil) }},
	)
	for _, n := range uints {
		steps = append(steps, step{"uint", func(e *encoder) { e.EncodeUint(n) }, func(e *msgpack.Encoder) { e.EncodeUint(n) }})
	}
	for _, n := range ints {
		steps = append(steps, step{"int", func(e *encoder) { e.EncodeInt(n) }, func(e *msgpack.Encoder) { e.EncodeInt(n) }})
	}
	for _, n := range lens {
		s := strings.Repeat("s", n)
		steps = append(steps,
			step{"str", func(e *encoder) { e.EncodeString(s) }, func(e *msgpack.Encoder) { e.EncodeString(s) }},
			step{"bin", func(e *encoder) { e.EncodeBytes([]byte(s)) }, func(e *msgpack.Encoder) { e.EncodeBytes([]byte(s)) }},
			step{"array", func(e *encoder) { e.EncodeArrayLen(n) }, func(e *msgpack.Encoder) { e.EncodeArrayLen(n) }},
			step{"map", func(e *encoder) { e.EncodeMapLen(n) }, func(e *msgpack.Encoder) { e.EncodeMapLen(n) }},
		)
	}
	// One value at a time, and all of them in one buffer (appends to a
	// buffer with data and room, and growing it).
	all, allWant := newEncoder(), new(bytes.Buffer)
	allEnc := msgpack.NewEncoder(allWant)
	for _, s := range steps {
		e, want := newEncoder(), new(bytes.Buffer)
		s.ours(e)
		s.want(msgpack.NewEncoder(want))
		if !bytes.Equal(e.buf.Bytes(), want.Bytes()) {
			t.Errorf("%s: wrote % x, msgpack writes % x", s.name, prefix(e.buf.Bytes()), prefix(want.Bytes()))
		}
		s.ours(all)
		s.want(allEnc)
	}
	if !bytes.Equal(all.buf.Bytes(), allWant.Bytes()) {
		t.Errorf("all in one buffer: %d bytes differ from msgpack's %d", all.buf.Len(), allWant.Len())
	}
	// The embedded encoder writes into the same buffer, in order.
	e := newEncoder()
	e.EncodeMapLen(1)
	e.Encoder.EncodeString("k")
	e.EncodeUint(300)
	var got map[string]uint64
	if err := msgpack.Unmarshal(e.buf.Bytes(), &got); err != nil || got["k"] != 300 {
		t.Errorf("mixed with the embedded encoder: %v, %v", got, err)
	}
}

func prefix(b []byte) []byte { return b[:min(len(b), 8)] }
