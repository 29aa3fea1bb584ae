package metrics

import (
	"os"
	"regexp"
	"testing"
)

// TestEveryProtocolMethodHasSeries: each method of the wire protocol (as
// wire/PROTOCOL.md's table lists them; a wire test keeps that table equal
// to the server's methods) is counted under its own name, not "unknown".
func TestEveryProtocolMethodHasSeries(t *testing.T) {
	doc, err := os.ReadFile("../wire/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	ms := regexp.MustCompile("(?m)^\\| \\[`([a-z_]+)`\\]\\(#[a-z_]+\\) \\|").FindAllSubmatch(doc, -1)
	if len(ms) < 20 {
		t.Fatalf("found %d methods in PROTOCOL.md's table; the pattern no longer matches it", len(ms))
	}
	unknown := methodIndex("unknown")
	for _, m := range ms {
		name := string(m[1])
		if i := methodIndex(name); i == unknown || methodNames[i] != name {
			t.Errorf("method %q has no series of its own (index %d)", name, i)
		}
	}
}
