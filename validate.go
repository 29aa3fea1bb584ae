package fencekv

import (
	"time"

	"github.com/fencekv/fencekv/state"
)

// Validation: what every node checks before a command is applied or
// proposed, so that bad input is refused with a clear code and changes
// nothing, and never reaches a log.

// CheckKey refuses an empty key or one over MaxKeySize.
func (o *Options) CheckKey(key []byte) error {
	switch {
	case len(key) == 0:
		return errorf(CodeBadRequest, "key is empty")
	case len(key) > o.MaxKeySize:
		return errorf(CodeTooLarge, "key is %d bytes, over the limit of %d", len(key), o.MaxKeySize)
	}
	return nil
}

// CheckWrite refuses a write whose key, value or fencing options are
// malformed or over their limits.
func (o *Options) CheckWrite(key, value []byte, w WriteOptions) error {
	if err := o.CheckKey(key); err != nil {
		return err
	}
	if len(value) > o.MaxValueSize {
		return errorf(CodeTooLarge, "value is %d bytes, over the limit of %d", len(value), o.MaxValueSize)
	}
	if w.Strict && w.Token == 0 {
		return errorf(CodeBadRequest, "strict needs a token")
	}
	if w.Lock != "" {
		if w.Token == 0 {
			return errorf(CodeBadRequest, "a held write (lock %q) needs the lock's token", w.Lock)
		}
		return o.CheckName(w.Lock)
	}
	return nil
}

// CheckName refuses an empty lock name or one over MaxKeySize.
func (o *Options) CheckName(name string) error {
	switch {
	case name == "":
		return errorf(CodeBadRequest, "lock name is empty")
	case len(name) > o.MaxKeySize:
		return errorf(CodeTooLarge, "lock name is %d bytes, over the limit of %d", len(name), o.MaxKeySize)
	}
	return nil
}

// CheckAcquire refuses an acquire whose name, TTL, wait, lock-delay or
// holder is out of range.
func (o *Options) CheckAcquire(name string, ttl time.Duration, ao AcquireOptions) error {
	if err := o.CheckName(name); err != nil {
		return err
	}
	switch {
	case ttl < o.MinTTL || ttl > o.MaxTTL:
		return errorf(CodeBadRequest, "ttl %v is outside %v..%v", ttl, o.MinTTL, o.MaxTTL)
	case ao.Wait < 0 || ao.Wait > o.MaxWait:
		return errorf(CodeBadRequest, "wait %v is outside 0..%v", ao.Wait, o.MaxWait)
	case ao.LockDelay < 0 || ao.LockDelay > o.MaxLockDelay:
		return errorf(CodeBadRequest, "lock delay %v is outside 0..%v", ao.LockDelay, o.MaxLockDelay)
	case len(ao.Holder) > o.MaxKeySize:
		return errorf(CodeTooLarge, "holder is %d bytes, over the limit of %d", len(ao.Holder), o.MaxKeySize)
	case ao.Limit != 0:
		return checkLimit(ao)
	}
	return nil
}

// Limit returns the page size a Scan or Locks of limit n uses: 0 means
// the default; above MaxScan is refused.
func (o *Options) Limit(n int) (int, error) {
	switch {
	case n < 0:
		return 0, errorf(CodeBadRequest, "limit %d is negative", n)
	case n == 0:
		return min(1000, o.MaxScan), nil
	case n > o.MaxScan:
		return 0, errorf(CodeBadRequest, "limit %d is over the maximum of %d", n, o.MaxScan)
	}
	return n, nil
}

// CheckTxn refuses a transaction without ops, with more than MaxTxnOps
// ops or compares, with an op of another kind than put, delete or incr, or
// whose keys, values or fencing options CheckWrite refuses.
func (o *Options) CheckTxn(compares []Compare, ops []TxnOp, w WriteOptions) error {
	switch {
	case len(ops) == 0:
		return errorf(CodeBadRequest, "a txn needs at least one op")
	case len(ops) > o.MaxTxnOps || len(compares) > o.MaxTxnOps:
		return errorf(CodeTooLarge, "a txn has %d ops and %d compares; the limit is %d each", len(ops), len(compares), o.MaxTxnOps)
	}
	size := 0
	for i, op := range ops {
		switch op.Op {
		case state.OpPut, state.OpDelete, state.OpIncr:
		default:
			return errorf(CodeBadRequest, "txn op %d: %q is not put, delete or incr", i, op.Op)
		}
		if err := o.CheckWrite(op.Key, op.Value, w); err != nil {
			return err
		}
		size += len(op.Key) + len(op.Value)
	}
	for _, c := range compares {
		if err := o.CheckKey(c.Key); err != nil {
			return err
		}
	}
	if size > o.MaxValueSize+o.MaxTxnOps*o.MaxKeySize {
		return errorf(CodeTooLarge, "a txn writes %d bytes; the limit is the value limit plus the key limit per op", size)
	}
	return nil
}
