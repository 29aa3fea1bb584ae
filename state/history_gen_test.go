package state

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestHistoryGenerations: batches of many sizes (up to a value larger
// than an arena block), checkpointed now and then, under a window bounded
// by count and by bytes: after each checkpoint the data file holds, byte
// for byte, the latest events published (a record's arena block is not
// written again before the commit), at least the window and at most a
// generation and a batch more, and every event from its floor on.
func TestHistoryGenerations(t *testing.T) {
	for _, lim := range []struct{ events, bytes int }{{100, 1 << 20}, {1000, 40 << 10}, {3, 1 << 20}} {
		t.Run(fmt.Sprintf("%d events, %d bytes", lim.events, lim.bytes), func(t *testing.T) {
			m := openMachine(t)
			if err := m.EnableWatch(lim.events, lim.bytes, 8); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(7, uint64(lim.events)))
			var all []Event // every event published, oldest first
			var kept int    // how many of them the last checkpoint holds
			idx := uint64(0)
			for round := range 80 {
				n := 1 + rng.IntN(60)
				for i := range n {
					size := rng.IntN(700)
					if rng.IntN(50) == 0 {
						size = 70 << 10 // over an arena block
					}
					v := bytes.Repeat([]byte{byte('a' + (round+i)%26)}, size)
					r := mustApply(t, m, Command{Op: OpPut, Key: fmt.Appendf(nil, "k%d", i%9), Value: v})
					all = append(all, Event{Type: "put", Key: r.Entry.Key, Value: v, Revision: r.Entry.Revision})
				}
				idx++
				m.Publish(idx)
				if round%3 != 2 {
					continue
				}
				if err := m.Checkpoint(); err != nil {
					t.Fatal(err)
				}
				kept = len(all)
				d, es, err := m.loadHistory(lim.events, lim.bytes, all[kept-1].Revision)
				if err != nil {
					t.Fatal(err)
				}
				// The window: the latest events within both limits.
				win, wb := 0, 0
				for i := kept - 1; i >= 0 && win < lim.events; i-- {
					if b := eventBytes(&all[i]); win == 0 || wb+b <= lim.bytes {
						win, wb = win+1, wb+b
						continue
					}
					break
				}
				if len(es) < win || len(es) > win+max(lim.events/10, 1) {
					t.Fatalf("round %d: the file holds %d events; the window is %d", round, len(es), win)
				}
				if fb := d.bytes; len(es) > 1 && fb > lim.bytes+lim.bytes/10+(70<<10) {
					t.Fatalf("round %d: the file holds %d bytes of events; the limit is %d", round, fb, lim.bytes)
				}
				want := all[kept-len(es) : kept]
				for i := range es {
					g, w := es[i], want[i]
					if g.Type != w.Type || !bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) || g.Revision != w.Revision || g.Fence != w.Fence {
						t.Fatalf("round %d: file event %d = %s at %d (%d bytes); want %s at %d (%d bytes)", round, i, g.Key, g.Revision, len(g.Value), w.Key, w.Revision, len(w.Value))
					}
				}
				if d.floor > es[0].Revision { // one event a revision here
					t.Fatalf("round %d: floor %d, but the file keeps revision %d", round, d.floor, es[0].Revision)
				}
				if kept > len(es) && all[kept-len(es)-1].Revision >= d.floor {
					t.Fatalf("round %d: floor %d, but revision %d was dropped", round, d.floor, all[kept-len(es)-1].Revision)
				}
			}
		})
	}
}
