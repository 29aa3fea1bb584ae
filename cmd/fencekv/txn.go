package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

func txnCommand() *cli.Command {
	return &cli.Command{
		Name:      "txn",
		Usage:     "apply several writes all or none, as one revision, if every compare holds",
		ArgsUsage: "[JSON|-]",
		UsageText: `fencekv txn [JSON|-] [--token N] [--strict] [--lock NAME]

Takes the transaction as JSON (the argument, or stdin if it is - or absent):
  {"compare": [{"key": K, "revision": R}, ...],
   "ops": [{"op": "put", "key": K, "value": V}, {"op": "delete", "key": K},
           {"op": "incr", "key": K, "delta": D}, ...]}
Every compare must hold (revision 0: the key is absent), and every op is a
fenced write with --token (and --lock): one stale key refuses the whole txn.
Exit statuses as for put: 3 refused by fencing, 5 a compare failed.

Example: move 3 units from sku-1 to sku-2 while holding the lock
  fencekv txn --token $T --lock stock \
    '{"ops": [{"op": "incr", "key": "sku-1", "delta": -3}, {"op": "incr", "key": "sku-2", "delta": 3}]}'`,
		Flags: flags(clientFlags(), writeFlags()),
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usagef("txn takes one JSON argument (or - for stdin)")
			}
			src := c.Args().First()
			var r io.Reader = strings.NewReader(src)
			if src == "" || src == "-" {
				r = c.App.Reader
			}
			compares, ops, err := parseTxn(r)
			if err != nil {
				return usagef("txn: %v", err)
			}
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				rev, rs, err := cl.Txn(ctx, compares, ops, writeOptions(c))
				if err != nil {
					return refused(c, err)
				}
				lines := []string{fmt.Sprintf("OK revision=%d", rev)}
				results := make([]map[string]any, len(rs))
				for i, r := range rs {
					m := setText(map[string]any{"fence": r.Fence, "revision": r.Revision}, "key", r.Key)
					line := fmt.Sprintf("%s %q fence=%d", ops[i].Op, r.Key, r.Fence)
					if ops[i].Op == state.OpIncr {
						m["value"] = r.Int
						line += fmt.Sprintf(" value=%d", r.Int)
					}
					results[i] = m
					lines = append(lines, line)
				}
				return show(c, strings.Join(lines, "\n"), map[string]any{"revision": rev, "results": results})
			})
		},
	}
}

// parseTxn reads a transaction's JSON.
func parseTxn(r io.Reader) ([]fencekv.Compare, []fencekv.TxnOp, error) {
	var in struct {
		Compare []struct {
			Key      *string `json:"key"`
			Revision uint64  `json:"revision"`
		} `json:"compare"`
		Ops []struct {
			Op    string  `json:"op"`
			Key   *string `json:"key"`
			Value *string `json:"value"`
			Delta int64   `json:"delta"`
		} `json:"ops"`
	}
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, nil, fmt.Errorf("reading the JSON: %v", err)
	}
	var compares []fencekv.Compare
	for i, c := range in.Compare {
		if c.Key == nil {
			return nil, nil, fmt.Errorf("compare %d has no key", i)
		}
		compares = append(compares, fencekv.Compare{Key: []byte(*c.Key), Revision: fencekv.Revision(c.Revision)})
	}
	var ops []fencekv.TxnOp
	for i, o := range in.Ops {
		if o.Key == nil {
			return nil, nil, fmt.Errorf("op %d has no key", i)
		}
		op := fencekv.TxnOp{Key: []byte(*o.Key), Delta: o.Delta}
		switch o.Op {
		case "put":
			if o.Value == nil {
				return nil, nil, fmt.Errorf("op %d: put needs a value", i)
			}
			op.Op, op.Value = state.OpPut, []byte(*o.Value)
		case "delete":
			op.Op = state.OpDelete
		case "incr":
			op.Op = state.OpIncr
		default:
			return nil, nil, fmt.Errorf("op %d: %q is not put, delete or incr", i, o.Op)
		}
		ops = append(ops, op)
	}
	if len(ops) == 0 {
		return nil, nil, fmt.Errorf("no ops")
	}
	return compares, ops, nil
}
