package state

import "github.com/fencekv/fencekv/lease"

// Semaphores (lease/semaphore.go) are acquires with Lease.Limit > 1. The
// limit is carried by commands of encoding version 3 (encodingV3): a binary
// that predates it refuses a batch holding one with ErrVersion, and a
// semaphore's lock record with a record-version error, instead of applying
// a semaphore acquire as a plain one.

// maxLimit bounds the limit a decoded command may carry: a larger one is a
// damaged command (errBadCommand), not a refusal.
const maxLimit = lease.MaxPermits

// Holder is one live permit of a lock (LockInfo.Holders).
type Holder = lease.Holder

// needsV3 reports whether c can only be written at encoding version 3: a
// semaphore acquire. Every other command is written at version 2, byte for
// byte what a binary without semaphores writes.
func needsV3(c *Command) bool { return c.Op == OpAcquire && c.Lease.Limit > 1 }

// upgradeV3 re-encodes the version 2 batch b at version 3 (a command that
// needs it is being added). The batch so far was written by this build, so
// it decodes; if it does not, that is a bug, not bad input.
func upgradeV3(b []byte) []byte {
	out := make([]byte, 1, len(b)+len(b)/8+16)
	out[0] = encodingV3
	rest := b[1:]
	for len(rest) > 0 {
		c, r, err := readCommand(rest, 2)
		if err != nil {
			panic("state: re-encoding a batch at version 3: " + err.Error())
		}
		out = appendCommand(out, &c, 3)
		rest = r
	}
	return out
}
