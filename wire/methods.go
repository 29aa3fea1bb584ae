package wire

import "context"

// The methods of the protocol, and the facts of each: one table, read by
// the server (which handler serves a method, whether the connection's
// reader serves it itself, whether the event loop starts it, what rights
// it needs) and by the client (what a call broken by its connection
// means). PROTOCOL.md documents every method; TestProtocolListsEveryMethod
// checks that it lists each of this table's.
//
// A new method is one entry here: its handler (server_methods.go, or a
// file of its own), and its facts. A method of the connection's own state
// (watch, backup) sets conn instead of call.

// methodSpec states the facts of one method.
type methodSpec struct {
	// call serves the method: it reads the arguments and writes the
	// result map (server_methods.go). nil for a method of the connection
	// (conn), and for watch and unwatch, which the connection serves
	// itself (watch.go).
	call method
	// conn serves a method that works on the connection's own state
	// (backup.go), where call is nil.
	conn connMethod
	// start, if set, lets the event loop start the write without a
	// goroutine waiting for its commit (server_start.go).
	start starter
	// readOnly: the connection's reader serves it itself. It never waits
	// for a commit or a lock; the answers that can be large are among
	// them (scan pages, lock lists, values), so that one connection
	// builds them one at a time, each within its budget of unsent
	// answers.
	readOnly bool
	// stream: it starts what later messages carry on (watch: a stream
	// of notifications; backup: one of chunks, read with backup_read).
	stream bool
	// effect is what the method changes.
	effect effect
	// resend is what the client makes of a call whose connection broke
	// after the call was sent.
	resend resend
	// right is what the connection's principal needs to call it (with
	// an auth file: auth.go).
	right right
}

// connMethod serves a method of connection c's own state.
type connMethod func(c *conn, ctx context.Context, eng Engine, a *args, e *encoder) error

// effect is what a method changes.
type effect uint8

const (
	effectNone  effect = iota // nothing: a read
	effectStore               // the store (a write; a cluster replicates it)
	effectConn                // the connection's own state (its principal, watches, backup, forwarding mark)
)

// resend is the client's rule for a call broken by its connection after
// it was sent.
type resend uint8

const (
	// resendUnsafe: the call may have taken effect; its outcome is
	// unknown (ConnError.Outcome), and the client does not send it
	// again by itself.
	resendUnsafe resend = iota
	// resendSafe: the call changes nothing, so its outcome is never in
	// doubt and it may be sent again, on any connection.
	resendSafe
)

// right is what a principal needs to call a method (auth.go, allowed).
type right uint8

const (
	rightAdmin    right = iota // admin: the rule for any method that states no other
	rightAny                   // none, and no principal: ping, forwarding (which only restricts)
	rightSelf                  // auth, which authenticates the connection
	rightReadKey               // read the key
	rightWriteKey              // write the key, and use the lock if one is named
	rightLock                  // use the lock
	rightTxn                   // write every key it writes, read every key it compares, use the lock
	rightWatch                 // read everything under the prefix (and, with locks, lock it)
	rightOwn                   // any principal: the connection's own watch (unwatch)
	rightClipped               // any principal: the method clips its answer to the principal's prefixes
)

// methodSpecs is the protocol: one entry per method of PROTOCOL.md.
var methodSpecs = map[string]methodSpec{
	"ping":      {call: ping, readOnly: true, resend: resendSafe, right: rightAny},
	"get":       {call: get, readOnly: true, resend: resendSafe, right: rightReadKey},
	"put":       {call: waited(startPut), start: startPut, effect: effectStore, right: rightWriteKey}, // server_start.go: the same checks and results
	"delete":    {call: waited(startDelete), start: startDelete, effect: effectStore, right: rightWriteKey},
	"cas":       {call: waited(startCAS), start: startCAS, effect: effectStore, right: rightWriteKey},
	"incr":      {call: waited(startIncr), start: startIncr, effect: effectStore, right: rightWriteKey},
	"scan":      {call: scan, readOnly: true, resend: resendSafe, right: rightClipped},
	"acquire":   {call: acquire, start: startAcquire, effect: effectStore, right: rightLock},
	"renew":     {call: waited(startRenew), start: startRenew, effect: effectStore, right: rightLock},
	"release":   {call: waited(startRelease), start: startRelease, effect: effectStore, right: rightLock},
	"lock_info": {call: lockInfo, readOnly: true, resend: resendSafe, right: rightLock},
	"locks":     {call: locks, readOnly: true, resend: resendSafe, right: rightClipped},
	"status":    {call: status, readOnly: true, resend: resendSafe},
	"members":   {call: members, resend: resendSafe},
	"term":      {call: term, readOnly: true, resend: resendSafe},
	// Not readOnly: it waits for the leader's quorum round, which would
	// hold up the requests behind it on a follower's one connection.
	"read_index": {call: readIndex, resend: resendSafe},
	"refusals":   {call: refusals, resend: resendSafe},
	"txn":        {call: txn, effect: effectStore, right: rightTxn},
	"auth":       {call: authenticate, effect: effectConn, right: rightSelf}, // auth.go

	// The connection's own (watch.go, backup.go, server.go).
	"watch":   {stream: true, effect: effectConn, right: rightWatch},
	"unwatch": {effect: effectConn, right: rightOwn},
	"backup":  {conn: (*conn).backupMethod, stream: true, effect: effectConn},
	// backup_read moves the backup's position: sent again, it would be
	// refused (or read the next chunk), so it is not safe to resend.
	"backup_read": {conn: (*conn).backupReadMethod, readOnly: true, effect: effectConn},
	"forwarding":  {conn: (*conn).forwardingMethod, effect: effectConn, right: rightAny},
}

// methodInfo is what the server knows of a method: parsing a request
// finds it once, by the method's name, for everything that depends on it.
type methodInfo struct {
	name string // the name, so that a request's method is not allocated
	methodSpec
}

// serve runs the method's handler for a request on c.
func (info *methodInfo) serve(c *conn, ctx context.Context, a *args, e *encoder) error {
	if info.call != nil {
		return info.call(ctx, c.s.eng, a, e)
	}
	return info.conn(c, ctx, c.s.eng, a, e)
}

// methodTable holds every method the server knows, by name.
var methodTable = map[string]*methodInfo{}

// methodSlots holds the methods again, each at the slot methodSlot gives
// its name unless another took it first (TestMethodSlots: none does): a
// request's method is found with one load and a compare, not a map lookup.
var methodSlots [256]*methodInfo

func methodSlot(name []byte) int {
	n := len(name)
	if n == 0 {
		return 0
	}
	return (n + int(name[0])*2 + int(name[n/2])*7 + int(name[n-1])) & (len(methodSlots) - 1)
}

// methodSlotString is methodSlot of a name held as a string (not one
// generic function: its instances were not inlined on the parse path).
func methodSlotString(name string) int {
	n := len(name)
	if n == 0 {
		return 0
	}
	return (n + int(name[0])*2 + int(name[n/2])*7 + int(name[n-1])) & (len(methodSlots) - 1)
}

// methodOf returns the method named name, or nil if the server knows none.
func methodOf(name []byte) *methodInfo {
	if info := methodSlots[methodSlot(name)]; info != nil && info.name == string(name) {
		return info
	}
	return methodTable[string(name)]
}

// infoOf is methodOf for a name held as a string.
func infoOf(name string) *methodInfo {
	if info := methodSlots[methodSlotString(name)]; info != nil && info.name == name {
		return info
	}
	return methodTable[name]
}

// rightOf returns the right method needs: admin for a method the table
// does not know.
func rightOf(method string) right {
	if info := infoOf(method); info != nil {
		return info.right
	}
	return rightAdmin
}

// safeToResend reports whether a call of method changes nothing, so that
// its outcome is never in doubt (the client's rule; false for a method the
// table does not know).
func safeToResend(method string) bool {
	info := infoOf(method)
	return info != nil && info.resend == resendSafe
}

func init() {
	for n, spec := range methodSpecs {
		info := &methodInfo{name: n, methodSpec: spec}
		methodTable[n] = info
		if slot := &methodSlots[methodSlotString(n)]; *slot == nil {
			*slot = info
		}
	}
}
