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
	r     *bufio.Reader
	max   int
	buf   []byte
	inMsg bool // next has read the first byte of a message and not yet returned it (see msgDeadline)
}

func newFrameReader(r io.Reader, max int) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// idle reports whether no bytes of a next message have arrived yet.
func (f *frameReader) idle() bool { return f.r.Buffered() == 0 }

// next reads one msgpack object. The returned slice is valid until the next
// call. io.EOF means the stream ended cleanly between messages.
func (f *frameReader) next() ([]byte, error) {
	defer func() { f.inMsg = false }()
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
		f.inMsg = true
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
	h, err := header(c)
	if err != nil || h.width == 0 {
		return h.body, h.children, err
	}
	n, err := f.length(int(h.width))
	body, children = h.counts(n)
	return body, children, err
}

// hdr is what a msgpack header byte says of its object: the body bytes
// and child objects that follow it, and, for the types whose length comes
// after the header byte, that length field's width and what it counts.
type hdr struct {
	body, children int   // fixed sizes, when width is 0
	width          uint8 // bytes of the big-endian length field after the header byte: 0, 1, 2 or 4
	kind           uint8 // what the length counts: lenBody, lenChildren, lenPairs or lenExt
}

const (
	lenBody     = iota // body bytes (str, bin)
	lenChildren        // child objects (array)
	lenPairs           // key-value pairs, two objects each (map)
	lenExt             // body bytes after a type byte (ext)
)

// counts turns the length n read after the header into body bytes and
// child objects.
func (h hdr) counts(n int) (body, children int) {
	switch h.kind {
	case lenChildren:
		return 0, n
	case lenPairs:
		return 0, 2 * n
	case lenExt:
		return n + 1, 0
	}
	return n, 0
}

// header describes the object that starts with header byte c.
func header(c byte) (hdr, error) {
	switch {
	case msgpcode.IsFixedNum(c), c == msgpcode.Nil, c == msgpcode.True, c == msgpcode.False:
		return hdr{}, nil
	case msgpcode.IsFixedMap(c):
		return hdr{children: 2 * int(c&msgpcode.FixedMapMask)}, nil
	case msgpcode.IsFixedArray(c):
		return hdr{children: int(c & msgpcode.FixedArrayMask)}, nil
	case msgpcode.IsFixedString(c):
		return hdr{body: int(c & msgpcode.FixedStrMask)}, nil
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Int8:
		return hdr{body: 1}, nil
	case msgpcode.Uint16, msgpcode.Int16:
		return hdr{body: 2}, nil
	case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
		return hdr{body: 4}, nil
	case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
		return hdr{body: 8}, nil
	case msgpcode.Str8, msgpcode.Bin8:
		return hdr{width: 1, kind: lenBody}, nil
	case msgpcode.Str16, msgpcode.Bin16:
		return hdr{width: 2, kind: lenBody}, nil
	case msgpcode.Str32, msgpcode.Bin32:
		return hdr{width: 4, kind: lenBody}, nil
	case msgpcode.Array16:
		return hdr{width: 2, kind: lenChildren}, nil
	case msgpcode.Array32:
		return hdr{width: 4, kind: lenChildren}, nil
	case msgpcode.Map16:
		return hdr{width: 2, kind: lenPairs}, nil
	case msgpcode.Map32:
		return hdr{width: 4, kind: lenPairs}, nil
	case msgpcode.FixExt1:
		return hdr{body: 2}, nil
	case msgpcode.FixExt2:
		return hdr{body: 3}, nil
	case msgpcode.FixExt4:
		return hdr{body: 5}, nil
	case msgpcode.FixExt8:
		return hdr{body: 9}, nil
	case msgpcode.FixExt16:
		return hdr{body: 17}, nil
	case msgpcode.Ext8:
		return hdr{width: 1, kind: lenExt}, nil
	case msgpcode.Ext16:
		return hdr{width: 2, kind: lenExt}, nil
	case msgpcode.Ext32:
		return hdr{width: 4, kind: lenExt}, nil
	}
	return hdr{}, fmt.Errorf("invalid msgpack code 0x%02x", c)
}

// beInt reads a header's big-endian length field.
func beInt(b []byte) int {
	n := 0
	for _, x := range b {
		n = n<<8 | int(x)
	}
	return n
}

// errShortFrame is returned by scanFrame when b holds only the start of a
// message: more bytes must arrive.
var errShortFrame = errors.New("incomplete message")

// scanFrame finds the msgpack object at the start of b, with the rules of
// frameReader.next: it returns the object's length, errShortFrame if b
// ends before it does, errFrameTooLarge as soon as the object is known to
// exceed max bytes (or b holds more than max bytes of it), errFrameDepth,
// or the error of an invalid header byte.
func scanFrame(b []byte, max int) (int, error) {
	var f frameScan
	return f.scan(b, max)
}

// frameScan frames the bytes of a message as they arrive (the event loop's
// reads): after errShortFrame it keeps how far it got, and the next scan,
// given the same bytes and more, goes on from there, so a message that
// arrives a byte at a time is walked once, not once per arrival. The zero
// value starts a message.
type frameScan struct {
	stack [maxDepth + 1]int // objects still to read at each depth
	depth int
	off   int // bytes of the message walked so far
	begun bool
}

// scan walks b, the bytes of one message from its start, from where the
// last scan stopped. It returns as scanFrame does; after anything but
// errShortFrame, f starts the next message.
func (f *frameScan) scan(b []byte, max int) (n int, err error) {
	if !f.begun {
		*f = frameScan{begun: true}
		f.stack[0] = 1
	}
	if f.off > len(b) {
		return 0, errShortFrame // the body of the last object taken is still arriving
	}
	for {
		for f.depth >= 0 && f.stack[f.depth] == 0 {
			f.depth--
		}
		if f.depth < 0 {
			n := f.off
			f.begun = false
			return n, nil
		}
		off := f.off
		if off >= len(b) {
			if off >= max {
				f.begun = false
				return 0, errFrameTooLarge
			}
			return 0, errShortFrame
		}
		h, err := header(b[off])
		if err != nil {
			f.begun = false
			return 0, err
		}
		off++
		body, children := h.body, h.children
		if h.width > 0 {
			w := int(h.width)
			if off+w > len(b) {
				if off+w > max {
					f.begun = false
					return 0, errFrameTooLarge
				}
				return 0, errShortFrame // the header again, with its length, next time
			}
			n := beInt(b[off : off+w])
			off += w
			body, children = h.counts(n)
		}
		if off+body > max {
			f.begun = false
			return 0, errFrameTooLarge
		}
		if children > 0 && f.depth == maxDepth {
			f.begun = false
			return 0, errFrameDepth
		}
		// The object's header is whole: take it.
		f.stack[f.depth]--
		f.off = off + body
		if children > 0 {
			f.depth++
			f.stack[f.depth] = children
		}
		if f.off > len(b) {
			return 0, errShortFrame // its body has yet to arrive
		}
	}
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
	return beInt(b[:w]), nil
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
