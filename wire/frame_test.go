package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	p, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// everyType returns msgpack objects that use every format of the spec,
// each as its own message.
func everyType(t testing.TB) [][]byte {
	t.Helper()
	var msgs [][]byte
	add := func(f func(e *msgpack.Encoder) error) {
		var buf bytes.Buffer
		e := msgpack.NewEncoder(&buf)
		if err := f(e); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, bytes.Clone(buf.Bytes()))
	}
	add(func(e *msgpack.Encoder) error { return e.EncodeNil() })
	add(func(e *msgpack.Encoder) error { return e.EncodeBool(true) })
	add(func(e *msgpack.Encoder) error { return e.EncodeBool(false) })
	add(func(e *msgpack.Encoder) error { return e.EncodeInt(7) })  // positive fixint
	add(func(e *msgpack.Encoder) error { return e.EncodeInt(-7) }) // negative fixint
	add(func(e *msgpack.Encoder) error { return e.EncodeUint8(200) })
	add(func(e *msgpack.Encoder) error { return e.EncodeUint16(60000) })
	add(func(e *msgpack.Encoder) error { return e.EncodeUint32(4e9) })
	add(func(e *msgpack.Encoder) error { return e.EncodeUint64(1 << 63) })
	add(func(e *msgpack.Encoder) error { return e.EncodeInt8(-100) })
	add(func(e *msgpack.Encoder) error { return e.EncodeInt16(-30000) })
	add(func(e *msgpack.Encoder) error { return e.EncodeInt32(-2e9) })
	add(func(e *msgpack.Encoder) error { return e.EncodeInt64(-1 << 62) })
	add(func(e *msgpack.Encoder) error { return e.EncodeFloat32(1.5) })
	add(func(e *msgpack.Encoder) error { return e.EncodeFloat64(2.5) })
	for _, n := range []int{0, 31, 32, 255, 256, 65535, 65536} {
		add(func(e *msgpack.Encoder) error { return e.EncodeString(strings.Repeat("s", n)) })
		add(func(e *msgpack.Encoder) error { return e.EncodeBytes(bytes.Repeat([]byte{0xc1}, n)) })
	}
	for _, n := range []int{0, 15, 16, 65535, 65536} {
		add(func(e *msgpack.Encoder) error {
			if err := e.EncodeArrayLen(n); err != nil {
				return err
			}
			for range n {
				e.EncodeNil()
			}
			return nil
		})
		add(func(e *msgpack.Encoder) error {
			if err := e.EncodeMapLen(n); err != nil {
				return err
			}
			for i := range n {
				e.EncodeInt(int64(i))
				e.EncodeNil()
			}
			return nil
		})
	}
	add(func(e *msgpack.Encoder) error { return e.EncodeTime(time.Unix(1, 2)) }) // an ext
	add(func(e *msgpack.Encoder) error {
		return e.Encode([]any{0, 7, "put", []any{map[string]any{"key": []byte("k"), "value": "v", "token": uint64(34)}}})
	})
	for _, h := range []string{
		"d4 05 01", "d5 05 0102", "d6 05 01020304", "d7 05 0102030405060708",
		"d8 05 0102030405060708090a0b0c0d0e0f10",
		"c7 03 05 010203", "c8 0003 05 010203", "c9 00000003 05 010203",
		"c7 00 05", // ext8 of length 0
	} {
		msgs = append(msgs, unhex(t, h))
	}
	return msgs
}

// readAll cuts r into frames with a reader limited to max bytes.
func readAll(r io.Reader, max int) (frames [][]byte, err error) {
	f := newFrameReader(r, max)
	for {
		p, err := f.next()
		if err != nil {
			return frames, err
		}
		frames = append(frames, bytes.Clone(p))
	}
}

func TestFrameReaderEveryType(t *testing.T) {
	msgs := everyType(t)
	stream := bytes.Join(msgs, nil)
	for name, r := range map[string]io.Reader{
		"bulk":     bytes.NewReader(stream),
		"one byte": iotest.OneByteReader(bytes.NewReader(stream)),
		"half":     iotest.HalfReader(bytes.NewReader(stream)),
	} {
		frames, err := readAll(r, 1<<20)
		if err != io.EOF {
			t.Fatalf("%s: ended with %v; want io.EOF", name, err)
		}
		if len(frames) != len(msgs) {
			t.Fatalf("%s: %d frames; want %d", name, len(frames), len(msgs))
		}
		for i := range msgs {
			if !bytes.Equal(frames[i], msgs[i]) {
				t.Fatalf("%s: frame %d = % x; want % x", name, i, head(frames[i]), head(msgs[i]))
			}
		}
	}
}

func head(p []byte) []byte { return p[:min(len(p), 32)] }

func TestFrameReaderLimit(t *testing.T) {
	msg := marshalT(t, []any{0, 1, "put", []any{map[string]any{"key": "k", "value": strings.Repeat("v", 1000)}}})
	if frames, err := readAll(bytes.NewReader(msg), len(msg)); err != io.EOF || len(frames) != 1 {
		t.Fatalf("a message of exactly the limit: %d frames, %v", len(frames), err)
	}
	if _, err := readAll(bytes.NewReader(msg), len(msg)-1); !errors.Is(err, errFrameTooLarge) {
		t.Fatalf("one byte over the limit: %v; want errFrameTooLarge", err)
	}
	// Headers that claim more than the limit are refused at the header,
	// before the claimed length is allocated or read.
	for _, h := range []string{
		"94 00 01 a3 707574 91 c6 ffffffff", // bin32
		"94 00 01 db ffffffff",              // str32
		"94 00 01 a3 707574 91 c9 ffffffff", // ext32
	} {
		f := newFrameReader(bytes.NewReader(unhex(t, h)), 4<<20)
		prefix, err := f.next()
		if !errors.Is(err, errFrameTooLarge) {
			t.Fatalf("%s: %v; want errFrameTooLarge", h, err)
		}
		if cap(f.buf) > 1<<10 {
			t.Fatalf("%s: buffer grew to %d bytes", h, cap(f.buf))
		}
		// The prefix (up to the header) is returned so that the msgid can
		// be answered.
		if !bytes.HasPrefix(prefix, unhex(t, "94 00 01")) {
			t.Fatalf("%s: prefix % x", h, prefix)
		}
	}
	// A count of 4G elements allocates nothing either: each element is read
	// (and kept) only as it comes, so the limit ends it.
	huge := append(unhex(t, "94 00 01 a3 707574 dd ffffffff"), bytes.Repeat([]byte{0xc0}, 5000)...)
	f := newFrameReader(bytes.NewReader(huge), 4096)
	if _, err := f.next(); !errors.Is(err, errFrameTooLarge) {
		t.Fatalf("array32 of 4G: %v; want errFrameTooLarge", err)
	}
	if cap(f.buf) > 16<<10 {
		t.Fatalf("array32 of 4G: buffer grew to %d bytes", cap(f.buf))
	}
}

func TestFrameReaderDepth(t *testing.T) {
	nest := func(depth int) []byte {
		var v any = 1
		for range depth {
			v = []any{v}
		}
		return marshalT(t, v)
	}
	if _, err := readAll(bytes.NewReader(nest(maxDepth)), 1<<20); err != io.EOF {
		t.Fatalf("%d levels: %v; want accepted", maxDepth, err)
	}
	if _, err := readAll(bytes.NewReader(nest(maxDepth+1)), 1<<20); !errors.Is(err, errFrameDepth) {
		t.Fatalf("%d levels: %v; want errFrameDepth", maxDepth+1, err)
	}
	// Empty containers do not nest: a deep chain of them ending empty is
	// as deep as the non-empty ones.
	deep := append(bytes.Repeat([]byte{0x91}, maxDepth), 0x90)
	if _, err := readAll(bytes.NewReader(deep), 1<<20); err != io.EOF {
		t.Fatalf("%d levels around []: %v", maxDepth, err)
	}
}

func TestFrameReaderEOF(t *testing.T) {
	if _, err := newFrameReader(bytes.NewReader(nil), 100).next(); err != io.EOF {
		t.Fatalf("empty stream: %v; want io.EOF", err)
	}
	msg := marshalT(t, []any{0, 1, "ping", []any{}})
	for i := 1; i < len(msg); i++ {
		_, err := newFrameReader(bytes.NewReader(msg[:i]), 100).next()
		if err != io.ErrUnexpectedEOF {
			t.Fatalf("cut after %d bytes: %v; want io.ErrUnexpectedEOF", i, err)
		}
	}
	if _, err := newFrameReader(bytes.NewReader(unhex(t, "c1")), 100).next(); err == nil || errors.Is(err, errFrameTooLarge) {
		t.Fatalf("0xc1: %v; want an invalid-code error", err)
	}
}

func marshalT(t testing.TB, v any) []byte {
	t.Helper()
	p, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestParseMessage covers the message layouts parseMessage accepts and
// which refusals keep the msgid.
func TestParseMessage(t *testing.T) {
	dec := msgpack.NewDecoder(nil)
	for _, tc := range []struct {
		hex    string
		hasID  bool
		ok     bool
		method string
		params bool
	}{
		{"94 00 07 a3 707574 91 80", true, true, "put", true},
		{"94 00 07 a4 70696e67 90", true, true, "ping", false},
		{"94 00 07 a4 70696e67 91 c0", true, true, "ping", false},
		{"94 00 ce ffffffff a4 70696e67 90", true, true, "ping", false},
		{"94 00 cd 0001 c4 04 70696e67 90", true, true, "ping", false}, // method as bin
		{"93 02 a3 707574 91 80", false, true, "put", true},
		{"94 00 07 05 90", true, false, "", false},
		{"94 00 07 a4 70696e67 92 80 80", true, false, "", false},
		{"94 00 07 a4 70696e67 a0", true, false, "", false},
		{"93 00 07 a4 70696e67", false, false, "", false},
		{"94 02 07 a4 70696e67", false, false, "", false},
		{"94 00 cf 0000000100000000 a4 70696e67 90", false, false, "", false},
		{"80", false, false, "", false},
	} {
		m, hasID, err := parseMessage(dec, unhex(t, tc.hex))
		if hasID != tc.hasID || (err == nil) != tc.ok {
			t.Errorf("%s: hasID %v, err %v; want hasID %v, ok %v", tc.hex, hasID, err, tc.hasID, tc.ok)
			continue
		}
		if err == nil && (m.method != tc.method || (m.params != nil) != tc.params) {
			t.Errorf("%s: %+v", tc.hex, m)
		}
		if err != nil && hasID {
			if fe := asError(err); fe.Code != "bad_request" {
				t.Errorf("%s: %v; want bad_request", tc.hex, err)
			}
		}
	}
}

// TestFrameReaderGrowsAsBytesArrive: a header announcing a body of almost
// 4 MiB followed by a few bytes makes the buffer grow by what arrived (one
// read chunk), not by what was announced; a whole large message is read
// with a buffer no larger than the limit; and the buffer a large message
// needed is not kept for the next one.
func TestFrameReaderGrowsAsBytesArrive(t *testing.T) {
	const limit = 4 << 20
	big := marshalT(t, []any{0, 1, "ping", []any{map[string]any{"pad": bytes.Repeat([]byte("p"), limit-64)}}})
	if len(big) > limit {
		t.Fatalf("test message of %d bytes is over the limit", len(big))
	}
	// The header and 100 bytes of the pad, then the stream ends.
	at := bytes.Index(big, []byte("ppp"))
	f := newFrameReader(bytes.NewReader(big[:at+100]), limit)
	if _, err := f.next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated message: %v; want io.ErrUnexpectedEOF", err)
	}
	if c := cap(f.buf); c > frameChunk+1<<10 {
		t.Fatalf("%d bytes arrived of a message announcing %d: the buffer grew to %d", at+100, len(big), c)
	}

	small := marshalT(t, []any{0, 2, "ping", []any{}})
	f = newFrameReader(bytes.NewReader(append(bytes.Clone(big), small...)), limit)
	p, err := f.next()
	if err != nil || !bytes.Equal(p, big) {
		t.Fatalf("the large message: %d bytes, %v; want it whole", len(p), err)
	}
	if c := cap(f.buf); c > limit {
		t.Fatalf("reading a message of %d bytes grew the buffer to %d, past the limit %d", len(big), c, limit)
	}
	p, err = f.next()
	if err != nil || !bytes.Equal(p, small) {
		t.Fatalf("the message after it: % x, %v", p, err)
	}
	if c := cap(f.buf); c > frameKeep {
		t.Fatalf("after a message of %d bytes the buffer keeps %d bytes; want at most %d", len(big), c, frameKeep)
	}
	// A small message keeps its buffer: no allocation per message.
	stream := bytes.Repeat(small, 1000)
	f = newFrameReader(bytes.NewReader(stream), limit)
	f.next()
	if n := testing.AllocsPerRun(100, func() { f.next() }); n != 0 {
		t.Fatalf("%v allocations per small message; want 0", n)
	}
}

// TestScanFrameAgreesWithFrameReader: the event loop's framing of bytes in
// memory cuts the same messages as the streaming reader, refuses the same
// ones, and asks for more bytes on every proper prefix of a message.
func TestScanFrameAgreesWithFrameReader(t *testing.T) {
	msgs := everyType(t)
	for i, m := range msgs {
		n, err := scanFrame(append(bytes.Clone(m), 0xc0, 0xc0), 1<<20) // followed by the next messages
		if err != nil || n != len(m) {
			t.Fatalf("message %d (% x): scanFrame = %d, %v; want %d", i, head(m), n, err, len(m))
		}
		if len(m) > 4096 {
			continue // the prefixes of the small ones cover every header
		}
		for k := range len(m) {
			if n, err := scanFrame(m[:k], 1<<20); err != errShortFrame {
				t.Fatalf("message %d, prefix of %d of %d bytes: scanFrame = %d, %v; want errShortFrame", i, k, len(m), n, err)
			}
		}
	}
	// Limits: the streaming reader and scanFrame refuse the same messages.
	for i, m := range msgs {
		for _, max := range []int{1, 3, 17, 300, 70000} {
			_, ferr := newFrameReader(bytes.NewReader(m), max).next()
			_, serr := scanFrame(m, max)
			if (ferr == nil) != (serr == nil) || ferr != nil && !errors.Is(serr, ferr) && ferr.Error() != serr.Error() {
				t.Fatalf("message %d (% x) with limit %d: frameReader %v, scanFrame %v", i, head(m), max, ferr, serr)
			}
		}
	}
	// Garbage and depth: the same verdict on random bytes.
	rng := rand.New(rand.NewPCG(3, 4)) // fixed: a failure reproduces
	for range 20000 {
		b := make([]byte, rng.IntN(40))
		for j := range b {
			b[j] = byte(rng.IntN(256))
		}
		p, ferr := newFrameReader(bytes.NewReader(b), 64).next()
		n, serr := scanFrame(b, 64)
		switch {
		case ferr == nil:
			if serr != nil || n != len(p) {
				t.Fatalf("% x: frameReader framed %d bytes, scanFrame %d, %v", b, len(p), n, serr)
			}
		case errors.Is(ferr, io.ErrUnexpectedEOF) || ferr == io.EOF:
			if serr != errShortFrame && serr != errFrameTooLarge {
				t.Fatalf("% x: frameReader wants more bytes (%v), scanFrame says %d, %v", b, ferr, n, serr)
			}
		default:
			if serr == nil || serr.Error() != ferr.Error() {
				t.Fatalf("% x: frameReader %v, scanFrame %d, %v", b, ferr, n, serr)
			}
		}
	}
	deep := bytes.Repeat([]byte{0x91}, maxDepth+1)
	if _, err := scanFrame(append(deep, 0xc0), 1<<20); err != errFrameDepth {
		t.Errorf("%d nested arrays: %v; want errFrameDepth", maxDepth+1, err)
	}
}

// TestFrameScanResumes: a message scanned as it arrives, a byte at a time
// or in pieces, is framed as it is whole; the scan resumes where it
// stopped rather than walking the message again.
func TestFrameScanResumes(t *testing.T) {
	msgs := everyType(t)
	for i, m := range msgs {
		for _, step := range []int{1, 3, 1000} {
			if len(m) > 100_000 && step < 1000 {
				continue
			}
			var f frameScan
			for k := step; k < len(m); k += step {
				if n, err := f.scan(m[:k], 1<<20); err != errShortFrame {
					t.Fatalf("message %d, %d of %d bytes in steps of %d: %d, %v; want errShortFrame", i, k, len(m), step, n, err)
				}
			}
			// Whole, with the next message's first byte behind it.
			if n, err := f.scan(append(bytes.Clone(m), 0xc0), 1<<20); err != nil || n != len(m) {
				t.Fatalf("message %d whole, in steps of %d: %d, %v; want %d", i, step, n, err, len(m))
			}
		}
	}
	// A message of many small objects, a byte at a time: the scan walks
	// each byte a bounded number of times.
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.EncodeArrayLen(20000)
	for range 20000 {
		e.EncodeInt(1)
	}
	m := buf.Bytes()
	var f frameScan
	for k := 1; k <= len(m); k++ {
		n, err := f.scan(m[:k], 1<<20)
		if k < len(m) && err != errShortFrame || k == len(m) && (err != nil || n != len(m)) {
			t.Fatalf("%d of %d bytes: %d, %v", k, len(m), n, err)
		}
		if k < len(m) && f.off < k-4 {
			// Only a header waiting for its length may be left to walk.
			t.Fatalf("%d of %d bytes: the scan is at %d; want it to have walked them all, once", k, len(m), f.off)
		}
	}
}
