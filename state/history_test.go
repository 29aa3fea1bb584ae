package state

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/fencekv/fencekv/kv"
	"github.com/fencekv/fencekv/lease"
)

// replayed collects the events a watch from revision from replays.
func replayed(t *testing.T, m *Machine, from Revision) []Event {
	t.Helper()
	w, err := m.Watch(WatchOptions{Locks: true, StartRevision: from})
	if err != nil {
		t.Fatalf("watch from %d: %v", from, err)
	}
	defer w.Close()
	var out []Event
	for {
		select {
		case b := <-w.Events():
			out = append(out, b...)
		default:
			return out // a replay is in the buffer when Watch returns
		}
	}
}

func fileHistory(t *testing.T, m *Machine) (n int, floor Revision) {
	t.Helper()
	m.view(0, func(tx *kv.Tx, _ time.Duration) error {
		floor, _ = tx.HistoryFloor()
		return tx.EachHistory(func(uint64, []byte) bool { n++; return true })
	})
	return n, floor
}

// TestHistorySnapshotRestore: a snapshot carries the watch history; a
// machine that restores it replays the same events, and trims the file
// as the hub trims its window.
func TestHistorySnapshotRestore(t *testing.T) {
	a := openMachine(t)
	if err := a.EnableWatch(20, 1<<20, 8); err != nil {
		t.Fatal(err)
	}
	idx := uint64(0)
	for i := range 50 {
		mustApply(t, a, Command{Op: OpPut, Key: []byte(fmt.Sprintf("k%d", i%3)), Value: []byte(fmt.Sprint(i))})
		if i%5 == 0 {
			r := mustApply(t, a, Command{Op: OpAcquire, Now: time.Duration(i) * time.Second, Lease: lease.Request{Name: "L", TTL: time.Second}})
			mustApply(t, a, Command{Op: OpRelease, Now: time.Duration(i) * time.Second, Lease: lease.Request{Name: "L"}, Token: r.Grant.Token})
		}
		idx++
		a.Publish(idx)
	}
	want := replayed(t, a, 41)
	if len(want) < 10 || want[0].Revision != 41 || want[len(want)-1].Revision != 50 {
		t.Fatalf("replay from 41 on the source: %+v", want)
	}
	if err := a.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if n, floor := fileHistory(t, a); n < 20 || n > 22 || floor < 29 || floor > 41 {
		t.Fatalf("the data file keeps %d events from %d; want 20..22 of a window of 20", n, floor)
	}
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	snap.Close()

	b := openMachine(t)
	if err := b.EnableWatch(20, 1<<20, 8); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	got := replayed(t, b, 41)
	if len(got) != len(want) {
		t.Fatalf("restored: %d events from 41; want %d", len(got), len(want))
	}
	for i := range got {
		if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) {
			t.Fatalf("restored event %d = %+v; want %+v", i, got[i], want[i])
		}
	}
	// It goes on from there: the next event is number after the file's.
	mustApply(t, b, Command{Op: OpPut, Key: []byte("k0"), Value: []byte("next")})
	b.Publish(idx + 1)
	if got := replayed(t, b, 51); len(got) != 1 || got[0].Revision != 51 {
		t.Fatalf("after the restore, from 51: %+v", got)
	}
}

// TestHistoryRecords: event records round-trip, and a damaged one is an
// error, not an event.
func TestHistoryRecords(t *testing.T) {
	for _, e := range []Event{
		{Type: "put", Key: []byte("k"), Value: []byte("v"), Fence: 3, Revision: 9},
		{Type: "put", Key: []byte("k"), Value: []byte{}, Revision: 1},
		{Type: "delete", Key: []byte("k"), Fence: 7, Revision: 2},
		{Type: "acquired", Lock: "L", Token: 12, Revision: 4},
		{Type: "expired", Lock: "L", Token: 12, Revision: 4},
	} {
		rec := appendEvent(nil, &e)
		got, err := decodeEvent(rec)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(e) || eventBytes(&got) != eventBytes(&e) {
			t.Fatalf("round trip of %+v: %+v, %v", e, got, err)
		}
		for _, bad := range [][]byte{rec[:24], append([]byte{9}, rec[1:]...), append(rec[:25:25], 0xff)} {
			if _, err := decodeEvent(bad); err == nil {
				t.Fatalf("decoded a damaged record %x", bad)
			}
		}
	}
}
