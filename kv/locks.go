package kv

// Lock returns the stored lease record of a lock, or nil. The slice is the
// store's, not a copy (lease decodes it at once): valid until the
// transaction's next write or its end, and not to be changed.
func (t *Tx) Lock(name string) []byte {
	if rec, ok := t.view.lock(name); ok {
		return rec
	}
	return t.locksBucket().Get([]byte(name))
}

// PutLock stores a lock's lease record. The store keeps rec (bbolt until
// the commit, and the overlay once published): the caller must not change
// it.
func (t *Tx) PutLock(name string, rec []byte) error {
	if err := t.locksBucket().Put([]byte(name), rec); err != nil {
		return err
	}
	if t.writer {
		t.dirtyLocks[name] = rec
	}
	return nil
}

// DeleteLock removes a lock's lease record.
func (t *Tx) DeleteLock(name string) error {
	if err := t.locksBucket().Delete([]byte(name)); err != nil {
		return err
	}
	if t.writer {
		t.dirtyLocks[name] = nil
	}
	return nil
}

// Locks calls fn for each lock record whose name starts with prefix and is
// >= start, in byte order, until fn returns false. The slices are valid only
// during the call.
func (t *Tx) Locks(prefix, start []byte, fn func(name, rec []byte) bool) {
	t.each(t.locksBucket(), t.view.locksSpan, prefix, start, fn)
}
