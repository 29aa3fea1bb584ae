package wire

import (
	"context"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/vmihailenco/msgpack/v5"
)

// Semaphores on the wire (PROTOCOL.md §5.2): acquire takes an optional
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

// WithSemaphore is WithLock for one of limit permits of name (a
// semaphore, limit 2..MaxPermits; 1 is a plain lock): it acquires a
// permit for ttl (waiting up to o.Wait, FIFO behind the others waiting),
// calls fn with a context and the permit's lease, renews the permit while
// fn runs, and releases it when fn returns. The lease's token is the
// permit's: pass it, with Lock: name, to held writes. Everything WithLock
// says holds for the permit (the context's ErrLeaseLost, a lost answer
// looked up by holder name). o.Limit is ignored: limit is used.
func (c *Client) WithSemaphore(ctx context.Context, name string, limit int, ttl time.Duration, o *LockOptions,
	fn func(ctx context.Context, l fencekv.Lease) error) error {
	var lo LockOptions
	if o != nil {
		lo = *o
	}
	lo.Limit = limit
	return c.WithLock(ctx, name, ttl, &lo, fn)
}

// heldBy returns the token of the live permit (or plain lease) of in held
// under holder, if there is one.
func heldBy(in fencekv.LockInfo, holder string) (fencekv.Token, bool) {
	for _, h := range in.Holders() {
		if h.Holder == holder {
			return h.Token, true
		}
	}
	return 0, false
}
