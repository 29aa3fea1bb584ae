package diskfault

import (
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	rs, err := Parse("wal.sync=eio@5; raftlog.sync=stall:3s@10+;wal.write=enospc")
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{Point: "wal.sync", Errno: syscall.EIO, Nth: 5},
		{Point: "raftlog.sync", Stall: 3 * time.Second, Nth: 10, Sticky: true},
		{Point: "wal.write", Errno: syscall.ENOSPC, Nth: 1, Sticky: true},
	}
	if len(rs) != len(want) {
		t.Fatalf("got %+v", rs)
	}
	for i := range want {
		if rs[i] != want[i] {
			t.Errorf("rule %d: got %+v, want %+v", i, rs[i], want[i])
		}
	}
	if !rs[0].Fires(5) || rs[0].Fires(4) || rs[0].Fires(6) {
		t.Error("@5 fires on the 5th hit only")
	}
	if !rs[1].Fires(10) || !rs[1].Fires(11) || rs[1].Fires(9) {
		t.Error("@10+ fires on the 10th hit and later")
	}
	if rs, err := Parse(" "); err != nil || len(rs) != 0 {
		t.Errorf("blank: %v %v", rs, err)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, spec := range []string{
		"wal.sync",                     // no action
		"wal.fsync=eio",                // no such point
		"wal.sync=eoi",                 // no such action
		"wal.sync=eio@0",               // hits count from 1
		"wal.sync=eio@x",               // not a number
		"wal.sync=stall:-1s",           // not positive
		"wal.sync=stall:soon",          // not a duration
		"wal.sync=eio;wal.sync=enospc", // two rules for one point
	} {
		if _, err := Parse(spec); err == nil {
			t.Errorf("%q: parsed", spec)
		}
	}
}
