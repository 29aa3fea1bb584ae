package state

import (
	"bytes"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
)

// The state machine's contract: publish, terms, snapshots, failure.

func openMachine(t *testing.T) *Machine {
	t.Helper()
	m, err := OpenMachine(filepath.Join(t.TempDir(), "data.db"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func mustApply(t *testing.T, m *Machine, c Command) Result {
	t.Helper()
	r, err := m.Apply(&c)
	if err != nil {
		t.Fatalf("Apply(%v): machine failed: %v", c.Op, err)
	}
	return r
}

func readKey(t *testing.T, m *Machine, key string) kv.Entry {
	t.Helper()
	var e kv.Entry
	if err := m.view(0, func(tx *kv.Tx, _ time.Duration) error {
		e = tx.Get([]byte(key))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestMachinePublish: applied commands are invisible to readers until
// Publish, which also sets Applied; a checkpointed machine reopens at its
// applied index and term.
func TestMachinePublish(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.db")
	m, err := OpenMachine(path, true)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, m, Command{Op: OpRearm, Term: 4})
	if r := mustApply(t, m, Command{Op: OpPut, Key: []byte("k"), Value: []byte("v"), Write: kv.Write{Token: 3}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if e := readKey(t, m, "k"); e.Found {
		t.Fatalf("before Publish, readers see %+v", e)
	}
	m.Publish(7)
	if e := readKey(t, m, "k"); !e.Found || e.Fence != 3 {
		t.Fatalf("after Publish, k = %+v; want found with fence 3", e)
	}
	if m.Applied() != 7 || m.Term() != 4 {
		t.Fatalf("Applied, Term = %d, %d; want 7, 4", m.Applied(), m.Term())
	}
	if err := m.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m, err = OpenMachine(path, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Applied() != 7 || m.Term() != 4 {
		t.Fatalf("reopened: Applied, Term = %d, %d; want 7, 4", m.Applied(), m.Term())
	}
}

// TestMachineExpireOlderTerm: an expiry proposed under a term older than
// the last rearm changes nothing, however late its time; one from the
// current term expires the lease.
func TestMachineExpireOlderTerm(t *testing.T) {
	m := openMachine(t)
	mustApply(t, m, Command{Op: OpRearm, Term: 1})
	g := mustApply(t, m, Command{Op: OpAcquire, Term: 1, Lease: lease.Request{Name: "L", TTL: time.Second}})
	if g.Err != nil {
		t.Fatal(g.Err)
	}
	mustApply(t, m, Command{Op: OpRearm, Term: 2, Now: 10 * time.Millisecond}) // a new leader
	old := mustApply(t, m, Command{Op: OpExpire, Term: 1, Now: time.Hour, Lease: lease.Request{Name: "L"}})
	if !old.Noop || old.Freed {
		t.Fatalf("expire from term 1 after rearm in term 2 = %+v; want a no-op", old)
	}
	if r := mustApply(t, m, Command{Op: OpRenew, Term: 2, Now: 500 * time.Millisecond, Lease: lease.Request{Name: "L"}, Token: g.Grant.Token}); r.Err != nil {
		t.Fatalf("renew after the stale expiry: %v; want the lease still held", r.Err)
	}
	cur := mustApply(t, m, Command{Op: OpExpire, Term: 2, Now: time.Hour, Lease: lease.Request{Name: "L"}})
	if !cur.Freed {
		t.Fatalf("expire from the current term = %+v; want the lock freed", cur)
	}
}

// TestMachineSnapshotRestore: a snapshot carries the whole state and its
// index; restoring it into another machine gives the same reads and token
// sequence, and a truncated snapshot is refused with the state kept.
func TestMachineSnapshotRestore(t *testing.T) {
	a := openMachine(t)
	for i := range 50 {
		mustApply(t, a, Command{Op: OpPut, Key: []byte("k" + strconv.Itoa(i)), Value: []byte("v"), Write: kv.Write{Token: Token(i)}})
	}
	g := mustApply(t, a, Command{Op: OpAcquire, Lease: lease.Request{Name: "L", TTL: time.Minute}})
	a.Publish(99)
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	snap.Close()
	if snap.Index != 99 {
		t.Fatalf("snapshot index %d; want 99", snap.Index)
	}

	b := openMachine(t)
	mustApply(t, b, Command{Op: OpPut, Key: []byte("only-in-b"), Value: []byte("x")})
	b.Publish(1)
	if err := b.Restore(bytes.NewReader(buf.Bytes()[:buf.Len()/2])); err == nil {
		t.Fatal("Restore of half a snapshot succeeded; want an error")
	}
	if e := readKey(t, b, "only-in-b"); !e.Found {
		t.Fatal("a refused Restore lost the machine's state")
	}
	if err := b.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if b.Applied() != 99 {
		t.Fatalf("restored Applied = %d; want 99", b.Applied())
	}
	if e := readKey(t, b, "k49"); !e.Found || e.Fence != 49 {
		t.Fatalf("restored k49 = %+v; want found, fence 49", e)
	}
	if e := readKey(t, b, "only-in-b"); e.Found {
		t.Fatal("Restore kept a key the snapshot does not have")
	}
	// The lease came along, indexed: its expiry is due at its deadline,
	// and the next token is above the snapshot's.
	if at, ok := b.leases.Arm(); !ok || at != time.Minute {
		t.Fatalf("restored lease index next = %v, %v; want 1m", at, ok)
	}
	if r := mustApply(t, b, Command{Op: OpAcquire, Lease: lease.Request{Name: "M", TTL: time.Minute}}); r.Grant.Token <= g.Grant.Token {
		t.Fatalf("token after restore %d; want above %d", r.Grant.Token, g.Grant.Token)
	}
}

// TestMachineFailure: a command that panics fails the machine: the open
// batch is discarded (what was published stays), and every later Apply
// returns the failure.
func TestMachineFailure(t *testing.T) {
	m := openMachine(t)
	mustApply(t, m, Command{Op: OpPut, Key: []byte("old"), Value: []byte("v")})
	m.Publish(1)
	mustApply(t, m, Command{Op: OpPut, Key: []byte("half"), Value: []byte("v")})
	m.hook = func(c *Command) {
		if string(c.Key) == "boom" {
			panic("injected")
		}
	}
	if _, err := m.Apply(&Command{Op: OpPut, Key: []byte("boom"), Value: []byte("v")}); !errors.Is(err, ErrPanic) {
		t.Fatalf("Apply of a panicking command: err = %v; want a panic error", err)
	}
	if _, err := m.Apply(&Command{Op: OpPut, Key: []byte("later"), Value: []byte("v")}); err == nil {
		t.Fatal("Apply after a failure succeeded")
	}
	m.Publish(3)
	if e := readKey(t, m, "half"); e.Found {
		t.Fatal("a command of the failed batch is visible")
	}
	if e := readKey(t, m, "old"); !e.Found {
		t.Fatal("a published command was lost with the failed batch")
	}
	if err := m.Checkpoint(); err == nil {
		t.Fatal("Checkpoint of a failed machine succeeded")
	}
}
