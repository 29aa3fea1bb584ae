package state

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
)

var sampleCommands = []Command{
	{Op: OpPut, Now: 5 * time.Second, Key: []byte("k"), Value: []byte("v"), Write: kv.Write{Token: 7, Strict: true}, Lock: "L"},
	{Op: OpDelete, Now: -1, Key: []byte("\x00\xff")},
	{Op: OpCAS, Key: []byte("k"), Revision: 1 << 40, Value: []byte{}},
	{Op: OpIncr, Key: []byte("n"), Delta: -1 << 62},
	{Op: OpAcquire, Lease: lease.Request{Name: "lock", TTL: time.Minute, Holder: "h", LockDelay: time.Second}},
	{Op: OpRenew, Lease: lease.Request{Name: "lock"}, Token: 1<<64 - 1},
	{Op: OpRelease, Lease: lease.Request{Name: "lock"}, Token: 3},
	{Op: OpExpire, Now: time.Hour, Term: 9, Lease: lease.Request{Name: "lock"}},
	{Op: OpRearm, Now: time.Minute, Term: 1 << 40},
	{Op: OpAcquire, Lease: lease.Request{Name: "sem", TTL: time.Second, Limit: 3}}, // v3: a semaphore
	{Op: OpTxn, Write: kv.Write{Token: 9}, Lock: "L",
		Compares: []Compare{{Key: []byte("a"), Revision: 3}, {Key: []byte("b")}},
		Ops:      []TxnOp{{Op: OpPut, Key: []byte("a"), Value: []byte("x")}, {Op: OpDelete, Key: []byte("b")}, {Op: OpIncr, Key: []byte("n"), Delta: -2}}},
}

// TestCommandEncoding: what the write-ahead log (or a replicated log)
// keeps of a batch decodes to the same commands, in order.
func TestCommandEncoding(t *testing.T) {
	got, err := DecodeBatch(EncodeBatch(sampleCommands))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(sampleCommands) {
		t.Fatalf("decoded %d commands; want %d", len(got), len(sampleCommands))
	}
	for i, want := range sampleCommands {
		if !reflect.DeepEqual(normal(got[i]), normal(want)) {
			t.Fatalf("command %d = %+v; want %+v", i, got[i], want)
		}
	}
	for _, bad := range [][]byte{{}, {0}, {byte(OpTxn + 1), 0}, appendCommand(nil, &sampleCommands[0], 3)[:5]} {
		if _, _, err := readCommand(bad, 3); err == nil {
			t.Errorf("readCommand(%x) = nil error; want errBadCommand", bad)
		}
	}
}

// TestCommandVersions: a record written before commands had a version
// (version 0: no version byte, no Term, no rearm) still replays; a record
// of a version this build does not know is ErrVersion, never a misread.
func TestCommandVersions(t *testing.T) {
	v0 := appendCommandV0(nil, &sampleCommands[0])
	v0 = appendCommandV0(v0, &sampleCommands[4])
	got, err := DecodeBatch(v0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !reflect.DeepEqual(normal(got[0]), normal(sampleCommands[0])) || !reflect.DeepEqual(normal(got[1]), normal(sampleCommands[4])) {
		t.Fatalf("version 0 decoded to %+v", got)
	}
	// Rearm did not exist in version 0.
	if _, err := DecodeBatch(appendCommandV0(nil, &Command{Op: OpRearm})); err == nil {
		t.Error("a version 0 rearm decoded; want an error")
	}
	for _, v := range []byte{0x84, 0xff, 0x10} { // 0x84: a future version
		_, err := DecodeBatch(append([]byte{v}, EncodeBatch(sampleCommands)[1:]...))
		if !errors.Is(err, ErrVersion) {
			t.Errorf("version byte 0x%02x: err = %v; want ErrVersion", v, err)
		}
	}
}

// appendCommandV0 is the encoding of fencekv 0.1.0's log, before versions.
func appendCommandV0(b []byte, c *Command) []byte {
	v1 := appendCommand(nil, c, 2)
	v1 = v1[:len(v1)-2] // version 2 added two counts (compares, ops) at the end
	// Version 1 is version 0 with Term after Now.
	_, n := binary.Varint(v1[1:])
	_, m := binary.Uvarint(v1[1+n:])
	b = append(b, v1[:1+n]...)
	return append(b, v1[1+n+m:]...)
}

// FuzzReadCommand: the log's command decoder never panics, and what it
// accepts encodes back to the bytes it read.
func FuzzReadCommand(f *testing.F) {
	for i := range sampleCommands {
		f.Add(appendCommand(nil, &sampleCommands[i], 3))
	}
	f.Add([]byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, rest, err := readCommand(b, 3)
		if err != nil {
			return
		}
		used := b[:len(b)-len(rest)]
		if again := appendCommand(nil, &c, 3); string(again) != string(used) {
			// Varints have one shortest form; longer forms decode but
			// re-encode shorter. Equality of the decoded command is what
			// matters.
			c2, _, err := readCommand(again, 3)
			if err != nil || !reflect.DeepEqual(normal(c2), normal(c)) {
				t.Fatalf("re-encoding %+v gave %+v, %v", c, c2, err)
			}
		}
	})
}

func normal(c Command) Command {
	if c.Ops != nil {
		ops := make([]TxnOp, len(c.Ops))
		for i, op := range c.Ops {
			if len(op.Value) == 0 {
				op.Value = nil
			}
			ops[i] = op
		}
		c.Ops = ops
	}
	if len(c.Key) == 0 {
		c.Key = nil
	}
	if len(c.Value) == 0 {
		c.Value = nil
	}
	return c
}
