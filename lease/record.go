package lease

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/fencekv/fencekv/fence"
)

// Record is a lock's durable state, kept in the store's locks bucket.
//
// Times are points on the proposer's monotonic clock (see Manager). They are
// stored so that every replica judges held writes the same way, and they are
// re-armed with full TTLs by Rearm after a restart or a leader change.
type Record struct {
	Token      fence.Token   // the lock's latest grant
	Holder     string        // display name given by the holder
	TTL        time.Duration // lease length, granted again on every renew
	LockDelay  time.Duration // after an expiry, nobody may acquire for this long
	Deadline   time.Duration // the lease runs out at this time
	Expired    bool          // the lease ran out (it was not released)
	DelayUntil time.Duration // nonzero: in lock-delay until this time
	ForgetAt   time.Duration // an expired, free lock's record is deleted at this time
}

// Retention is how long the record of a lock whose lease expired is kept
// once the lock is free: until then its late holder is told lease_expired
// (after it, not_holder), and then the record is deleted, so that lock
// names used once do not pile up.
const Retention = 10 * time.Minute

const (
	recordVersion = 2
	recordFields  = 6 // uint64 fields after the version and flag bytes
	recordHeader  = 2 + recordFields*8
)

// held reports whether the lease is live at now.
func (r *Record) held(now time.Duration) bool {
	return !r.Expired && now < r.Deadline
}

// delayEnd is when the lock becomes acquirable after an expiry; 0 if it
// already is (or the lease is still live).
func (r *Record) delayEnd() time.Duration {
	switch {
	case r.Expired:
		return r.DelayUntil
	case r.LockDelay > 0:
		return r.Deadline + r.LockDelay
	}
	return 0
}

func (r *Record) marshal() []byte {
	b := make([]byte, 2, recordHeader+len(r.Holder))
	b[0] = recordVersion
	if r.Expired {
		b[1] = 1
	}
	b = binary.BigEndian.AppendUint64(b, uint64(r.Token))
	b = binary.BigEndian.AppendUint64(b, uint64(r.TTL))
	b = binary.BigEndian.AppendUint64(b, uint64(r.LockDelay))
	b = binary.BigEndian.AppendUint64(b, uint64(r.Deadline))
	b = binary.BigEndian.AppendUint64(b, uint64(r.DelayUntil))
	b = binary.BigEndian.AppendUint64(b, uint64(r.ForgetAt))
	return append(b, r.Holder...)
}

func unmarshal(b []byte) (Record, error) {
	// Check the length before reading the version byte: an empty record
	// must be reported as bad, not index out of range.
	if len(b) < recordHeader {
		return Record{}, fmt.Errorf("lease: bad record (%d bytes, want at least %d)", len(b), recordHeader)
	}
	if b[0] != recordVersion {
		return Record{}, fmt.Errorf("lease: bad record (version %d, want %d)", b[0], recordVersion)
	}
	u := func(i int) uint64 { return binary.BigEndian.Uint64(b[2+8*i:]) }
	return Record{
		Expired:    b[1]&1 != 0,
		Token:      fence.Token(u(0)),
		TTL:        time.Duration(u(1)),
		LockDelay:  time.Duration(u(2)),
		Deadline:   time.Duration(u(3)),
		DelayUntil: time.Duration(u(4)),
		ForgetAt:   time.Duration(u(5)),
		Holder:     string(b[recordHeader:]),
	}, nil
}
