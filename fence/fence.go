// Package fence is the vocabulary every layer of fencekv shares: fencing
// tokens, store revisions, and refusals (errors with a stable code and the
// facts to act on them). It imports nothing of fencekv, so the storage
// engine, the lease manager, the engine, the cluster and the wire protocol
// all speak the same errors: errors.Is(err, fencekv.ErrStaleToken) holds
// for a refusal made embedded or decoded from the wire.
package fence

import "strconv"

// Token is a fencing token: one value of the store-wide sequence that lock
// grants draw from (G1). 0 means "no token".
type Token uint64

func (t Token) String() string { return strconv.FormatUint(uint64(t), 10) }

// Revision counts accepted writes store-wide; each key reports the revision
// of its last change. 0 means "never written".
type Revision uint64

func (r Revision) String() string { return strconv.FormatUint(uint64(r), 10) }
