package state

import (
	"encoding/binary"

	"fmt"
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
)

// Op names a command. The set is closed: these are the only ways the state
// changes (G5).
type Op uint8

// The commands.
const (
	OpPut     Op = iota + 1 // Key, Value, Write, Lock
	OpDelete                // Key, Write, Lock
	OpCAS                   // Key, Revision, Value, Write, Lock
	OpIncr                  // Key, Delta, Write, Lock
	OpAcquire               // Lease
	OpRenew                 // Lease.Name, Token
	OpRelease               // Lease.Name, Token
	OpExpire                // Lease.Name: apply what is due on the lock at Now (a no-op from an older Term)
	OpRearm                 // every lease its full TTL again from Now; Term becomes the machine's term; Token, if set, is a floor for the token sequence
	OpTxn                   // Compares, Ops, Write, Lock: all of Ops or none, as one revision
)

var opNames = [...]string{"", "put", "delete", "cas", "incr", "acquire", "renew", "release", "expire", "rearm", "txn"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "op?"
}

// Command is one state change. Now is set by whoever proposes it (the
// batch leader, or a cluster leader) from its monotonic clock, so that
// applying the same commands in the same order gives the same state on
// every node. Term is the proposer's term (0 on a single node): an expiry
// proposed under an older term than the last rearm changes nothing, so an
// old or paused leader can never expire a lease.
type Command struct {
	Op       Op
	Now      time.Duration
	Term     uint64
	Key      []byte
	Value    []byte
	Revision Revision
	Delta    int64
	Write    kv.Write
	Lock     string        // held write (G4): the lock that must be held by Write.Token
	Lease    lease.Request // acquire; Lease.Name for renew, release, expire
	Token    Token         // renew, release
	Compares []Compare     // txn
	Ops      []TxnOp       // txn
}

// Bytes is how many bytes of keys and values c carries, a transaction's
// ops and compares included: what batches and raft entries are bounded by.
func (c *Command) Bytes() int {
	n := len(c.Key) + len(c.Value) + len(c.Lock) + len(c.Lease.Name) + len(c.Lease.Holder)
	for _, op := range c.Ops {
		n += len(op.Key) + len(op.Value)
	}
	for _, cmp := range c.Compares {
		n += len(cmp.Key)
	}
	return n
}

// TxnOp is one write of a transaction (Txn).
type TxnOp struct {
	Op    Op // OpPut, OpDelete or OpIncr
	Key   []byte
	Value []byte // put
	Delta int64  // incr
}

// Compare is a condition of a transaction: Key is at Revision (0: the key
// is absent).
type Compare struct {
	Key      []byte
	Revision Revision
}

// LeaseRequest asks for a lock (the Lease field of a Command); Grant is a
// granted lease.
type (
	LeaseRequest = lease.Request
	Grant        = lease.Grant
)

// TxnResult is the outcome of one op of a transaction.
type TxnResult struct {
	Key      []byte
	Fence    Token
	Revision Revision
	Deleted  bool  // delete: a live key was removed
	Int      int64 // incr: the new value
}

// Result is the outcome of applying a Command.
type Result struct {
	Err     error
	Entry   Entry       // writes: the key's fence and revision after the write
	Deleted bool        // delete: a live key was removed
	Int     int64       // incr: the new value
	Txn     []TxnResult // txn: one per op
	Grant   lease.Grant // acquire
	TTL     time.Duration
	Freed   bool // acquire/release/expire: the lock became acquirable
	Noop    bool // expire: nothing was due, nothing changed (so nothing to log)
}

// The encoding of a batch of commands, as the write-ahead log (and a
// replicated log) keeps it: a version byte, then the commands back to back.
// A log outlives the binary that wrote it, so the version says how to read
// what follows, and a version this build does not know is an error, never
// a misread.
//
// Version 0 had no version byte: its records start with an Op (1..8). It is
// still read, so a log written before versions existed replays.
const (
	encodingV1 = 0x81 // commands with Term; OpRearm
	encodingV2 = 0x82 // commands with a txn's Compares and Ops; OpTxn
	encodingV3 = 0x83 // commands with Lease.Limit (semaphores, state/semaphore.go)
)

// AppendBatchHeader starts the encoding of a batch (the single node's
// log appends commands to it one by one, with AppendCommand). A batch
// starts at version 2; the first command that needs version 3 (a
// semaphore acquire, Lease.Limit > 1) moves it to version 3 (AppendCommand),
// so that a batch without one is exactly what a binary without semaphores
// writes and reads (state/semaphore.go).
func AppendBatchHeader(b []byte) []byte { return append(b, encodingV2) }

// AppendCommand appends c's binary encoding to the batch b (which starts
// with AppendBatchHeader's version byte, at b[0]; an empty b gets one), at the batch's version,
// first re-encoding the batch at version 3 if c needs it (needsV3). Every
// field is written, so that replay applies exactly the command that was
// applied before (at version 2 a limit of 1 is not written: 0 and 1 both
// mean a plain lock).
func AppendCommand(b []byte, c *Command) []byte {
	if len(b) == 0 {
		b = AppendBatchHeader(b)
	}
	if b[0] == encodingV3 {
		return appendCommand(b, c, 3)
	}
	if needsV3(c) {
		return appendCommand(upgradeV3(b), c, 3)
	}
	return appendCommand(b, c, 2)
}

// appendCommand appends c's encoding at version (2 or 3) to b.
func appendCommand(b []byte, c *Command, version int) []byte {
	b = append(b, byte(c.Op))
	b = binary.AppendVarint(b, int64(c.Now))
	b = binary.AppendUvarint(b, c.Term)
	b = appendBytes(b, c.Key)
	b = appendBytes(b, c.Value)
	b = binary.AppendUvarint(b, uint64(c.Revision))
	b = binary.AppendVarint(b, c.Delta)
	b = binary.AppendUvarint(b, uint64(c.Write.Token))
	var strict byte
	if c.Write.Strict {
		strict = 1
	}
	b = append(b, strict)
	b = appendBytes(b, []byte(c.Lock))
	b = appendBytes(b, []byte(c.Lease.Name))
	b = binary.AppendVarint(b, int64(c.Lease.TTL))
	b = appendBytes(b, []byte(c.Lease.Holder))
	b = binary.AppendVarint(b, int64(c.Lease.LockDelay))
	b = binary.AppendUvarint(b, uint64(c.Token))
	if version >= 3 {
		b = binary.AppendUvarint(b, uint64(c.Lease.Limit))
	}
	b = binary.AppendUvarint(b, uint64(len(c.Compares)))
	for _, cmp := range c.Compares {
		b = appendBytes(b, cmp.Key)
		b = binary.AppendUvarint(b, uint64(cmp.Revision))
	}
	b = binary.AppendUvarint(b, uint64(len(c.Ops)))
	for _, op := range c.Ops {
		b = append(b, byte(op.Op))
		b = appendBytes(b, op.Key)
		b = appendBytes(b, op.Value)
		b = binary.AppendVarint(b, op.Delta)
	}
	return b
}

// EncodeBatch encodes cmds as one batch, for a replicated log's entry.
func EncodeBatch(cmds []Command) []byte {
	b := AppendBatchHeader(nil)
	for i := range cmds {
		b = AppendCommand(b, &cmds[i])
	}
	return b
}

// DecodeBatch decodes a batch written by EncodeBatch (or by the engine's
// write-ahead log, of any version this build reads).
func DecodeBatch(b []byte) ([]Command, error) {
	var cmds []Command
	err := EachCommand(b, func(c *Command) error {
		cmds = append(cmds, *c)
		return nil
	})
	return cmds, err
}

// EachCommand decodes the batch b and calls fn for each command in order.
func EachCommand(b []byte, fn func(*Command) error) error {
	if len(b) == 0 {
		return nil
	}
	version := 0
	switch v := b[0]; {
	case v == encodingV1:
		version, b = 1, b[1:]
	case v == encodingV2:
		version, b = 2, b[1:]
	case v == encodingV3:
		version, b = 3, b[1:]
	case v >= byte(OpPut) && v <= byte(OpExpire):
		// version 0: no version byte
	default:
		return fmt.Errorf("%w: version byte 0x%02x", ErrVersion, v)
	}
	for len(b) > 0 {
		c, rest, err := readCommand(b, version)
		if err != nil {
			return err
		}
		if err := fn(&c); err != nil {
			return err
		}
		b = rest
	}
	return nil
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// readCommand decodes one command of the given encoding version from the
// front of b and returns the rest.
func readCommand(b []byte, version int) (Command, []byte, error) {
	var c Command
	r := cmdReader{b: b}
	c.Op = Op(r.byte())
	c.Now = time.Duration(r.varint())
	last := OpExpire
	if version >= 1 {
		c.Term = r.uvarint()
		last = OpRearm
	}
	if version >= 2 {
		last = OpTxn
	}
	c.Key = r.bytes()
	c.Value = r.bytes()
	c.Revision = Revision(r.uvarint())
	c.Delta = r.varint()
	c.Write.Token = Token(r.uvarint())
	c.Write.Strict = r.byte() == 1
	c.Lock = string(r.bytes())
	c.Lease.Name = string(r.bytes())
	c.Lease.TTL = time.Duration(r.varint())
	c.Lease.Holder = string(r.bytes())
	c.Lease.LockDelay = time.Duration(r.varint())
	c.Token = Token(r.uvarint())
	if version >= 3 {
		if l := r.uvarint(); l <= maxLimit {
			c.Lease.Limit = int(l)
		} else {
			r.bad = true
		}
	}
	if version >= 2 {
		if n := r.uvarint(); n > 0 && n <= uint64(len(r.b)) {
			c.Compares = make([]Compare, n)
			for i := range c.Compares {
				c.Compares[i] = Compare{Key: r.bytes(), Revision: Revision(r.uvarint())}
			}
		} else if n > 0 {
			r.bad = true
		}
		if n := r.uvarint(); n > 0 && n <= uint64(len(r.b)) {
			c.Ops = make([]TxnOp, n)
			for i := range c.Ops {
				c.Ops[i] = TxnOp{Op: Op(r.byte()), Key: r.bytes(), Value: r.bytes(), Delta: r.varint()}
			}
		} else if n > 0 {
			r.bad = true
		}
	}
	if r.bad || c.Op < OpPut || c.Op > last {
		return Command{}, nil, errBadCommand
	}
	return c, r.b, nil
}

// cmdReader reads the pieces of an encoded command; bad is set, and zero
// values returned, once the bytes run out or a length is impossible.
type cmdReader struct {
	b   []byte
	bad bool
}

func (r *cmdReader) byte() byte {
	if len(r.b) == 0 {
		r.bad = true
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *cmdReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *cmdReader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *cmdReader) bytes() []byte {
	n := r.uvarint()
	if r.bad || n > uint64(len(r.b)) {
		r.bad = true
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}
