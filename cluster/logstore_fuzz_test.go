package cluster

import (
	"bytes"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// FuzzDecodeEntry: a raft log entry read from a segment either decodes or
// is refused as corrupt, never a panic or a slice past its record; what
// decodes encodes back to the same bytes.
func FuzzDecodeEntry(f *testing.F) {
	for _, l := range []raft.Log{
		{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("cmds")},
		{Index: 2, Term: 3, Type: raft.LogConfiguration, Data: []byte{1, 2, 3}, Extensions: []byte("ext"), AppendedAt: time.Unix(1700000000, 5)},
		{Index: 3, Term: 3, Type: raft.LogNoop},
	} {
		f.Add(encodeEntry(nil, &l))
	}
	f.Add([]byte{})
	f.Add(make([]byte, entryFixed))
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if err := decodeEntry(7, b, &l); err != nil {
			return
		}
		if l.Index != 7 {
			t.Fatalf("decoded index %d; want 7", l.Index)
		}
		if got := encodeEntry(nil, &l); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding changed the entry:\n %x\n %x", b, got)
		}
	})
}
