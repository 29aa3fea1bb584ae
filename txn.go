package fencekv

import (
	"context"

	"github.com/fencekv/fencekv/state"
)

// A transaction's parts, as the state machine applies them.
type (
	// TxnOp is one operation of a Txn: OpPut, OpDelete or OpIncr.
	TxnOp = state.TxnOp
	// Compare holds if Key's revision is Revision (0: the key is absent).
	Compare = state.Compare
	// TxnResult is one op's outcome.
	TxnResult = state.TxnResult
	// Op names a TxnOp's operation.
	Op = state.Op
)

// The operations of a TxnOp.
const (
	OpPut    = state.OpPut
	OpDelete = state.OpDelete
	OpIncr   = state.OpIncr
)

// Txn applies ops if every compare holds, all or nothing, fenced with w
// (its token and lock apply to every op), as one revision. It returns the
// revision and each op's result. A compare that fails is ErrCompareFailed
// with Key and the key's Revision; a stale key is ErrStaleToken with Key.
func (db *DB) Txn(ctx context.Context, compares []Compare, ops []TxnOp, w WriteOptions) (Revision, []TxnResult, error) {
	if err := db.opts.CheckTxn(compares, ops, w); err != nil {
		return 0, nil, err
	}
	c := state.Command{Op: state.OpTxn, Compares: compares, Ops: ops, Write: w.kv(), Lock: w.Lock}
	r := db.exec(ctx, c)
	if r.Err != nil {
		db.refusals.Note(ctx, &c, r.Err, db.m.Grantee)
		return 0, nil, r.Err
	}
	return state.TxnRevision(r.Txn), r.Txn, nil
}
