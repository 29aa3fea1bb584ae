package fencekv

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/fencekv/fencekv/fence"
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
	OpExpire                // Lease.Name: apply what is due on the lock at Now
)

var opNames = [...]string{"", "put", "delete", "cas", "incr", "acquire", "renew", "release", "expire"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "op?"
}

// Command is one state change. Now is set by whoever proposes it (the
// batch leader, or a cluster leader) from its monotonic clock, so that
// applying the same commands in the same order gives the same state on
// every node.
type Command struct {
	Op       Op
	Now      time.Duration
	Key      []byte
	Value    []byte
	Revision Revision
	Delta    int64
	Write    kv.Write
	Lock     string        // held write (G4): the lock that must be held by Write.Token
	Lease    lease.Request // acquire; Lease.Name for renew, release, expire
	Token    Token         // renew, release
}

// Result is the outcome of applying a Command.
type Result struct {
	Err     error
	Entry   kv.Entry    // writes: the key's fence and revision after the write
	Deleted bool        // delete: a live key was removed
	Int     int64       // incr: the new value
	Grant   lease.Grant // acquire
	TTL     time.Duration
	Freed   bool // acquire/release/expire: the lock became acquirable
	Noop    bool // expire: nothing was due, nothing changed (so nothing to log)
}

// apply is the state machine: it applies c to the transaction and the lease
// manager's index. It is deterministic in (state, c). A refused command
// changes nothing: every check comes before the first write.
//
// Called only by the batch leader (or a replicated log's apply).
func apply(tx *kv.Tx, leases *lease.Manager, c *Command) (r Result) {
	switch c.Op {
	case OpPut, OpDelete, OpCAS, OpIncr:
		if c.Lock != "" {
			if err := leases.Check(tx, c.Now, c.Lock, c.Write.Token); err != nil {
				r.Err = err
				return r
			}
		}
	}
	switch c.Op {
	case OpPut:
		r.Entry, r.Err = tx.Put(c.Key, c.Value, c.Write)
	case OpDelete:
		r.Deleted, r.Entry, r.Err = tx.Delete(c.Key, c.Write)
	case OpCAS:
		r.Entry, r.Err = tx.CAS(c.Key, c.Revision, c.Value, c.Write)
	case OpIncr:
		r.Int, r.Entry, r.Err = tx.Incr(c.Key, c.Delta, c.Write)
	case OpAcquire:
		r.Grant, r.Err = leases.Acquire(tx, c.Now, c.Lease)
	case OpRenew:
		r.TTL, r.Err = leases.Renew(tx, c.Now, c.Lease.Name, c.Token)
	case OpRelease:
		r.Err = leases.Release(tx, c.Now, c.Lease.Name, c.Token)
		r.Freed = r.Err == nil
	case OpExpire:
		var changed bool
		r.Freed, changed, r.Err = leases.Expire(tx, c.Now, c.Lease.Name)
		r.Noop = !changed
	default:
		r.Err = fence.Errorf(fence.CodeBadRequest, "unknown command %d", c.Op)
	}
	return r
}

// appendCommand appends c's binary encoding, as the write-ahead log keeps
// it, to b. Every field is written, so that replay applies exactly the
// command that was applied before.
func appendCommand(b []byte, c *Command) []byte {
	b = append(b, byte(c.Op))
	b = binary.AppendVarint(b, int64(c.Now))
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
	return binary.AppendUvarint(b, uint64(c.Token))
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// errBadCommand is returned by readCommand for bytes appendCommand did not
// write.
var errBadCommand = errors.New("fencekv: malformed command in the log")

// readCommand decodes one command from the front of b and returns the rest.
func readCommand(b []byte) (Command, []byte, error) {
	var c Command
	r := cmdReader{b: b}
	c.Op = Op(r.byte())
	c.Now = time.Duration(r.varint())
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
	if r.bad || c.Op < OpPut || c.Op > OpExpire {
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
