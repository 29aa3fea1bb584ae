package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Message types of MessagePack-RPC.
const (
	typeRequest      = 0
	typeResponse     = 1
	typeNotification = 2
)

// message is a parsed request or notification. params is the raw msgpack
// of the single params map, or nil when the params array was empty.
type message struct {
	typ    int
	msgid  uint32
	method string
	info   *methodInfo // nil: a method the server does not know
	began  time.Time   // when it was read, for Config.Observe (zero without)
	params []byte
	slot   bool  // it holds one of its connection's in-flight slots
	held   int64 // what its arguments count against the connection's budget
	inline bool  // served by the event loop goroutine itself: answered at the end of its round
	// forwarded: read after its connection's forwarding message (another
	// cluster node forwards it: see Forwarded).
	forwarded bool
}

// errNoID is returned by parseMessage when the message is so malformed
// that no msgid could be read: the connection cannot be answered.
var errNoID = errors.New("malformed message: no msgid")

// parseMessage parses a frame: one whole msgpack object, as frameReader
// returns. A non-nil error with hasID set can be answered with an error
// response to m.msgid; without it, the connection should be closed.
// m.params is a slice of frame, not a copy.
func parseMessage(dec *msgpack.Decoder, frame []byte) (m message, hasID bool, err error) {
	if m, ok := fastMessage(frame); ok { // fastparse.go
		return m, m.typ == typeRequest, nil
	}
	return decodeMessage(dec, frame)
}

// decodeMessage is parseMessage with the msgpack decoder, for every layout.
func decodeMessage(dec *msgpack.Decoder, frame []byte) (m message, hasID bool, err error) {
	r := resetDecoder(dec, frame)
	n, err := dec.DecodeArrayLen()
	if err != nil || (n != 4 && n != 3) {
		return m, false, fmt.Errorf("%w: want an array of 3 or 4, got %d (%v)", errNoID, n, err)
	}
	typ, err := decodeInt(dec)
	if err != nil {
		return m, false, fmt.Errorf("%w: type: %v", errNoID, err)
	}
	m.typ = int(typ)
	switch {
	case typ == typeRequest && n == 4:
		id, err := decodeUint(dec)
		if err != nil || id > math.MaxUint32 {
			return m, false, fmt.Errorf("%w: msgid: %v", errNoID, err)
		}
		m.msgid = uint32(id)
		hasID = true
	case typ == typeNotification && n == 3:
	default:
		return m, false, fmt.Errorf("%w: message type %d with %d elements", errNoID, typ, n)
	}
	name, err := rawString(dec, r, frame)
	if err != nil {
		return m, hasID, badRequest("method must be a string")
	}
	m.named(name)
	np, err := dec.DecodeArrayLen()
	if err != nil {
		return m, hasID, badRequest("params must be an array")
	}
	switch np {
	case -1, 0:
		return m, hasID, nil
	case 1:
		// params is the message's last element, so its one element is
		// the rest of the frame: no need to decode (and copy) it here.
		raw := frame[len(frame)-r.Len():]
		if len(raw) == 0 {
			return m, hasID, badRequest("params: missing element")
		}
		if raw[0] != msgpcode.Nil {
			m.params = raw
		}
		return m, hasID, nil
	}
	return m, hasID, badRequest("params must be an array holding one map, got %d elements", np)
}

// resetDecoder points dec at b, and returns the reader it reads b from.
// The decoder of a connection parses every frame: it reuses the
// *bytes.Reader it read the last one from, rather than allocating one per
// frame (and one more per params map).
func resetDecoder(dec *msgpack.Decoder, b []byte) *bytes.Reader {
	r, ok := dec.Buffered().(*bytes.Reader)
	if ok {
		r.Reset(b)
	} else {
		r = bytes.NewReader(b)
	}
	dec.Reset(r)
	return r
}

// rawString reads a str (or bin, or nil: empty) as DecodeString does, but
// returns it as a slice of b, the bytes r reads, rather than a new string:
// valid only while b is. dec must read from r (resetDecoder).
func rawString(dec *msgpack.Decoder, r *bytes.Reader, b []byte) ([]byte, error) {
	n, err := dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	n = max(n, 0) // nil
	if n > r.Len() {
		return nil, io.ErrUnexpectedEOF
	}
	at := len(b) - r.Len()
	r.Seek(int64(n), io.SeekCurrent)
	return b[at : at+n : at+n], nil
}

// named sets m's method from its name in the frame: a known method's
// info, and its name without an allocation.
func (m *message) named(name []byte) {
	if m.info = methodOf(name); m.info != nil {
		m.method = m.info.name
	} else {
		m.method = string(name)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func badRequest(format string, args ...any) *fencekv.Error {
	return &fencekv.Error{Code: fencekv.CodeBadRequest, Message: fmt.Sprintf(format, args...)}
}

// field names one named argument, as a bit of args.has.
type field uint32

const (
	fKey field = 1 << iota
	fValue
	fPrefix
	fStart
	fLock
	fHolder
	fToken
	fRevision
	fDelta
	fLimit
	fTTL
	fWait
	fLockDelay
	fStrict
	fConsistency
	fSince
	fCompare
	fOps
	fLocks
	fStartRev
	fWatchID
	fOffset
	fName   // auth
	fSecret // auth
)

// The params by type: what the parsers (decodeArgs, fastMap) read each
// as, and which of args' accessors (fastparse.go) holds it. compare and
// ops are lists, which only decodeArgs reads.
const (
	bytesFields  = fKey | fValue | fPrefix | fStart | fSecret
	stringFields = fLock | fHolder | fConsistency | fName
	uintFields   = fToken | fRevision | fOffset | fSince | fStartRev | fWatchID
	intFields    = fDelta | fLimit | fTTL | fWait | fLockDelay
	boolFields   = fLocks | fStrict
)

// fields maps the protocol's param names to their bits.
var fields = map[string]field{
	"key": fKey, "value": fValue, "prefix": fPrefix, "start": fStart, "lock": fLock, "holder": fHolder,
	"token": fToken, "revision": fRevision, "delta": fDelta, "limit": fLimit, "ttl_ms": fTTL,
	"wait_ms": fWait, "lock_delay_ms": fLockDelay, "strict": fStrict, "consistency": fConsistency, "since": fSince,
	"compare": fCompare, "ops": fOps, "locks": fLocks, "start_revision": fStartRev, "watch_id": fWatchID,
	"offset": fOffset,
	"name":   fName, "secret": fSecret,
}

func (f field) String() string {
	for name, bit := range fields {
		if bit == f {
			return name
		}
	}
	return "?"
}

// args are the named arguments of every method. has records which were
// given (and not nil).
type args struct {
	key, value, prefix, start []byte
	lock, holder              string
	token, revision           uint64
	delta, limit              int64
	ttlMs, waitMs, delayMs    int64
	strict                    bool
	consistency               string
	since                     uint64
	compares                  []fencekv.Compare
	locks                     bool
	startRev, watchID         uint64
	ops                       []fencekv.TxnOp
	offset                    uint64
	name                      string // auth
	secret                    []byte // auth
	has                       field
	borrowed                  bool // byte arguments are slices of the frame (fastFrame)

	acquireOpts fencekv.AcquireOptions // what acquire passes the engine (server_methods.go)
}

// size is the memory the arguments hold: their bytes (a txn's ops and
// compares too, each with its struct), plus the struct.
func (a *args) size() int64 {
	n := int64(len(a.key)+len(a.value)+len(a.prefix)+len(a.start)+len(a.lock)+len(a.holder)+len(a.name)+len(a.secret)) + entryOverhead
	for _, op := range a.ops {
		n += int64(len(op.Key)+len(op.Value)) + int64(unsafe.Sizeof(op))
	}
	for _, c := range a.compares {
		n += int64(len(c.Key)) + int64(unsafe.Sizeof(c))
	}
	return n
}

// parseArgs decodes the params map into a, which is zero. Unknown fields
// are ignored, so newer clients can talk to older servers; a field of the
// wrong type is bad_request.
func parseArgs(dec *msgpack.Decoder, raw []byte, a *args) error {
	if raw == nil {
		return nil
	}
	if fastArgs(raw, a) { // fastparse.go
		return nil
	}
	*a = args{} // the fast parse may have filled part of it
	return decodeArgs(dec, raw, a)
}

// decodeArgs is parseArgs with the msgpack decoder, for every params map.
func decodeArgs(dec *msgpack.Decoder, raw []byte, a *args) error {
	r := resetDecoder(dec, raw)
	var own arena
	n, err := dec.DecodeMapLen()
	if err != nil {
		return badRequest("params must be an array holding one map")
	}
	for i := 0; i < n; i++ {
		name, err := rawString(dec, r, raw)
		if err != nil {
			return badRequest("param names must be strings")
		}
		if c, _ := dec.PeekCode(); c == msgpcode.Nil {
			dec.Skip()
			continue
		}
		f := fieldOf(name)
		a.has |= f
		switch {
		case f&bytesFields != 0:
			*a.bytesOf(f), err = own.bytes(dec, r, raw)
		case f&stringFields != 0:
			*a.stringOf(f), err = decodeString(dec, r, raw)
		case f&uintFields != 0:
			*a.uintOf(f), err = decodeUint(dec)
		case f&intFields != 0:
			*a.intOf(f), err = decodeInt(dec)
		case f&boolFields != 0:
			if *a.boolOf(f), err = dec.DecodeBool(); err != nil {
				err = errors.New("want a boolean")
			}
		case f == fCompare:
			a.compares, err = decodeCompares(dec)
		case f == fOps:
			a.ops, err = decodeOps(dec)
		default:
			err = dec.Skip()
		}
		if err != nil {
			return badRequest("param %q: %v", name, err)
		}
	}
	return nil
}

// decodeString reads a str or bin as decodeBytes does, into a string of
// its own (one allocation, not a []byte and then a string).
func decodeString(dec *msgpack.Decoder, r *bytes.Reader, b []byte) (string, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return "", errors.New("want str or bin")
	}
	s, err := rawString(dec, r, b)
	return string(s), err
}

// arena holds copies of the byte params of one request (key, value...),
// which the args must own (the frame is reused): all of them in one
// allocation.
type arena []byte

// bytes reads a str or bin as decodeBytes does, into the arena. b is the
// bytes r reads, as for rawString.
func (ar *arena) bytes(dec *msgpack.Decoder, r *bytes.Reader, b []byte) ([]byte, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return nil, err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return nil, errors.New("want str or bin")
	}
	// What is left of the params holds this and every later byte
	// param: the first one sizes the arena for them all.
	left := r.Len()
	v, err := rawString(dec, r, b)
	if err != nil {
		return []byte{}, err
	}
	return ar.take(v, left), nil
}

func decodeBytes(dec *msgpack.Decoder) ([]byte, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return nil, err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return nil, errors.New("want str or bin")
	}
	b, err := dec.DecodeBytes()
	if b == nil && err == nil {
		b = []byte{}
	}
	return b, err
}

func isUintCode(c byte) bool {
	return msgpcode.IsFixedNum(c) && c <= msgpcode.PosFixedNumHigh ||
		c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32 || c == msgpcode.Uint64
}

func isIntCode(c byte) bool {
	return msgpcode.IsFixedNum(c) || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64 ||
		c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32 || c == msgpcode.Uint64
}

// decodeUint decodes a non-negative integer of any msgpack width.
func decodeUint(dec *msgpack.Decoder) (uint64, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if isUintCode(c) {
		return dec.DecodeUint64()
	}
	if isIntCode(c) {
		v, err := dec.DecodeInt64()
		if err == nil && v < 0 {
			return 0, errors.New("want a non-negative integer")
		}
		return uint64(v), err
	}
	return 0, errors.New("want an integer")
}

// decodeInt decodes a signed 64-bit integer of any msgpack width.
func decodeInt(dec *msgpack.Decoder) (int64, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if !isIntCode(c) {
		return 0, errors.New("want an integer")
	}
	if c == msgpcode.Uint64 {
		v, err := dec.DecodeUint64()
		if err == nil && v > math.MaxInt64 {
			return 0, errors.New("integer out of range")
		}
		return int64(v), err
	}
	return dec.DecodeInt64()
}

func ms(n int64) time.Duration {
	if n > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	if n < math.MinInt64/int64(time.Millisecond) {
		return math.MinInt64
	}
	return time.Duration(n) * time.Millisecond
}

// toMs rounds a remaining duration up to whole milliseconds, so that a
// live lease never reports 0.
func toMs(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// encoder writes msgpack maps of results and errors.
type encoder struct {
	*msgpack.Encoder
	buf     bytes.Buffer
	entryFn func(fencekv.Entry) // e.entry, made once (get)
}

func newEncoder() *encoder {
	e := &encoder{}
	e.Encoder = msgpack.NewEncoder(&e.buf)
	e.entryFn = e.entry
	return e
}

// The field writers ignore the encoder's errors: writing to a bytes.Buffer
// cannot fail.
func (e *encoder) str(k, v string) {
	e.EncodeString(k)
	e.EncodeString(v)
}
func (e *encoder) bin(k string, v []byte) {
	e.EncodeString(k)
	e.EncodeBytes(v)
}
func (e *encoder) uint(k string, v uint64) {
	e.EncodeString(k)
	e.EncodeUint(v)
}
func (e *encoder) int(k string, v int64) {
	e.EncodeString(k)
	e.EncodeInt(v)
}
func (e *encoder) bool(k string, v bool) {
	e.EncodeString(k)
	e.EncodeBool(v)
}

// response starts a response: [1, msgid, error, result].
func (e *encoder) response(msgid uint32) {
	e.buf.Reset()
	e.EncodeArrayLen(4)
	e.EncodeUint(typeResponse)
	e.EncodeUint(uint64(msgid))
}

// maxErrorMessage is the longest error message sent; a longer one (it may
// quote a lock name or method name of any length) is cut, so that every
// answer but a read's is small.
const maxErrorMessage = 1 << 10

// errorMap writes a refusal as {"code", "message", facts...}; each code
// carries the facts listed in PROTOCOL.md.
func (e *encoder) errorMap(err *fencekv.Error) {
	msg := err.Message
	if msg == "" {
		msg = string(err.Code)
	}
	if len(msg) > maxErrorMessage {
		cut := maxErrorMessage - len("...")
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "..."
	}
	n := 2
	switch err.Code {
	case fencekv.CodeStaleToken, fencekv.CodeNotHolder, fencekv.CodeLeaseExpired,
		fencekv.CodeCompareFailed, fencekv.CodeNotLeader, fencekv.CodeCompacted:
		n = 3
	case fencekv.CodeLockHeld:
		n = 5
	case fencekv.CodeUnavailable:
		if err.Outcome != "" {
			n = 3
		}
	}
	// In a txn, the refusals about one key name it.
	withKey := err.Key != "" && (err.Code == fencekv.CodeStaleToken || err.Code == fencekv.CodeCompareFailed || err.Code == fencekv.CodeNotInteger)
	if withKey {
		n++
	}
	e.EncodeMapLen(n)
	e.str("code", string(err.Code))
	e.str("message", msg)
	if withKey {
		e.bin("key", []byte(err.Key))
	}
	switch err.Code {
	case fencekv.CodeStaleToken:
		e.uint("fence", uint64(err.Fence))
	case fencekv.CodeNotHolder, fencekv.CodeLeaseExpired:
		e.uint("token", uint64(err.Token))
	case fencekv.CodeLockHeld:
		e.str("holder", err.Holder)
		e.uint("token", uint64(err.Token))
		e.int("retry_ms", toMs(err.RetryAfter))
	case fencekv.CodeCompareFailed, fencekv.CodeCompacted:
		e.uint("revision", uint64(err.Revision))
	case fencekv.CodeNotLeader:
		e.str("leader", err.Leader)
	case fencekv.CodeUnavailable:
		if err.Outcome != "" {
			e.str("outcome", err.Outcome)
		}
	}
}

// asError turns any error into a refusal to put on the wire.
func asError(err error) *fencekv.Error {
	var fe *fencekv.Error
	if errors.As(err, &fe) {
		return fe
	}
	return &fencekv.Error{Code: fencekv.CodeUnavailable, Message: err.Error()}
}

// maxTxnItems bounds the arrays of a txn before they are allocated (the
// engine's own limit, 128 by default, is checked after).
const maxTxnItems = 1 << 12

func decodeArrayLen(dec *msgpack.Decoder) (int, error) {
	n, err := dec.DecodeArrayLen()
	switch {
	case err != nil:
		return 0, errors.New("want an array")
	case n > maxTxnItems:
		return 0, fmt.Errorf("%d items; at most %d", n, maxTxnItems)
	}
	return max(n, 0), nil
}

// decodeCompares reads a txn's compare: [{key, revision}].
func decodeCompares(dec *msgpack.Decoder) ([]fencekv.Compare, error) {
	n, err := decodeArrayLen(dec)
	if err != nil {
		return nil, err
	}
	out := make([]fencekv.Compare, n)
	for i := range out {
		err := eachMapField(dec, func(k string) (err error) {
			switch k {
			case "key":
				out[i].Key, err = decodeBytes(dec)
			case "revision":
				var r uint64
				r, err = decodeUint(dec)
				out[i].Revision = fencekv.Revision(r)
			default:
				err = dec.Skip()
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("compare %d: %v", i, err)
		}
	}
	return out, nil
}

// decodeOps reads a txn's ops: [{op, key, value?, delta?}].
func decodeOps(dec *msgpack.Decoder) ([]fencekv.TxnOp, error) {
	n, err := decodeArrayLen(dec)
	if err != nil {
		return nil, err
	}
	out := make([]fencekv.TxnOp, n)
	for i := range out {
		op := &out[i]
		err := eachMapField(dec, func(k string) (err error) {
			switch k {
			case "op":
				var b []byte
				b, err = decodeBytes(dec)
				switch string(b) {
				case "put":
					op.Op = state.OpPut
				case "delete":
					op.Op = state.OpDelete
				case "incr":
					op.Op = state.OpIncr
				default:
					err = fmt.Errorf("op %.32q: want put, delete or incr", b)
				}
			case "key":
				op.Key, err = decodeBytes(dec)
			case "value":
				op.Value, err = decodeBytes(dec)
			case "delta":
				op.Delta, err = decodeInt(dec)
			default:
				err = dec.Skip()
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("op %d: %v", i, err)
		}
		if op.Op == 0 {
			return nil, fmt.Errorf("op %d: missing \"op\"", i)
		}
	}
	return out, nil
}

// eachMapField reads a map with string keys, calling fn for each key with
// the decoder at its value.
func eachMapField(dec *msgpack.Decoder, fn func(key string) error) error {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return errors.New("want a map")
	}
	for range max(n, 0) {
		k, err := dec.DecodeString()
		if err != nil {
			return errors.New("map keys must be strings")
		}
		if err := fn(k); err != nil {
			return err
		}
	}
	return nil
}
