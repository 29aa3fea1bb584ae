package state

import (
	"fmt"
	"strconv"

	"github.com/fencekv/fencekv/fence"
	"github.com/fencekv/fencekv/kv"
)

// Transactions: several fenced writes applied all or none, as one store
// revision. Every check comes before the first write, in the order single
// writes use: the lock (G4), the fence of every key written (G2), the
// compares, then incr's integers. One stale key refuses the whole txn, so
// a zombie holder never lands half of it.

// TxnRevision is the revision a transaction's results were written at.
func TxnRevision(rs []TxnResult) Revision {
	var rev Revision
	for _, r := range rs {
		rev = max(rev, r.Revision)
	}
	return rev
}

// applyTxn is apply's case for OpTxn (after the lock check).
func applyTxn(tx *kv.Tx, c *Command) ([]TxnResult, error) {
	// The fence of every key written, as it was before the txn.
	checked := map[string]bool{}
	for _, op := range c.Ops {
		if checked[string(op.Key)] {
			continue
		}
		checked[string(op.Key)] = true
		if err := kv.CheckFence(tx.Get(op.Key).Fence, c.Write); err != nil {
			if e, ok := err.(*fence.Error); ok {
				e.Key = string(op.Key)
				e.Message = fmt.Sprintf("key %q: %s", op.Key, e.Message)
			}
			return nil, err
		}
	}
	for _, cmp := range c.Compares {
		if e := tx.Get(cmp.Key); e.Revision != cmp.Revision {
			return nil, &fence.Error{Code: fence.CodeCompareFailed, Key: string(cmp.Key), Revision: e.Revision,
				Message: fmt.Sprintf("key %q is at revision %d, not %d", cmp.Key, e.Revision, cmp.Revision)}
		}
	}
	// incr's integers, with the txn's own earlier writes in view.
	vals := map[string]*kv.Entry{}
	cur := func(key []byte) *kv.Entry {
		e, ok := vals[string(key)]
		if !ok {
			g := tx.Get(key)
			e = &g
			vals[string(key)] = e
		}
		return e
	}
	for _, op := range c.Ops {
		e := cur(op.Key)
		switch op.Op {
		case OpPut:
			e.Found, e.Value = true, op.Value
		case OpDelete:
			e.Found, e.Value = false, nil
		case OpIncr:
			var n int64
			if e.Found {
				var err error
				if n, err = strconv.ParseInt(string(e.Value), 10, 64); err != nil {
					return nil, &fence.Error{Code: fence.CodeNotInteger, Key: string(op.Key), Message: fmt.Sprintf("key %q: value %.32q is not a signed 64-bit integer", op.Key, e.Value)}
				}
			}
			sum := n + op.Delta
			if (op.Delta > 0 && sum < n) || (op.Delta < 0 && sum > n) {
				return nil, &fence.Error{Code: fence.CodeNotInteger, Key: string(op.Key), Message: fmt.Sprintf("key %q: %d + %d overflows a signed 64-bit integer", op.Key, n, op.Delta)}
			}
			e.Found, e.Value = true, strconv.AppendInt(nil, sum, 10)
		}
	}
	// Every check passed: the writes cannot be refused. Strictness was
	// checked once per key above; each write carries the token.
	w := kv.Write{Token: c.Write.Token}
	out := make([]TxnResult, len(c.Ops))
	err := tx.Group(func() error {
		for i, op := range c.Ops {
			var e kv.Entry
			var err error
			r := &out[i]
			switch op.Op {
			case OpPut:
				e, err = tx.Put(op.Key, op.Value, w)
			case OpDelete:
				r.Deleted, e, err = tx.Delete(op.Key, w)
			case OpIncr:
				r.Int, e, err = tx.Incr(op.Key, op.Delta, w)
			default:
				err = fmt.Errorf("op %d", op.Op)
			}
			if err != nil {
				// Not a refusal (the checks passed): the machine fails,
				// and nothing of the batch is kept.
				return fmt.Errorf("txn op %d (%v %q) failed after its checks passed: %v", i, op.Op, op.Key, err)
			}
			r.Key, r.Fence, r.Revision = op.Key, e.Fence, e.Revision
		}
		return nil
	})
	return out, err
}
