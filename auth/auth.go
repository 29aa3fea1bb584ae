// Package auth reads fencekv's auth file: the principals a server knows,
// their hashed secrets, and what each may do on which key and lock-name
// prefixes. The wire server asks it two things: whether a name and secret
// match (Authenticate), and what a principal may do now (Lookup), through
// an interface of its own (wire.Authenticator).
//
// The file has one principal per line:
//
//	# NAME  HASH                                                          RIGHT...
//	deploy  $2a$10$...                                                    write:deploy/ lock:deploy
//	ops     $2a$10$...                                                    read: admin
//	n0      -                                                             read: write: lock: admin
//
// A RIGHT is read:PREFIX, write:PREFIX (which implies read), lock:PREFIX
// (lock names) or admin (status, members, backup and any method that is
// not about one key or lock). A PREFIX is the bytes after the colon, up
// to the next space; an empty one (write:) covers every key. HASH is what
// `fencekv auth hash` prints (bcrypt), or - for a principal that can only
// be authenticated by its TLS client certificate (its common name is
// NAME). A # at the start of a line or after a space starts a comment.
//
// Secrets are hashed with bcrypt (golang.org/x/crypto/bcrypt): salted,
// slow by design (cost 10: about 70 ms of a CPU per check), and compared
// in constant time. A library beats code of our own here: the format is
// self-describing (cost and salt travel with the hash) and well reviewed.
package auth

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"unicode"

	"golang.org/x/crypto/bcrypt"
)

// MaxSecret is the longest secret: bcrypt reads at most 72 bytes, and a
// longer secret is refused rather than silently cut.
const MaxSecret = 72

// DefaultCost is the bcrypt cost of Hash: 2^10 rounds.
const DefaultCost = bcrypt.DefaultCost

// Hash returns the bcrypt hash of secret at cost (0: DefaultCost), as the
// auth file's HASH field.
func Hash(secret []byte, cost int) (string, error) {
	if err := checkSecret(secret); err != nil {
		return "", err
	}
	if cost == 0 {
		cost = DefaultCost
	}
	if cost < bcrypt.MinCost || cost > bcrypt.MaxCost {
		return "", fmt.Errorf("auth: cost %d is outside %d..%d", cost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	h, err := bcrypt.GenerateFromPassword(secret, cost)
	if err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	return string(h), nil
}

func checkSecret(secret []byte) error {
	switch {
	case len(secret) == 0:
		return errors.New("auth: the secret is empty")
	case len(secret) > MaxSecret:
		return fmt.Errorf("auth: the secret is %d bytes, over the limit of %d", len(secret), MaxSecret)
	}
	return nil
}

// Principal is one line of the file: a name, its hash and its rights.
// It is immutable; a reload makes new ones.
type Principal struct {
	name     string
	hash     []byte // nil: only by TLS client certificate
	admin    bool
	readable []string // read and write prefixes, none a prefix of another, sorted
	writable []string // write prefixes, likewise
	lockable []string // lock prefixes, likewise
}

// Name is the principal's name.
func (p *Principal) Name() string { return p.name }

// Credential identifies the principal's secret as of this file: it changes
// when the line's HASH does, so that sessions authenticated with an old
// secret can be ended.
func (p *Principal) Credential() string {
	if p.hash == nil {
		return "-"
	}
	return string(p.hash)
}

// Admin reports the admin right: status, members, backup, and any method
// that is not about one key or lock.
func (p *Principal) Admin() bool { return p.admin }

// CanRead reports whether p may read key (a read or write right covers it).
func (p *Principal) CanRead(key []byte) bool { return covered(p.readable, key) }

// CanWrite reports whether p may write key.
func (p *Principal) CanWrite(key []byte) bool { return covered(p.writable, key) }

// CanLock reports whether p may acquire, renew, release or describe the
// lock name, or name it in a held write.
func (p *Principal) CanLock(name string) bool { return covered(p.lockable, []byte(name)) }

// ReadPrefixes are the key prefixes p may read, sorted, none a prefix of
// another (so the key ranges they cover are disjoint and in order).
func (p *Principal) ReadPrefixes() []string { return p.readable }

// LockPrefixes are the lock-name prefixes p may use, likewise.
func (p *Principal) LockPrefixes() []string { return p.lockable }

func covered(prefixes []string, key []byte) bool {
	for _, pre := range prefixes {
		if bytes.HasPrefix(key, []byte(pre)) {
			return true
		}
	}
	return false
}

// minimal sorts prefixes and drops each one that another covers.
func minimal(prefixes []string) []string {
	s := slices.Clone(prefixes)
	slices.Sort(s)
	s = slices.Compact(s)
	out := s[:0]
	for _, p := range s {
		// Sorted: a prefix of p sorts before p, and the last kept one is
		// the only candidate (the kept ones cover disjoint ranges).
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// File is a parsed auth file.
type File struct {
	principals map[string]*Principal
	// dummy is checked against when the name is unknown (or can only use
	// a certificate), so that a wrong name costs as long as a wrong secret
	// (of a principal hashed at the file's highest cost: see Costs).
	dummy []byte
	costs []int
}

// Costs returns the bcrypt costs of the file's hashes, lowest first. More
// than one lets a client tell names apart by time: a wrong secret for a
// principal of a lower cost is answered sooner than one for an unknown
// name (checked at the highest).
func (f *File) Costs() []int { return f.costs }

// Len is the number of principals.
func (f *File) Len() int { return len(f.principals) }

// Lookup returns the principal called name, or nil.
func (f *File) Lookup(name string) *Principal { return f.principals[name] }

// Authenticate returns the principal whose name and secret these are, or
// nil. It runs one bcrypt comparison whatever the name, so that the time
// it takes does not tell a known name from an unknown one.
func (f *File) Authenticate(name string, secret []byte) *Principal {
	p := f.principals[name]
	if len(secret) > MaxSecret {
		secret = secret[:MaxSecret] // refused below; hashed all the same
		p = nil
	}
	if p == nil || p.hash == nil || len(secret) == 0 {
		bcrypt.CompareHashAndPassword(f.dummy, secret)
		return nil
	}
	if bcrypt.CompareHashAndPassword(p.hash, secret) != nil {
		return nil
	}
	return p
}

// Parse reads an auth file. An error names the line.
func Parse(r io.Reader) (*File, error) {
	f := &File{principals: map[string]*Principal{}}
	cost := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for line := 1; sc.Scan(); line++ {
		fields := strings.FieldsFunc(uncomment(sc.Text()), unicode.IsSpace)
		if len(fields) == 0 {
			continue
		}
		p, err := parseLine(fields)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if f.principals[p.name] != nil {
			return nil, fmt.Errorf("line %d: principal %q is listed twice", line, p.name)
		}
		f.principals[p.name] = p
		if p.hash != nil {
			c, _ := bcrypt.Cost(p.hash)
			cost = max(cost, c)
			if !slices.Contains(f.costs, c) {
				f.costs = append(f.costs, c)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	slices.Sort(f.costs)
	slices.Sort(f.costs)
	if cost == 0 {
		cost = DefaultCost
	}
	var err error
	f.dummy, err = bcrypt.GenerateFromPassword([]byte("not a secret of anyone's"), cost)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// uncomment cuts a comment: # at the start of the line or after a space.
func uncomment(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t') {
			return s[:i]
		}
	}
	return s
}

func parseLine(fields []string) (*Principal, error) {
	if len(fields) < 3 {
		return nil, fmt.Errorf("want NAME HASH RIGHT..., got %d field(s)", len(fields))
	}
	p := &Principal{name: fields[0]}
	if h := fields[1]; h != "-" {
		if _, err := bcrypt.Cost([]byte(h)); err != nil || !strings.HasPrefix(h, "$2") {
			return nil, fmt.Errorf("principal %q: HASH is not a bcrypt hash (make one with 'fencekv auth hash') or -", p.name)
		}
		p.hash = []byte(h)
	}
	var read, write, lock []string
	for _, r := range fields[2:] {
		kind, prefix, ok := strings.Cut(r, ":")
		switch {
		case r == "admin":
			p.admin = true
		case ok && kind == "read":
			read = append(read, prefix)
		case ok && kind == "write":
			write = append(write, prefix)
		case ok && kind == "lock":
			lock = append(lock, prefix)
		default:
			return nil, fmt.Errorf("principal %q: unknown right %q (want read:PREFIX, write:PREFIX, lock:PREFIX or admin)", p.name, r)
		}
	}
	p.readable = minimal(append(read, write...))
	p.writable = minimal(write)
	p.lockable = minimal(lock)
	return p, nil
}

// Load reads the auth file at path.
func Load(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	defer fh.Close()
	f, err := Parse(fh)
	if err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	return f, nil
}

// Store is the auth file in force: Reload swaps in a new version while
// connections use the old one, each looking its principal up again on
// its next request. Authenticate runs at most one bcrypt check per CPU at
// a time, so that a flood of attempts cannot take every core.
type Store struct {
	path string
	cur  atomic.Pointer[File]
	sem  chan struct{}
}

// Open loads the auth file at path.
func Open(path string) (*Store, error) {
	s := &Store{path: path, sem: make(chan struct{}, max(1, runtime.NumCPU()))}
	if _, err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Path is the file's path.
func (s *Store) Path() string { return s.path }

// Reload reads the file again. On an error the version in force stays.
func (s *Store) Reload() (*File, error) {
	f, err := Load(s.path)
	if err != nil {
		return nil, err
	}
	s.cur.Store(f)
	return f, nil
}

// File is the version in force.
func (s *Store) File() *File { return s.cur.Load() }

// Authenticate checks name and secret against the version in force.
func (s *Store) Authenticate(name string, secret []byte) *Principal {
	s.sem <- struct{}{}
	defer func() { <-s.sem }()
	return s.cur.Load().Authenticate(name, secret)
}

// Lookup returns the principal called name in the version in force, or nil.
func (s *Store) Lookup(name string) *Principal { return s.cur.Load().Lookup(name) }
