package kv

// Grouped writes: the writes of one multi-key transaction share one
// store revision.

// Group runs fn with the writes it makes sharing one revision: the first
// takes the next revision, the others reuse it. A group that writes
// nothing leaves the revision as it was.
func (t *Tx) Group(fn func() error) error {
	t.grouped, t.groupRev = true, 0
	defer func() { t.grouped, t.groupRev = false, 0 }()
	return fn()
}

// nextRev is the revision of the next write: one more than the store's,
// or, inside a Group after its first write, the group's.
func (t *Tx) nextRev() Revision {
	if !t.grouped {
		return t.rev + 1
	}
	if t.groupRev == 0 {
		t.groupRev = t.rev + 1
	}
	return t.groupRev
}

// CheckFence applies the fence rule (G2, G3) to a write with w on a key
// whose fence is fence: nil, or a stale_token refusal.
func CheckFence(fence Token, w Write) error { return check(fence, w) }
