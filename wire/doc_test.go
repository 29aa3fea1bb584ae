package wire

import (
	"os"
	"regexp"
	"slices"
	"sort"
	"testing"
)

// TestProtocolDocListsEveryMethod: PROTOCOL.md's table of methods names
// exactly the methods the server knows, and each has its own section, so
// that the wire contract stays true as methods are added.
func TestProtocolDocListsEveryMethod(t *testing.T) {
	doc, err := os.ReadFile("PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| \\[`([a-z_]+)`\\]\\(#([a-z_]+)\\) \\|").FindAllSubmatch(doc, -1) {
		name, anchor := string(m[1]), string(m[2])
		listed = append(listed, name)
		if anchor != name && !(name == "unwatch" && anchor == "watch") {
			t.Errorf("PROTOCOL.md's method table links %s to #%s", name, anchor)
		}
	}
	var known []string
	for name := range methodTable {
		known = append(known, name)
	}
	sort.Strings(listed)
	sort.Strings(known)
	if !slices.Equal(listed, known) {
		t.Errorf("PROTOCOL.md's method table lists %v;\nthe server knows %v", listed, known)
	}
	for _, name := range known {
		// unwatch shares watch's section.
		if name != "unwatch" && !regexp.MustCompile("(?m)^### "+name+"$").Match(doc) {
			t.Errorf("PROTOCOL.md has no section \"### %s\"", name)
		}
	}
}
