package lease

import (
	"container/heap"
	"time"
)

// index is a min-heap of lock names by the time at which something is due
// for them: a lease's deadline, or the end of a lock-delay. Set, Remove and
// popping cost O(log n); there is at most one entry per lock.
type index struct {
	items []*item
	byKey map[string]*item
	free  []*item // removed items, for set to reuse: a lock is indexed at each acquire and removed at its release
}

// maxFreeItems bounds the removed items kept for reuse.
const maxFreeItems = 64

type item struct {
	name string
	at   time.Duration
	pos  int
}

func newIndex() *index { return &index{byKey: make(map[string]*item)} }

func (x *index) Len() int           { return len(x.items) }
func (x *index) Less(i, j int) bool { return x.items[i].at < x.items[j].at }
func (x *index) Swap(i, j int) {
	x.items[i], x.items[j] = x.items[j], x.items[i]
	x.items[i].pos = i
	x.items[j].pos = j
}
func (x *index) Push(v any) {
	it := v.(*item)
	it.pos = len(x.items)
	x.items = append(x.items, it)
}
func (x *index) Pop() any {
	n := len(x.items) - 1
	it := x.items[n]
	x.items[n] = nil
	x.items = x.items[:n]
	return it
}

// set makes name due at at.
func (x *index) set(name string, at time.Duration) {
	if it, ok := x.byKey[name]; ok {
		it.at = at
		heap.Fix(x, it.pos)
		return
	}
	var it *item
	if n := len(x.free); n > 0 {
		it = x.free[n-1]
		x.free[n-1] = nil
		x.free = x.free[:n-1]
		*it = item{name: name, at: at}
	} else {
		it = &item{name: name, at: at}
	}
	x.byKey[name] = it
	heap.Push(x, it)
}

func (x *index) remove(name string) {
	if it, ok := x.byKey[name]; ok {
		heap.Remove(x, it.pos)
		delete(x.byKey, name)
		if len(x.free) < maxFreeItems {
			*it = item{}
			x.free = append(x.free, it)
		}
	}
}

func (x *index) next() (time.Duration, bool) {
	if len(x.items) == 0 {
		return 0, false
	}
	return x.items[0].at, true
}

// due returns up to max names whose time is at or before now, in heap
// order, without removing them: applying their expiry does. It costs
// O(k) for k names returned.
func (x *index) due(now time.Duration, max int) []string {
	var out []string
	// Walk the heap as a tree, pruning subtrees that are not due.
	var walk func(i int)
	walk = func(i int) {
		if i >= len(x.items) || len(out) >= max || x.items[i].at > now {
			return
		}
		out = append(out, x.items[i].name)
		walk(2*i + 1)
		walk(2*i + 2)
	}
	walk(0)
	return out
}
