package wire

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// MessagePack-RPC has no framing of its own: messages are msgpack objects
// written back to back. frameReader cuts the stream into whole objects
// without decoding them, so a malformed message never desynchronises the
// stream and a header that claims gigabytes allocates nothing: bytes are
// kept only up to the message limit.

// errFrameTooLarge is returned by next when a message exceeds the limit;
// the bytes read so far (a prefix of the message) are returned with it.
var errFrameTooLarge = errors.New("message over the size limit")

// errFrameDepth is returned when a message nests arrays and maps deeper
// than maxDepth.
var errFrameDepth = errors.New("message nests too deep")

const maxDepth = 32

// frameChunk is how much of a str, bin or ext body is read at a time: the
// frame buffer grows with the bytes that have arrived, never ahead of them,
// so a header announcing a large body costs nothing until it is sent.
const frameChunk = 64 << 10

// frameKeep is the largest frame buffer kept between messages; a bigger
// one (left by a large message) is dropped when the next message starts,
// so an idle connection holds no more than this.
const frameKeep = 64 << 10

type frameReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

func newFrameReader(r io.Reader, max int) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// idle reports whether no bytes of a next message have arrived yet.
func (f *frameReader) idle() bool { return f.r.Buffered() == 0 }

// next reads one msgpack object. The returned slice is valid until the next
// call. io.EOF means the stream ended cleanly between messages.
func (f *frameReader) next() ([]byte, error) {
	if cap(f.buf) > frameKeep {
		f.buf = nil
	}
	f.buf = f.buf[:0]
	// stack[i] counts the objects still to read at depth i.
	var stack [maxDepth + 1]int
	depth := 0
	stack[0] = 1
	first := true
	for {
		for depth >= 0 && stack[depth] == 0 {
			depth--
		}
		if depth < 0 {
			return f.buf, nil
		}
		stack[depth]--
		c, err := f.r.ReadByte()
		if err != nil {
			if first && err == io.EOF {
				return nil, io.EOF
			}
			return f.buf, unexpected(err)
		}
		first = false
		if err := f.keep([]byte{c}); err != nil {
			return f.buf, err
		}
		n, children, err := f.size(c)
		if err != nil {
			return f.buf, err
		}
		if n > 0 {
			if err := f.body(n); err != nil {
				return f.buf, err
			}
		}
		if children > 0 {
			if depth == maxDepth {
				return f.buf, errFrameDepth
			}
			depth++
			stack[depth] = children
		}
	}
}

// size reads the length part of the header that starts with c and returns
// how many body bytes follow and how many child objects.
func (f *frameReader) size(c byte) (body, children int, err error) {
	switch {
	case msgpcode.IsFixedNum(c), c == msgpcode.Nil, c == msgpcode.True, c == msgpcode.False:
		return 0, 0, nil
	case msgpcode.IsFixedMap(c):
		return 0, 2 * int(c&msgpcode.FixedMapMask), nil
	case msgpcode.IsFixedArray(c):
		return 0, int(c & msgpcode.FixedArrayMask), nil
	case msgpcode.IsFixedString(c):
		return int(c & msgpcode.FixedStrMask), 0, nil
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Int8:
		return 1, 0, nil
	case msgpcode.Uint16, msgpcode.Int16:
		return 2, 0, nil
	case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
		return 4, 0, nil
	case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
		return 8, 0, nil
	case msgpcode.Str8, msgpcode.Bin8:
		n, err := f.length(1)
		return n, 0, err
	case msgpcode.Str16, msgpcode.Bin16:
		n, err := f.length(2)
		return n, 0, err
	case msgpcode.Str32, msgpcode.Bin32:
		n, err := f.length(4)
		return n, 0, err
	case msgpcode.Array16:
		n, err := f.length(2)
		return 0, n, err
	case msgpcode.Array32:
		n, err := f.length(4)
		return 0, n, err
	case msgpcode.Map16:
		n, err := f.length(2)
		return 0, 2 * n, err
	case msgpcode.Map32:
		n, err := f.length(4)
		return 0, 2 * n, err
	case msgpcode.FixExt1:
		return 2, 0, nil
	case msgpcode.FixExt2:
		return 3, 0, nil
	case msgpcode.FixExt4:
		return 5, 0, nil
	case msgpcode.FixExt8:
		return 9, 0, nil
	case msgpcode.FixExt16:
		return 17, 0, nil
	case msgpcode.Ext8:
		n, err := f.length(1)
		return n + 1, 0, err
	case msgpcode.Ext16:
		n, err := f.length(2)
		return n + 1, 0, err
	case msgpcode.Ext32:
		n, err := f.length(4)
		return n + 1, 0, err
	}
	return 0, 0, fmt.Errorf("invalid msgpack code 0x%02x", c)
}

// length reads a big-endian length of w bytes.
func (f *frameReader) length(w int) (int, error) {
	var b [4]byte
	if _, err := io.ReadFull(f.r, b[:w]); err != nil {
		return 0, unexpected(err)
	}
	if err := f.keep(b[:w]); err != nil {
		return 0, err
	}
	n := 0
	for _, x := range b[:w] {
		n = n<<8 | int(x)
	}
	return n, nil
}

// body reads n bytes of a str, bin or ext, refusing before it reads past
// the limit. It reads frameChunk bytes at a time and grows the buffer only
// for what it is about to read.
func (f *frameReader) body(n int) error {
	if len(f.buf)+n > f.max {
		return errFrameTooLarge
	}
	for n > 0 {
		k := min(n, frameChunk)
		start := len(f.buf)
		f.grow(k)
		f.buf = f.buf[:start+k]
		if _, err := io.ReadFull(f.r, f.buf[start:]); err != nil {
			f.buf = f.buf[:start]
			return unexpected(err)
		}
		n -= k
	}
	return nil
}

// grow makes room for k more bytes, doubling the buffer but never past the
// message limit.
func (f *frameReader) grow(k int) {
	need := len(f.buf) + k
	if need <= cap(f.buf) {
		return
	}
	buf := make([]byte, len(f.buf), min(max(need, 2*cap(f.buf)), f.max))
	copy(buf, f.buf)
	f.buf = buf
}

func (f *frameReader) keep(b []byte) error {
	if len(f.buf)+len(b) > f.max {
		return errFrameTooLarge
	}
	f.buf = append(f.buf, b...)
	return nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
