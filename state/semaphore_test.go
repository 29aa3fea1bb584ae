package state

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekv/fencekv/lease"
)

// plainCommands are sampleCommands without the semaphore acquire.
func plainCommands() []Command {
	var out []Command
	for _, c := range sampleCommands {
		if !needsV3(&c) {
			out = append(out, c)
		}
	}
	// A limit of 1 is a plain lock: written at version 2.
	out = append(out, Command{Op: OpAcquire, Lease: lease.Request{Name: "one", TTL: time.Second, Limit: 1}})
	return out
}

// TestBatchWithoutSemaphoreIsV2: a batch with no semaphore acquire encodes
// byte for byte as fencekv before semaphores did (encodeBatchV2 is that
// code, copied), so an older binary reads every log that holds none.
func TestBatchWithoutSemaphoreIsV2(t *testing.T) {
	cmds := plainCommands()
	got, want := EncodeBatch(cmds), encodeBatchV2(cmds)
	if !bytes.Equal(got, want) {
		t.Fatalf("a batch without semaphores:\n got %x\nwant %x", got, want)
	}
	if _, err := decodeBatchV2(got); err != nil {
		t.Fatalf("the older decoder refuses a batch without semaphores: %v", err)
	}
	// The single node's log builds a batch command by command.
	b := AppendBatchHeader(nil)
	for i := range cmds {
		b = AppendCommand(b, &cmds[i])
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("appended one by one:\n got %x\nwant %x", b, want)
	}
}

// TestSemaphoreBatchIsV3: a batch holding a semaphore acquire, anywhere in
// it, is version 3: it decodes to the same commands (the ones before the
// acquire re-encoded), and an older binary's decoder refuses it with
// ErrVersion rather than applying the acquire as a plain lock's.
func TestSemaphoreBatchIsV3(t *testing.T) {
	sem := Command{Op: OpAcquire, Lease: lease.Request{Name: "sem", TTL: time.Second, Holder: "h", Limit: 3}}
	plain := plainCommands()
	for at := 0; at <= len(plain); at++ {
		cmds := append(append(append([]Command{}, plain[:at]...), sem), plain[at:]...)
		b := AppendBatchHeader(nil)
		for i := range cmds {
			b = AppendCommand(b, &cmds[i])
		}
		if b[0] != encodingV3 {
			t.Fatalf("semaphore at %d: version byte 0x%02x; want 0x%02x", at, b[0], encodingV3)
		}
		if !bytes.Equal(b, EncodeBatch(cmds)) {
			t.Fatalf("semaphore at %d: appended one by one differs from EncodeBatch", at)
		}
		got, err := DecodeBatch(b)
		if err != nil || len(got) != len(cmds) {
			t.Fatalf("semaphore at %d: decoded %d commands, %v", at, len(got), err)
		}
		for i := range cmds {
			want := cmds[i]
			if want.Lease.Limit == 1 {
				want.Lease.Limit = got[i].Lease.Limit // 0 or 1: both a plain lock
			}
			if fmt.Sprint(normal(got[i])) != fmt.Sprint(normal(want)) {
				t.Fatalf("semaphore at %d: command %d = %+v; want %+v", at, i, got[i], want)
			}
		}
		if _, err := decodeBatchV2(b); !errors.Is(err, ErrVersion) {
			t.Fatalf("semaphore at %d: the older decoder: err = %v; want ErrVersion", at, err)
		}
	}
}

// encodeBatchV2 is EncodeBatch as fencekv wrote it before semaphores.
func encodeBatchV2(cmds []Command) []byte {
	b := []byte{encodingV2}
	for i := range cmds {
		c := &cmds[i]
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
	}
	return b
}

// decodeBatchV2 is DecodeBatch's version rule as fencekv had it before
// semaphores: versions 0, 1 and 2, anything else ErrVersion.
func decodeBatchV2(b []byte) ([]Command, error) {
	version := 0
	switch v := b[0]; {
	case v == encodingV1:
		version, b = 1, b[1:]
	case v == encodingV2:
		version, b = 2, b[1:]
	case v >= byte(OpPut) && v <= byte(OpExpire):
	default:
		return nil, fmt.Errorf("%w: version byte 0x%02x", ErrVersion, v)
	}
	var cmds []Command
	for len(b) > 0 {
		c, rest, err := readCommand(b, version)
		if err != nil {
			return nil, err
		}
		cmds = append(cmds, c)
		b = rest
	}
	return cmds, nil
}
