package wire

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestFastParse: wherever the fast parse takes a message or a params map,
// the decoder path accepts it too, with the same result. Run on the fuzz
// seeds and on random requests whose params mix every field, unknown
// names, and values of every type and width, right and wrong.
func TestFastParse(t *testing.T) {
	for name, f := range fields {
		if got := fieldOf([]byte(name)); got != f {
			t.Fatalf("fieldOf(%q) = %v; want %v", name, got, f)
		}
	}
	if fieldOf([]byte("other")) != 0 || fieldOf(nil) != 0 {
		t.Fatal("fieldOf of an unknown name is not 0")
	}
	dec := msgpack.NewDecoder(nil)
	fast, total := 0, 0
	check := func(frame []byte) {
		total++
		if fastParseAgrees(t, dec, frame) {
			fast++
		}
	}
	for _, seed := range fuzzSeeds(t) {
		check(seed)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		check(randomRequest(rng))
	}
	if fast < total/10 {
		t.Fatalf("the fast parse took %d of %d requests; the generator does not exercise it", fast, total)
	}
}

// FuzzFastParse is TestFastParse's check on fuzzed frames.
func FuzzFastParse(f *testing.F) {
	for _, seed := range fuzzSeeds(f) {
		f.Add(seed)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		f.Add(randomRequest(rng))
	}
	dec := msgpack.NewDecoder(nil)
	f.Fuzz(func(t *testing.T, frame []byte) { fastParseAgrees(t, dec, frame) })
}

// fastParseAgrees fails t if the fast parse takes frame (or its params)
// and the decoder path does not, or differs; it reports whether the fast
// parse took the params.
func fastParseAgrees(t *testing.T, dec *msgpack.Decoder, frame []byte) bool {
	t.Helper()
	fastFrameAgrees(t, dec, frame)
	fastFrameAgrees(t, dec, append(append([]byte{}, frame...), frame...))
	fm, ok := fastMessage(frame)
	if !ok {
		return false
	}
	dm, hasID, err := decodeMessage(dec, frame)
	if err != nil || hasID != (fm.typ == typeRequest) || fm.typ != dm.typ || fm.msgid != dm.msgid ||
		fm.method != dm.method || fm.info != dm.info || !bytes.Equal(fm.params, dm.params) || (fm.params == nil) != (dm.params == nil) {
		t.Fatalf("% x: fast %+v; decoder %+v, %v, %v", frame, fm, dm, hasID, err)
	}
	if fm.params == nil {
		return false
	}
	var fa, da args
	if !fastArgs(fm.params, &fa) {
		return false
	}
	if err := decodeArgs(dec, fm.params, &da); err != nil || !reflect.DeepEqual(fa, da) {
		t.Fatalf("% x: fast args %+v; decoder %+v, %v", fm.params, fa, da, err)
	}
	return true
}

// fastFrameAgrees fails t if fastFrame takes a message at the start of
// stream that the frame scan frames otherwise, or that the decoder path
// parses otherwise.
func fastFrameAgrees(t *testing.T, dec *msgpack.Decoder, stream []byte) {
	t.Helper()
	for _, borrow := range []bool{false, true} {
		var fa args
		buf := bytes.Clone(stream)
		fm, n, ok := fastFrame(buf, &fa, borrow)
		if !ok {
			continue
		}
		if want, err := scanFrame(stream, len(stream)); err != nil || n != want {
			t.Fatalf("% x: fastFrame took %d bytes; the frame scan %d, %v", stream, n, want, err)
		}
		dm, _, err := decodeMessage(dec, stream[:n])
		if err != nil || fm.typ != dm.typ || fm.msgid != dm.msgid || fm.info != dm.info || fm.method != dm.method || !bytes.Equal(fm.params, dm.params) {
			t.Fatalf("% x: fastFrame %+v; decoder %+v, %v", stream[:n], fm, dm, err)
		}
		var da args
		if dm.params != nil {
			if err := decodeArgs(dec, dm.params, &da); err != nil {
				t.Fatalf("% x: fastFrame took params the decoder refuses: %v", dm.params, err)
			}
		}
		if fa.borrowed != (borrow && fm.params != nil) {
			t.Fatalf("borrowed %v with borrow %v", fa.borrowed, borrow)
		}
		fa.own()
		for i := range buf {
			buf[i] = 0xff // the frame buffer is reused: the args own their bytes
		}
		if !reflect.DeepEqual(fa, da) {
			t.Fatalf("% x: fastFrame args %+v; decoder %+v", stream[:n], fa, da)
		}
	}
}

// randomRequest encodes a request (or notification) whose params map holds
// random names and values, in widths the msgpack encoder would not pick.
func randomRequest(rng *rand.Rand) []byte {
	names := []string{"key", "value", "prefix", "start", "lock", "holder", "token", "revision", "delta", "limit",
		"ttl_ms", "wait_ms", "lock_delay_ms", "strict", "consistency", "since", "compare", "ops", "locks",
		"start_revision", "watch_id", "offset", "name", "secret", "other", ""}
	var b []byte
	if rng.IntN(4) == 0 {
		b = append(b, 0x93, typeNotification)
	} else {
		b = append(b, 0x94, typeRequest)
		b = randomInt(rng, b)
	}
	b = randomStr(rng, b, []string{"get", "put", "acquire", "nope"}[rng.IntN(4)])
	switch rng.IntN(10) {
	case 0:
		return append(b, 0x90)
	case 1:
		return append(b, 0x91, 0xc0)
	}
	b = append(b, 0x91)
	n := rng.IntN(6)
	if rng.IntN(8) == 0 {
		b = append(b, 0xde, 0, byte(n))
	} else {
		b = append(b, 0x80|byte(n))
	}
	for range n {
		b = randomStr(rng, b, names[rng.IntN(len(names))])
		switch rng.IntN(6) {
		case 0:
			b = append(b, 0xc0)
		case 1, 2:
			b = randomStr(rng, b, string(bytes.Repeat([]byte{'x'}, rng.IntN(300))))
		case 3:
			b = randomInt(rng, b)
		case 4:
			b = append(b, []byte{0xc2, 0xc3, 0xcb, 0x91}[rng.IntN(4)])
			if b[len(b)-1] == 0xcb {
				b = binary.BigEndian.AppendUint64(b, 0)
			} else if b[len(b)-1] == 0x91 {
				b = append(b, 0x80)
			}
		case 5:
			b = append(b, 0x90) // an empty array: compare and ops take it
		}
	}
	if rng.IntN(20) == 0 {
		b = b[:rng.IntN(len(b))] // cut short
	}
	return b
}

func randomStr(rng *rand.Rand, b []byte, s string) []byte {
	switch c := rng.IntN(5); {
	case c == 0 && len(s) < 32:
		b = append(b, 0xa0|byte(len(s)))
	case c <= 1 && len(s) < 256:
		b = append(b, []byte{0xd9, 0xc4}[rng.IntN(2)], byte(len(s)))
	case c <= 2:
		b = append(b, []byte{0xda, 0xc5}[rng.IntN(2)])
		b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	case c <= 3:
		b = append(b, []byte{0xdb, 0xc6}[rng.IntN(2)])
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	default:
		if len(s) < 32 {
			b = append(b, 0xa0|byte(len(s)))
		} else {
			b = append(b, 0xd9, byte(min(len(s), 255)))
			s = s[:min(len(s), 255)]
		}
	}
	return append(b, s...)
}

func randomInt(rng *rand.Rand, b []byte) []byte {
	v := rng.Uint64() >> rng.IntN(64)
	if rng.IntN(3) == 0 {
		v = -v
	}
	switch rng.IntN(9) {
	case 0:
		return append(b, byte(v&0x7f))
	case 1:
		return append(b, 0xe0|byte(v&0x1f))
	case 2:
		return append(b, 0xcc, byte(v))
	case 3:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case 4:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	case 5:
		return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
	case 6:
		return append(b, 0xd0, byte(v))
	case 7:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xd3), v)
	}
}

// BenchmarkParse parses a get and a fenced put as the server does, with
// the fast parse and with the decoder alone.
func BenchmarkParse(b *testing.B) {
	get, _ := msgpack.Marshal([]any{0, 7, "get", []any{map[string]any{"key": []byte("bench/key/000123")}}})
	put, _ := msgpack.Marshal([]any{0, 7, "put", []any{map[string]any{"key": []byte("bench/key/000123"),
		"value": bytes.Repeat([]byte{'v'}, 128), "token": 33, "lock": "bench/lock"}}})
	dec := msgpack.NewDecoder(nil)
	for _, tc := range []struct {
		name  string
		frame []byte
	}{{"get", get}, {"put", put}} {
		b.Run(tc.name+"/fast", func(b *testing.B) {
			for b.Loop() {
				m, _, _ := parseMessage(dec, tc.frame)
				var a args
				parseArgs(dec, m.params, &a)
			}
		})
		b.Run(tc.name+"/decoder", func(b *testing.B) {
			for b.Loop() {
				m, _, _ := decodeMessage(dec, tc.frame)
				var a args
				decodeArgs(dec, m.params, &a)
			}
		})
	}
}

// TestMethodSlots: every method has a slot of its own, so none is found
// by the map lookup methodOf falls back to; and the fallback finds them.
func TestMethodSlots(t *testing.T) {
	for name, info := range methodTable {
		if methodSlots[methodSlot([]byte(name))] != info {
			t.Errorf("method %q shares slot %d with %q: change methodSlot", name, methodSlot([]byte(name)), methodSlots[methodSlot([]byte(name))].name)
		}
		if methodOf([]byte(name)) != info {
			t.Errorf("methodOf(%q) is not its info", name)
		}
	}
	for _, name := range []string{"", "g", "gets", "nope", "Get"} {
		if methodOf([]byte(name)) != nil {
			t.Errorf("methodOf(%q) found a method", name)
		}
	}
}

// TestFieldGroups: every param is of exactly one type (or one of the two
// lists), and each accessor gives each field of its type a place of its
// own in args.
func TestFieldGroups(t *testing.T) {
	groups := []field{bytesFields, stringFields, uintFields, intFields, boolFields, fCompare, fOps}
	for name, f := range fields {
		in := 0
		for _, g := range groups {
			if f&g != 0 {
				in++
			}
		}
		if in != 1 {
			t.Errorf("param %q is in %d of the type groups; want 1", name, in)
		}
	}
	var a args
	seen := map[any]field{}
	place := func(f field) any {
		switch {
		case f&bytesFields != 0:
			return a.bytesOf(f)
		case f&stringFields != 0:
			return a.stringOf(f)
		case f&uintFields != 0:
			return a.uintOf(f)
		case f&intFields != 0:
			return a.intOf(f)
		case f&boolFields != 0:
			return a.boolOf(f)
		}
		return nil
	}
	for _, f := range fields {
		if p := place(f); p != nil {
			if g, dup := seen[p]; dup {
				t.Errorf("params %v and %v share a field of args", g, f)
			}
			seen[p] = f
		}
	}
}
