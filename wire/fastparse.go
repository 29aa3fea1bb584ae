package wire

import (
	"encoding/binary"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The fast parse. Requests are nearly always laid out one way: a fixarray
// of 4 (or 3), a small type and msgid, a method name as a short str, and
// params holding one map whose names are strs and whose values are nil,
// str, bin, integers or booleans. fastMessage and fastArgs parse those
// straight from the frame's bytes, without the msgpack decoder, whose
// per-value calls through an io.Reader were a third of what parsing a get
// cost. Anything else (a compare or ops list, an unusual width, bad input)
// makes them report false, and parseMessage and parseArgs parse it with the
// decoder: so the fast parse never refuses anything, every refusal is the
// decoder path's, and both accept the same requests with the same result
// (TestFastParse checks it on the fuzz seeds and random messages).

// mpStr returns the bounds of the str or bin at b[i:] and the index after
// it, for the codes parse accepts as strings (str, bin), or ok false.
func mpStr(b []byte, i int) (start, end int, ok bool) {
	if i >= len(b) || !msgpcode.IsString(b[i]) && !msgpcode.IsBin(b[i]) {
		return 0, 0, false
	}
	h, _ := header(b[i]) // frame.go: a str's or bin's length
	n, w := h.body, int(h.width)
	i++
	if i+w > len(b) {
		return 0, 0, false
	}
	if w > 0 {
		n = beInt(b[i : i+w])
	}
	i += w
	if n > len(b)-i {
		return 0, 0, false
	}
	return i, i + n, true
}

// mpInt reads the integer at b[i:]: its value as an int64 if it fits
// (neg), or as a uint64, and the index after it.
func mpInt(b []byte, i int) (v uint64, neg bool, next int, ok bool) {
	if i >= len(b) {
		return 0, false, 0, false
	}
	c := b[i]
	size := 0
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		return uint64(c), false, i + 1, true
	case c >= msgpcode.NegFixedNumLow:
		return uint64(int64(int8(c))), true, i + 1, true
	case c == msgpcode.Uint8 || c == msgpcode.Int8:
		size = 1
	case c == msgpcode.Uint16 || c == msgpcode.Int16:
		size = 2
	case c == msgpcode.Uint32 || c == msgpcode.Int32:
		size = 4
	case c == msgpcode.Uint64 || c == msgpcode.Int64:
		size = 8
	default:
		return 0, false, 0, false
	}
	if i+1+size > len(b) {
		return 0, false, 0, false
	}
	p := b[i+1:]
	switch c {
	case msgpcode.Uint8:
		v = uint64(p[0])
	case msgpcode.Uint16:
		v = uint64(binary.BigEndian.Uint16(p))
	case msgpcode.Uint32:
		v = uint64(binary.BigEndian.Uint32(p))
	case msgpcode.Uint64:
		v = binary.BigEndian.Uint64(p)
	case msgpcode.Int8:
		v = uint64(int64(int8(p[0])))
	case msgpcode.Int16:
		v = uint64(int64(int16(binary.BigEndian.Uint16(p))))
	case msgpcode.Int32:
		v = uint64(int64(int32(binary.BigEndian.Uint32(p))))
	case msgpcode.Int64:
		v = binary.BigEndian.Uint64(p)
	}
	neg = c >= msgpcode.Int8 && c <= msgpcode.Int64 && int64(v) < 0
	return v, neg, i + 1 + size, true
}

// fastUint is decodeUint's fast path: a non-negative integer.
func fastUint(b []byte, i int) (uint64, int, bool) {
	v, neg, next, ok := mpInt(b, i)
	return v, next, ok && !neg
}

// fastInt is decodeInt's fast path: an integer that fits an int64.
func fastInt(b []byte, i int) (int64, int, bool) {
	v, neg, next, ok := mpInt(b, i)
	return int64(v), next, ok && (neg || v <= math.MaxInt64)
}

// fastMessage is parseMessage for the usual layout; ok false: parse it
// with the decoder.
func fastMessage(frame []byte) (m message, ok bool) {
	m, i, ok := fastHead(frame)
	if !ok {
		return m, false
	}
	switch frame[i] {
	case 0x90:
	case 0x91:
		raw := frame[i+1:]
		if len(raw) == 0 {
			return m, false
		}
		if raw[0] != msgpcode.Nil {
			m.params = raw
		}
	default:
		return m, false
	}
	return m, true
}

// fastHead parses a message in the usual layout from the start of b up
// to its params array: it returns the message without params, and the
// index of the params array's header, which b holds.
func fastHead(b []byte) (m message, params int, ok bool) {
	if len(b) < 4 {
		return m, 0, false
	}
	i := 2
	switch {
	case b[0] == 0x94 && b[1] == typeRequest:
		id, next, ok := fastUint(b, i)
		if !ok || id > math.MaxUint32 {
			return m, 0, false
		}
		m.msgid, i = uint32(id), next
	case b[0] == 0x93 && b[1] == typeNotification:
	default:
		return m, 0, false
	}
	m.typ = int(b[1])
	start, end, ok := mpStr(b, i)
	if !ok || end >= len(b) {
		return m, 0, false
	}
	m.named(b[start:end])
	return m, end, true
}

// fastFrame is the event loop's fast parse: it parses the message at the
// start of b, which may hold less or more than one, and its params into
// a, without framing it first (the frame scan walked each message once
// more). It returns the message and its length, or ok false if b does
// not start with a whole message in the usual layout: then frame it and
// parse it the usual way. With borrow, a's byte arguments are slices of
// b (args.own copies them).
func fastFrame(b []byte, a *args, borrow bool) (m message, n int, ok bool) {
	m, i, ok := fastHead(b)
	if !ok {
		return m, 0, false
	}
	switch {
	case b[i] == 0x90:
		return m, i + 1, true
	case b[i] != 0x91 || i+1 >= len(b):
		return m, 0, false
	case b[i+1] == msgpcode.Nil:
		return m, i + 2, true
	}
	k, ok := fastMap(b[i+1:], a, borrow)
	if !ok {
		return m, 0, false
	}
	m.params = b[i+1 : i+1+k]
	return m, i + 1 + k, true
}

// fastArgs is parseArgs for the usual params map; ok false: parse it with
// the decoder (into a fresh args: a may be half filled).
func fastArgs(raw []byte, a *args) bool {
	_, ok := fastMap(raw, a, false)
	return ok
}

// fastMap parses the params map at the start of raw into a, and returns
// its length. The byte arguments are copies, or with borrow slices of raw.
func fastMap(raw []byte, a *args, borrow bool) (int, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	n, i := 0, 1
	switch c := raw[0]; {
	case c >= msgpcode.FixedMapLow && c <= msgpcode.FixedMapHigh:
		n = int(c & msgpcode.FixedMapMask)
	case c == msgpcode.Map16 && len(raw) >= 3:
		n, i = int(binary.BigEndian.Uint16(raw[1:])), 3
	default:
		return 0, false
	}
	var own arena
	a.borrowed = borrow
	for range n {
		ks, ke, ok := mpStr(raw, i)
		if !ok || ke >= len(raw) {
			return 0, false
		}
		i = ke
		if raw[i] == msgpcode.Nil {
			i++
			continue
		}
		f := fieldOf(raw[ks:ke])
		a.has |= f
		switch {
		case f&bytesFields != 0:
			vs, ve, ok := mpStr(raw, i)
			if !ok {
				return 0, false
			}
			if borrow {
				*a.bytesOf(f) = raw[vs:ve:ve]
			} else {
				*a.bytesOf(f) = own.take(raw[vs:ve], len(raw)-i)
			}
			i = ve
		case f&stringFields != 0:
			vs, ve, ok := mpStr(raw, i)
			if !ok {
				return 0, false
			}
			*a.stringOf(f) = string(raw[vs:ve])
			i = ve
		case f&uintFields != 0:
			v, next, ok := fastUint(raw, i)
			if !ok {
				return 0, false
			}
			*a.uintOf(f) = v
			i = next
		case f&intFields != 0:
			v, next, ok := fastInt(raw, i)
			if !ok {
				return 0, false
			}
			*a.intOf(f) = v
			i = next
		case f&boolFields != 0:
			if raw[i] != msgpcode.True && raw[i] != msgpcode.False {
				return 0, false
			}
			*a.boolOf(f) = raw[i] == msgpcode.True
			i++
		case f == 0:
			// An unknown name: skip a scalar, a str or a bin.
			if _, ve, ok := mpStr(raw, i); ok {
				i = ve
			} else if _, _, next, ok := mpInt(raw, i); ok {
				i = next
			} else if c := raw[i]; c == msgpcode.True || c == msgpcode.False {
				i++
			} else {
				return 0, false
			}
		default: // compare, ops
			return 0, false
		}
	}
	return i, true
}

// take copies v into the arena; when it has no room, it makes one for
// left bytes (what is left of the params: the first byte param sizes it
// for them all).
func (ar *arena) take(v []byte, left int) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	if cap(*ar)-len(*ar) < len(v) {
		*ar = make([]byte, 0, left)
	}
	n := len(*ar)
	*ar = append(*ar, v...)
	return (*ar)[n : n+len(v) : n+len(v)]
}

// own gives a's byte arguments, borrowed from a frame (fastFrame), memory
// of their own, in one allocation: for a request that outlives the frame.
func (a *args) own() {
	if !a.borrowed {
		return
	}
	a.borrowed = false
	left := 0
	for m := bytesFields; m != 0; m &= m - 1 { // each field, m & -m
		left += len(*a.bytesOf(m & -m))
	}
	var ar arena
	for m := bytesFields; m != 0; m &= m - 1 {
		if p := a.bytesOf(m & -m); *p != nil {
			*p = ar.take(*p, left)
			left -= len(*p)
		}
	}
}

// fieldOf is fields[string(name)], as a switch the compiler turns into a
// few comparisons.
func fieldOf(name []byte) field {
	switch string(name) {
	case "key":
		return fKey
	case "value":
		return fValue
	case "prefix":
		return fPrefix
	case "start":
		return fStart
	case "lock":
		return fLock
	case "holder":
		return fHolder
	case "token":
		return fToken
	case "revision":
		return fRevision
	case "delta":
		return fDelta
	case "limit":
		return fLimit
	case "ttl_ms":
		return fTTL
	case "wait_ms":
		return fWait
	case "lock_delay_ms":
		return fLockDelay
	case "strict":
		return fStrict
	case "consistency":
		return fConsistency
	case "since":
		return fSince
	case "compare":
		return fCompare
	case "ops":
		return fOps
	case "locks":
		return fLocks
	case "start_revision":
		return fStartRev
	case "watch_id":
		return fWatchID
	case "offset":
		return fOffset
	case "name":
		return fName
	case "secret":
		return fSecret
	}
	return 0
}

// The fields of args, by the field that names them (each accessor takes
// the fields of one type: codec.go's bytesFields, stringFields...).

func (a *args) bytesOf(f field) *[]byte {
	switch f {
	case fKey:
		return &a.key
	case fValue:
		return &a.value
	case fPrefix:
		return &a.prefix
	case fStart:
		return &a.start
	}
	return &a.secret // fSecret
}

func (a *args) stringOf(f field) *string {
	switch f {
	case fLock:
		return &a.lock
	case fHolder:
		return &a.holder
	case fConsistency:
		return &a.consistency
	}
	return &a.name // fName
}

func (a *args) uintOf(f field) *uint64 {
	switch f {
	case fToken:
		return &a.token
	case fRevision:
		return &a.revision
	case fOffset:
		return &a.offset
	case fSince:
		return &a.since
	case fStartRev:
		return &a.startRev
	}
	return &a.watchID // fWatchID
}

func (a *args) intOf(f field) *int64 {
	switch f {
	case fDelta:
		return &a.delta
	case fLimit:
		return &a.limit
	case fTTL:
		return &a.ttlMs
	case fWait:
		return &a.waitMs
	}
	return &a.delayMs // fLockDelay
}

func (a *args) boolOf(f field) *bool {
	if f == fLocks {
		return &a.locks
	}
	return &a.strict // fStrict
}
