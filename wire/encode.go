package wire

import (
	"encoding/binary"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Appending msgpack. The encoder's methods below shadow those of the
// msgpack.Encoder it embeds, for the values every answer is made of: they
// append to the encoder's buffer directly, where the msgpack encoder makes
// a call through an io.Writer for each code and each payload (its calls
// were about a twentieth of the server's CPU per get). They write the same
// bytes as msgpack's (TestAppendMatchesMsgpack); anything else, such as
// Encode of a whole value, still goes through the embedded encoder, into
// the same buffer.

func (e *encoder) EncodeNil() error {
	e.buf.WriteByte(msgpcode.Nil)
	return nil
}

func (e *encoder) EncodeBool(v bool) error {
	if v {
		e.buf.WriteByte(msgpcode.True)
	} else {
		e.buf.WriteByte(msgpcode.False)
	}
	return nil
}

func (e *encoder) EncodeUint(n uint64) error {
	e.buf.Write(appendUint(e.buf.AvailableBuffer(), n))
	return nil
}

func (e *encoder) EncodeInt(n int64) error {
	e.buf.Write(appendInt(e.buf.AvailableBuffer(), n))
	return nil
}

func (e *encoder) EncodeString(s string) error {
	e.buf.Write(appendStrLen(e.buf.AvailableBuffer(), len(s)))
	e.buf.WriteString(s)
	return nil
}

func (e *encoder) EncodeBytes(v []byte) error {
	if v == nil {
		return e.EncodeNil()
	}
	e.buf.Write(appendLen(e.buf.AvailableBuffer(), len(v), 0, msgpcode.Bin8, msgpcode.Bin16, msgpcode.Bin32))
	e.buf.Write(v)
	return nil
}

func (e *encoder) EncodeArrayLen(n int) error {
	e.buf.Write(appendLen(e.buf.AvailableBuffer(), n, 16, msgpcode.FixedArrayLow, msgpcode.Array16, msgpcode.Array32))
	return nil
}

func (e *encoder) EncodeMapLen(n int) error {
	e.buf.Write(appendLen(e.buf.AvailableBuffer(), n, 16, msgpcode.FixedMapLow, msgpcode.Map16, msgpcode.Map32))
	return nil
}

// appendUint appends n in the fewest bytes, as msgpack's EncodeUint.
func appendUint(b []byte, n uint64) []byte {
	switch {
	case n <= math.MaxInt8:
		return append(b, byte(n))
	case n <= math.MaxUint8:
		return append(b, msgpcode.Uint8, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Uint16), uint16(n))
	case n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Uint32), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Uint64), n)
}

// appendInt appends n in the fewest bytes, as msgpack's EncodeInt.
func appendInt(b []byte, n int64) []byte {
	switch {
	case n >= 0:
		return appendUint(b, uint64(n))
	case n >= int64(int8(msgpcode.NegFixedNumLow)):
		return append(b, byte(n))
	case n >= math.MinInt8:
		return append(b, msgpcode.Int8, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Int16), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Int32), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Int64), uint64(n))
}

// appendStrLen appends a str's header, as msgpack's EncodeString.
func appendStrLen(b []byte, n int) []byte {
	if n < 32 {
		return append(b, msgpcode.FixedStrLow|byte(n))
	}
	return appendLen(b, n, 0, msgpcode.Str8, msgpcode.Str16, msgpcode.Str32)
}

// appendLen appends the header of a collection or payload of length n:
// code8 with n folded in if n < fixed, else code8 (when a length byte
// follows it, for fixed 0), code16 or code32 and the length.
func appendLen(b []byte, n, fixed int, code8, code16, code32 byte) []byte {
	switch {
	case n < fixed:
		return append(b, code8|byte(n))
	case fixed == 0 && n <= math.MaxUint8:
		return append(b, code8, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, code16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, code32), uint32(n))
}
