package wire

import (
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// Semaphores on the wire (PROTOCOL.md §5.7): acquire takes an optional
// "limit" (permits, 1..MaxPermits; absent: 1, a plain lock); lock_info and
// locks answer a semaphore's map with "limit" and "holders" (absent for a
// plain lock, whose map is unchanged).

// acquireLimit is the limit an acquire asked for: 0 when it gave none (a
// plain lock), else 1..MaxPermits or bad_request.
func acquireLimit(a *args) (int, error) {
	if a.has&fLimit == 0 {
		return 0, nil
	}
	if a.limit < 1 || a.limit > fencekv.MaxPermits {
		return 0, badRequest("limit %d is outside 1..%d", a.limit, fencekv.MaxPermits)
	}
	return int(a.limit), nil
}

// semFields is how many fields semaphore adds to a lock map.
func semFields(in *fencekv.LockInfo) int {
	if in.Sem == nil {
		return 0
	}
	return 2
}

// semaphore writes a semaphore's "limit" and "holders" into a lock map.
func (e *encoder) semaphore(in *fencekv.LockInfo) {
	if in.Sem == nil {
		return
	}
	e.int("limit", int64(in.Sem.Limit))
	e.EncodeString("holders")
	e.EncodeArrayLen(len(in.Sem.Holders))
	for _, h := range in.Sem.Holders {
		e.EncodeMapLen(3)
		e.str("holder", h.Holder)
		e.uint("token", uint64(h.Token))
		e.int("ttl_ms", toMs(h.TTL))
	}
}

// decodeSem reads a lock map's "limit" or "holders" (key k) into in.Sem.
func decodeSem(dec *msgpack.Decoder, k string, in *fencekv.LockInfo) error {
	if in.Sem == nil {
		in.Sem = &fencekv.SemInfo{}
	}
	if k == "limit" {
		n, err := dec.DecodeInt()
		in.Sem.Limit = n
		return err
	}
	n, err := dec.DecodeArrayLen()
	if err != nil || n <= 0 {
		return err
	}
	in.Sem.Holders = make([]fencekv.Holder, n)
	for i := range in.Sem.Holders {
		h := &in.Sem.Holders[i]
		err := eachField(dec, func(dec *msgpack.Decoder, k string) (err error) {
			switch k {
			case "holder":
				h.Holder, err = dec.DecodeString()
			case "token":
				err = decodeTo(dec, (*uint64)(&h.Token))
			case "ttl_ms":
				var ms int64
				ms, err = dec.DecodeInt64()
				h.TTL = time.Duration(ms) * time.Millisecond
			default:
				err = dec.Skip()
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}
