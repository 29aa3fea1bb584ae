package fencekvtest

import (
	"fmt"

	"github.com/fencekv/fencekv"
)

// Acked is a change a client saw acknowledged: a put (Key, Value, at
// Revision), or, with Lock set, a grant (Type "acquired") or release
// (Type "released") of Token.
type Acked struct {
	Type     string // put, acquired, released
	Key      string
	Value    string
	Revision fencekv.Revision
	Lock     string
	Token    fencekv.Token
}

// CheckHistory checks what a watcher delivered, es, for a store whose
// only key writes were single puts (one revision each) and whose
// acknowledged changes are acked: events in revision order, the key
// events' revisions consecutive from the first (no gap), no event twice,
// and every acknowledged change there (a put with its value at its
// revision). from, if not 0, is the revision the first key event must
// have.
func CheckHistory(es []fencekv.Event, acked []Acked, from fencekv.Revision) error {
	type lockEv struct {
		typ   string
		token fencekv.Token
	}
	puts := map[fencekv.Revision]fencekv.Event{}
	locks := map[lockEv]bool{}
	var last, lastKey fencekv.Revision
	for i, e := range es {
		if e.Revision < last {
			return fmt.Errorf("event %d (%s at %d) after revision %d: out of order", i, e.Type, e.Revision, last)
		}
		last = e.Revision
		switch e.Type {
		case "put", "delete":
			switch {
			case lastKey == 0 && from != 0 && e.Revision != from:
				return fmt.Errorf("the first key event is at revision %d, not %d", e.Revision, from)
			case lastKey != 0 && e.Revision == lastKey:
				return fmt.Errorf("event %d: a second key event at revision %d: a repeat", i, e.Revision)
			case lastKey != 0 && e.Revision != lastKey+1:
				return fmt.Errorf("event %d: key event at revision %d after %d: a gap", i, e.Revision, lastKey)
			}
			lastKey = e.Revision
			puts[e.Revision] = e
		default:
			k := lockEv{e.Type, e.Token}
			if locks[k] {
				return fmt.Errorf("event %d: %s of token %d twice", i, e.Type, e.Token)
			}
			locks[k] = true
		}
	}
	for _, a := range acked {
		if a.Type == "put" {
			e, ok := puts[a.Revision]
			if !ok || e.Type != "put" || string(e.Key) != a.Key || string(e.Value) != a.Value {
				return fmt.Errorf("acknowledged put %s=%s at revision %d: the watcher got %+v", a.Key, a.Value, a.Revision, e)
			}
			continue
		}
		if !locks[lockEv{a.Type, a.Token}] {
			return fmt.Errorf("acknowledged %s of %s token %d: not among the events", a.Type, a.Lock, a.Token)
		}
	}
	return nil
}

// SameEvents reports the first difference between two event streams.
func SameEvents(got, want []fencekv.Event) error {
	for i := range min(len(got), len(want)) {
		g, w := got[i], want[i]
		if g.Type != w.Type || string(g.Key) != string(w.Key) || string(g.Value) != string(w.Value) || g.Fence != w.Fence ||
			g.Revision != w.Revision || g.Lock != w.Lock || g.Token != w.Token {
			return fmt.Errorf("event %d = %+v; want %+v", i, g, w)
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d events; want %d", len(got), len(want))
	}
	return nil
}
