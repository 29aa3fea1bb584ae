package auth

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Tests hash at bcrypt's lowest cost: the checks are the same, faster.
func hash(t *testing.T, secret string) string {
	t.Helper()
	h, err := Hash([]byte(secret), 4)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestParseRights(t *testing.T) {
	h := hash(t, "s3cret")
	f, err := Parse(strings.NewReader(`
# a comment line
deploy ` + h + ` write:deploy/ lock:deploy read:config/ read:deploy/x  # a comment after a space
ops    ` + h + ` read: admin
issues ` + h + ` write:issue#5
n0     -       read: write: lock: admin
`))
	if err != nil {
		t.Fatal(err)
	}
	if f.Len() != 4 {
		t.Fatalf("Len = %d, want 4", f.Len())
	}
	d := f.Lookup("deploy")
	for _, c := range []struct {
		what string
		got  bool
		want bool
	}{
		{"deploy reads deploy/a (write implies read)", d.CanRead([]byte("deploy/a")), true},
		{"deploy writes deploy/a", d.CanWrite([]byte("deploy/a")), true},
		{"deploy reads config/x", d.CanRead([]byte("config/x")), true},
		{"deploy writes config/x", d.CanWrite([]byte("config/x")), false},
		{"deploy reads other", d.CanRead([]byte("other")), false},
		{"deploy reads deploy (shorter than the prefix)", d.CanRead([]byte("deploy")), false},
		{"deploy locks deploy", d.CanLock("deploy"), true},
		{"deploy locks deploy-2", d.CanLock("deploy-2"), true},
		{"deploy locks jobs", d.CanLock("jobs"), false},
		{"deploy is admin", d.Admin(), false},
		{"ops reads anything", f.Lookup("ops").CanRead([]byte("\x00any")), true},
		{"ops writes", f.Lookup("ops").CanWrite([]byte("a")), false},
		{"ops locks", f.Lookup("ops").CanLock("a"), false},
		{"ops is admin", f.Lookup("ops").Admin(), true},
		{"# inside a right is not a comment", f.Lookup("issues").CanWrite([]byte("issue#5/a")), true},
		{"n0 writes anything", f.Lookup("n0").CanWrite([]byte("x")), true},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	if got, want := d.ReadPrefixes(), []string{"config/", "deploy/"}; !slices.Equal(got, want) {
		t.Errorf("ReadPrefixes = %q, want %q (deploy/x is inside deploy/)", got, want)
	}
	if got, want := f.Lookup("ops").ReadPrefixes(), []string{""}; !slices.Equal(got, want) {
		t.Errorf("ops ReadPrefixes = %q, want %q", got, want)
	}
	if f.Lookup("nobody") != nil {
		t.Error("Lookup of an unknown name is not nil")
	}
}

func TestParseErrors(t *testing.T) {
	h := hash(t, "x")
	for _, c := range []struct{ file, want string }{
		{"alice " + h, "line 1: want NAME HASH RIGHT..."},
		{"alice plaintext read:", "HASH is not a bcrypt hash"},
		{"alice $2a$10$short read:", "HASH is not a bcrypt hash"},
		{"alice " + h + " read:a\n\nalice " + h + " read:b", "line 3: principal \"alice\" is listed twice"},
		{"alice " + h + " rwx", "unknown right \"rwx\""},
		{"alice " + h + " Read:a", "unknown right"},
		{"alice " + h + " admin:x", "unknown right"},
	} {
		_, err := Parse(strings.NewReader(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", c.file, err, c.want)
		}
	}
}

func TestAuthenticate(t *testing.T) {
	f, err := Parse(strings.NewReader("alice " + hash(t, "right") + " read:\ncert - read:\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := f.Authenticate("alice", []byte("right")); p == nil || p.Name() != "alice" {
		t.Errorf("the right secret: %v", p)
	}
	for _, c := range []struct{ name, secret string }{
		{"alice", "wrong"},
		{"alice", ""},
		{"alice", "right\n"},
		{"alice", strings.Repeat("r", 100)},
		{"bob", "right"},  // unknown
		{"cert", "right"}, // certificate only
		{"cert", "-"},
		{"", ""},
	} {
		if p := f.Authenticate(c.name, []byte(c.secret)); p != nil {
			t.Errorf("Authenticate(%q, %q) = %v, want nil", c.name, c.secret, p.Name())
		}
	}
}

// An unknown name costs a bcrypt check like a wrong secret, so timing
// does not tell which names exist. Measured at cost 7 (about 6 ms), where
// skipping the check would make an unknown name a hundred times faster.
func TestUnknownNameTakesAsLong(t *testing.T) {
	h, err := Hash([]byte("right"), 7)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse(strings.NewReader("alice " + h + " read:\n"))
	if err != nil {
		t.Fatal(err)
	}
	timeIt := func(name string) time.Duration {
		best := time.Duration(1 << 62)
		for range 3 {
			start := time.Now()
			f.Authenticate(name, []byte("wrong"))
			best = min(best, time.Since(start))
		}
		return best
	}
	known, unknown := timeIt("alice"), timeIt("nobody")
	if unknown < known/2 {
		t.Errorf("an unknown name took %v, a wrong secret %v: the name's existence shows", unknown, known)
	}
}

// TestCosts: the file tells which bcrypt costs its hashes have, so that
// the server can warn of more than one (a lower cost answers sooner than
// an unknown name, checked at the highest).
func TestCosts(t *testing.T) {
	h5, err := Hash([]byte("b"), 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		file string
		want []int
	}{
		{"alice " + hash(t, "a") + " read:\n", []int{4}},
		{"alice " + hash(t, "a") + " read:\nbob " + h5 + " read:\ncarol " + hash(t, "c") + " read:\n", []int{4, 5}},
	} {
		f, err := Parse(strings.NewReader(tt.file))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(f.Costs(), tt.want) {
			t.Errorf("Costs() = %v; want %v", f.Costs(), tt.want)
		}
	}
}

func TestHashRefuses(t *testing.T) {
	if _, err := Hash(nil, 4); err == nil {
		t.Error("an empty secret was hashed")
	}
	if _, err := Hash(make([]byte, MaxSecret+1), 4); err == nil {
		t.Error("a secret over 72 bytes was hashed")
	}
	if _, err := Hash([]byte("x"), 3); err == nil {
		t.Error("cost 3 was accepted")
	}
	h, err := Hash([]byte("x"), 0)
	if err != nil || !strings.HasPrefix(h, "$2a$10$") {
		t.Errorf("Hash at the default cost = %q, %v", h, err)
	}
}

func TestStoreReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h := hash(t, "pw")
	write("alice " + h + " write:a/\n")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if p := s.Authenticate("alice", []byte("pw")); p == nil || !p.CanWrite([]byte("a/1")) {
		t.Fatal("alice cannot authenticate or write a/")
	}
	write("alice " + h + " read:a/\n")
	if _, err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if s.Lookup("alice").CanWrite([]byte("a/1")) {
		t.Error("after the reload alice can still write a/")
	}
	write("alice " + h + " bogus\n")
	if _, err := s.Reload(); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("reload of a bad file: %v", err)
	}
	if s.Lookup("alice") == nil || !s.Lookup("alice").CanRead([]byte("a/1")) {
		t.Error("a bad file replaced the one in force")
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Open of a missing file succeeded")
	}
}
