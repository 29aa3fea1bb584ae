package cluster

import (
	"errors"
	"testing"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// TestForwardErrorNotSent: a forwarded write that never left the node
// (its connection to the leader was gone and could not be made again) is
// unavailable without an unknown outcome; one whose connection broke
// after it was sent keeps the unknown outcome.
func TestForwardErrorNotSent(t *testing.T) {
	f := &forwarder{}
	notSent := &wire.ConnError{Addr: "10.0.0.1:7420", Err: errors.New("dial tcp 10.0.0.1:7420: connect: connection refused")}
	var fe *fencekv.Error
	if err := f.forwardError(nil, notSent, true); !errors.As(err, &fe) || fe.Code != fencekv.CodeUnavailable || fe.Outcome != "" {
		t.Errorf("a write never sent: %v (outcome %q), want unavailable without an outcome", err, fe.Outcome)
	}
	sent := &wire.ConnError{Addr: "10.0.0.1:7420", Outcome: fencekv.OutcomeUnknown, Err: errors.New("connection reset by peer")}
	if err := f.forwardError(nil, sent, true); !errors.As(err, &fe) || fe.Code != fencekv.CodeUnavailable || fe.Outcome != fencekv.OutcomeUnknown {
		t.Errorf("a write sent, then the connection broke: %v, want unavailable with outcome unknown", err)
	}
}
