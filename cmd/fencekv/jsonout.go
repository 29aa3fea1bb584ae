package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"unicode/utf8"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// With --json, a command prints one JSON object on stdout: its result, or,
// if it fails, its error (see errorJSON); the exit status is the same
// either way. Field names are snake_case, durations are integers named
// for their unit (ttl_ms, retry_ms, rtt_us), and keys, values, lock names
// and holders are strings: their bytes as they are when they are UTF-8,
// else base64 with a sibling field NAME_encoding set to "base64".
// run-locked is the exception: its stdout is its command's, so its
// report (and its errors) go to stderr.

// setText sets m[field] to b as JSON text: the string if b is UTF-8, else
// its base64, with m[field+"_encoding"] = "base64" to say so. It returns m.
func setText(m map[string]any, field string, b []byte) map[string]any {
	if utf8.Valid(b) {
		m[field] = string(b)
		return m
	}
	m[field] = base64.StdEncoding.EncodeToString(b)
	m[field+"_encoding"] = "base64"
	return m
}

// The codes of errors that are not the server's refusals, in errorJSON.
const (
	errUsage       = "usage"       // a mistake on the command line
	errUnavailable = "unavailable" // no connection, or it broke (outcome "unknown": a write may have been applied)
	errTimeout     = "timeout"     // no answer within --timeout (outcome "unknown" for a command that changes state)
	errLeaseLost   = "lease_lost"  // run-locked: the lease may have been lost
	errSignalled   = "signalled"   // run-locked: a signal ended the wait for the lock
	errTLS         = "tls"         // TLS refused the connection before any request was read: a setting to fix (no outcome: nothing was sent to the store)
	errOther       = "error"       // anything else (a local file, a broken data dir, ...)
)

// errorJSON is how an error is reported with --json:
//
//	{"error": CODE, "message": TEXT, ...facts}
//
// CODE is the refusal's code (stale_token, lock_held, ...: wire/PROTOCOL.md
// §6) with its facts (fence, token, holder, retry_ms, revision, key,
// leader, outcome), or one of usage, unavailable, timeout, tls,
// lease_lost, signalled, error.
func errorJSON(err error) map[string]any {
	out := map[string]any{"error": errOther, "message": err.Error()}
	var fe *fencekv.Error
	var ce *wire.ConnError
	var ue usageError
	var te *wire.TLSError
	switch {
	case errors.As(err, &ue):
		out["error"] = errUsage
	case errors.As(err, &te):
		out["error"] = errTLS
	case errors.As(err, &fe):
		out["error"] = fe.Code
		switch fe.Code {
		case fencekv.CodeStaleToken:
			out["fence"] = fe.Fence
		case fencekv.CodeNotHolder, fencekv.CodeLeaseExpired:
			out["token"] = fe.Token
		case fencekv.CodeLockHeld:
			out["holder"], out["token"], out["retry_ms"] = fe.Holder, fe.Token, fe.RetryAfter.Milliseconds()
		case fencekv.CodeCompareFailed, fencekv.CodeCompacted:
			out["revision"] = fe.Revision
		}
		if fe.Key != "" {
			setText(out, "key", []byte(fe.Key))
		}
		if fe.Leader != "" {
			out["leader"] = fe.Leader
		}
		if fe.Outcome != "" {
			out["outcome"] = fe.Outcome
		}
	case errors.As(err, &ce):
		out["error"] = errUnavailable
		if ce.Outcome != "" {
			out["outcome"] = ce.Outcome
		}
	case errors.Is(err, wire.ErrClientClosed), errors.As(err, new(*net.OpError)):
		out["error"] = errUnavailable // no connection: nothing was sent
	case errors.Is(err, context.DeadlineExceeded):
		out["error"] = errTimeout
		var te timeoutError
		if errors.As(err, &te) && te.outcome != "" {
			out["outcome"] = te.outcome
		}
	}
	return out
}

// writeErrorJSON writes errorJSON(err) as one line.
func writeErrorJSON(w io.Writer, err error) {
	json.NewEncoder(w).Encode(errorJSON(err))
}

// jsonRequested reports whether the command line asks for --json (before
// any "--", after which the arguments are a command's or a value).
func jsonRequested(args []string) bool {
	for _, a := range args[1:] {
		switch a {
		case "--":
			return false
		case "--json", "-json", "--json=true", "-json=true":
			return true
		}
	}
	return false
}

// commandName is the command a command line runs: its first argument that
// is not a flag.
func commandName(args []string) string {
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}
