package wire

import (
	"context"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// decodeNodeStatus reads the status fields a cluster node adds (and
// skips any other field).
func decodeNodeStatus(dec *msgpack.Decoder, k string, st *fencekv.Status) (err error) {
	switch k {
	case "node":
		st.Node, err = dec.DecodeString()
	case "role":
		st.Role, err = dec.DecodeString()
	case "leader":
		st.Leader, err = dec.DecodeString()
	case "term":
		st.Term, err = dec.DecodeUint64()
	case "commit_index":
		st.CommitIndex, err = dec.DecodeUint64()
	case "applied_index":
		st.AppliedIndex, err = dec.DecodeUint64()
	case "pid":
		st.PID, err = dec.DecodeInt()
	default:
		err = dec.Skip()
	}
	return err
}

// Term returns the raft term of the cluster node reached, as it is when
// the node answers (0 for a single node).
func (c *Client) Term(ctx context.Context) (uint64, error) {
	return c.uintResult(ctx, "term", "term")
}

// ReadIndex asks a cluster's leader for a read index: its commit index,
// once it has confirmed that it leads. A node that has applied its log up
// to the index may answer, from its own state, a linearizable read that
// arrived before the call. A node that does not lead answers not_leader.
func (c *Client) ReadIndex(ctx context.Context) (uint64, error) {
	return c.uintResult(ctx, "read_index", "index")
}

// uintResult calls method, with no params, and returns the unsigned
// integer its result holds under field.
func (c *Client) uintResult(ctx context.Context, method, field string) (uint64, error) {
	var v uint64
	err := c.do(ctx, method, nil, func(dec *msgpack.Decoder) error {
		return eachField(dec, func(dec *msgpack.Decoder, k string) error {
			if k != field {
				return dec.Skip()
			}
			return decodeTo(dec, &v)
		})
	})
	return v, err
}

// Members lists the nodes of the server's cluster (none for a single
// node).
func (c *Client) Members(ctx context.Context) ([]fencekv.Member, error) {
	var ms []fencekv.Member
	err := c.do(ctx, "members", nil, func(dec *msgpack.Decoder) error {
		return eachField(dec, func(dec *msgpack.Decoder, k string) error {
			if k != "members" {
				return dec.Skip()
			}
			var err error
			ms, err = decodeList(dec, func(m *fencekv.Member, dec *msgpack.Decoder, k string) (err error) {
				switch k {
				case "node":
					m.Node, err = dec.DecodeString()
				case "client_addr":
					m.ClientAddr, err = dec.DecodeString()
				case "raft_addr":
					m.RaftAddr, err = dec.DecodeString()
				case "gossip_addr":
					m.GossipAddr, err = dec.DecodeString()
				case "state":
					m.State, err = dec.DecodeString()
				case "voter":
					m.Voter, err = dec.DecodeBool()
				case "raft_role":
					m.RaftRole, err = dec.DecodeString()
				default:
					err = dec.Skip()
				}
				return err
			})
			return err
		})
	})
	return ms, err
}

// Refusals lists the fenced writes the server refused after sequence
// number since (0: from the oldest it keeps), up to limit (0: the
// default), and the latest sequence number.
func (c *Client) Refusals(ctx context.Context, since uint64, limit int) ([]fencekv.Refusal, uint64, error) {
	var out []fencekv.Refusal
	var last uint64
	err := c.do(ctx, "refusals",
		func(p params) error {
			p.EncodeMapLen(2)
			p.uint("since", since)
			p.int("limit", int64(limit))
			return nil
		},
		func(dec *msgpack.Decoder) error {
			return eachField(dec, func(dec *msgpack.Decoder, k string) error {
				switch k {
				case "last":
					return decodeTo(dec, &last)
				case "refusals":
				default:
					return dec.Skip()
				}
				var err error
				out, err = decodeList(dec, func(r *fencekv.Refusal, dec *msgpack.Decoder, k string) (err error) {
					switch k {
					case "seq":
						err = decodeTo(dec, &r.Seq)
					case "time_ms":
						var ms int64
						ms, err = dec.DecodeInt64()
						r.Time = time.UnixMilli(ms)
					case "code":
						var s string
						s, err = dec.DecodeString()
						r.Code = fencekv.Code(s)
					case "op":
						r.Op, err = dec.DecodeString()
					case "key":
						r.Key, err = dec.DecodeBytes()
					case "lock":
						r.Lock, err = dec.DecodeString()
					case "token":
						err = decodeTo(dec, (*uint64)(&r.Token))
					case "fence":
						err = decodeTo(dec, (*uint64)(&r.Fence))
					case "holder_token":
						err = decodeTo(dec, (*uint64)(&r.Holder))
					case "granted_lock":
						r.GrantedLock, err = dec.DecodeString()
					case "granted_holder":
						r.GrantedHolder, err = dec.DecodeString()
					case "client":
						r.Client, err = dec.DecodeString()
					default:
						err = dec.Skip()
					}
					return err
				})
				return err
			})
		})
	return out, last, err
}

// Txn applies ops, all or none, as one revision, if every compare holds
// (see fencekv.DB.Txn).
func (c *Client) Txn(ctx context.Context, compares []fencekv.Compare, ops []fencekv.TxnOp, w fencekv.WriteOptions) (fencekv.Revision, []fencekv.TxnResult, error) {
	var rev fencekv.Revision
	var rs []fencekv.TxnResult
	err := c.do(ctx, "txn",
		func(p params) error {
			writeParams(p, nil, w, 2)
			p.EncodeString("compare")
			p.EncodeArrayLen(len(compares))
			for _, cmp := range compares {
				p.EncodeMapLen(2)
				p.bin("key", cmp.Key)
				p.uint("revision", uint64(cmp.Revision))
			}
			p.EncodeString("ops")
			p.EncodeArrayLen(len(ops))
			for _, op := range ops {
				p.EncodeMapLen(4)
				p.str("op", op.Op.String())
				p.bin("key", op.Key)
				p.bin("value", op.Value)
				p.int("delta", op.Delta)
			}
			return nil
		},
		func(dec *msgpack.Decoder) error {
			return eachField(dec, func(dec *msgpack.Decoder, k string) error {
				switch k {
				case "revision":
					return decodeTo(dec, (*uint64)(&rev))
				case "results":
				default:
					return dec.Skip()
				}
				var err error
				rs, err = decodeList(dec, func(r *fencekv.TxnResult, dec *msgpack.Decoder, k string) (err error) {
					switch k {
					case "key":
						r.Key, err = dec.DecodeBytes()
					case "fence":
						err = decodeTo(dec, (*uint64)(&r.Fence))
					case "revision":
						err = decodeTo(dec, (*uint64)(&r.Revision))
					case "value":
						r.Int, err = dec.DecodeInt64()
					default:
						err = dec.Skip()
					}
					return err
				})
				return err
			})
		})
	if err != nil {
		return 0, nil, err
	}
	return rev, rs, nil
}

// decodeList reads an array of maps into a new slice: field reads the
// value of key k of one map into its element (and must consume it).
func decodeList[T any](dec *msgpack.Decoder, field func(e *T, dec *msgpack.Decoder, k string) error) ([]T, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]T, max(n, 0))
	for i := range out {
		err := eachField(dec, func(dec *msgpack.Decoder, k string) error { return field(&out[i], dec, k) })
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
