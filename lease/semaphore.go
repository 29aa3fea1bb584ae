package lease

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/fencekv/fencekv/fence"
)

// Semaphores: a lock with a limit of N permits (Request.Limit > 1). Each
// permit is a lease of its own, with its own token from the store-wide
// sequence; renew, release and held writes name the lock and the permit's
// token, exactly as for a plain lock. A semaphore is kept as one record of
// its own kind (semVersion) under its name in the locks bucket: a binary
// that predates semaphores refuses it ("bad record (version 3, want 2)")
// rather than misreading it.
//
// The limit is fixed by the first acquire while any permit is live: an
// acquire with another limit (a plain acquire included, limit 1) is
// refused with fence.CodeLimitMismatch and changes nothing. Once no permit
// is live the next acquire sets the limit anew (and a plain acquire turns
// the name back into a plain lock). Lock-delay is refused for limit > 1
// (CheckAcquire): an expired permit frees its slot at once.
//
// A permit that expired is kept, marked, for Retention (at most Limit of
// them, the newest), so that its late holder is told lease_expired rather
// than not_holder, as for a plain lock.

// MaxPermits is the largest semaphore limit. A semaphore's record holds
// all its permits and is rewritten by each of its commands.
const MaxPermits = 256

const semVersion = 3

// Permit is one permit of a semaphore.
type Permit struct {
	Token    fence.Token
	Holder   string
	TTL      time.Duration
	Deadline time.Duration
	Expired  bool
	ForgetAt time.Duration // expired: the permit is forgotten at this time
}

// Holder is one live permit of a lock, as Info lists it.
type Holder struct {
	Holder string
	Token  fence.Token
	TTL    time.Duration // time left; 0 when it ran out and its expiry is not applied yet
}

// semRecord is a semaphore's durable state. Permits are in token order.
type semRecord struct {
	Limit   int
	Last    fence.Token // the latest grant
	Permits []Permit
}

// isSem reports whether a stored lock record is a semaphore's.
func isSem(raw []byte) bool { return len(raw) > 0 && raw[0] == semVersion }

func (s *semRecord) marshal() []byte {
	b := make([]byte, 0, 16+len(s.Permits)*40)
	b = append(b, semVersion, 0)
	b = binary.AppendUvarint(b, uint64(s.Limit))
	b = binary.AppendUvarint(b, uint64(s.Last))
	b = binary.AppendUvarint(b, uint64(len(s.Permits)))
	for _, p := range s.Permits {
		var flags byte
		if p.Expired {
			flags = 1
		}
		b = append(b, flags)
		b = binary.AppendUvarint(b, uint64(p.Token))
		b = binary.AppendVarint(b, int64(p.TTL))
		b = binary.AppendVarint(b, int64(p.Deadline))
		b = binary.AppendVarint(b, int64(p.ForgetAt))
		b = binary.AppendUvarint(b, uint64(len(p.Holder)))
		b = append(b, p.Holder...)
	}
	// Zeros up to a plain record's least length, so that a binary without
	// semaphores reads the version byte and says "bad record (version 3,
	// want 2)" rather than that the record is short.
	for len(b) < recordHeader {
		b = append(b, 0)
	}
	return b
}

func unmarshalSem(b []byte) (semRecord, error) {
	if len(b) < 2 || b[0] != semVersion {
		return semRecord{}, fmt.Errorf("lease: bad semaphore record")
	}
	r := reader{b: b[2:]}
	s := semRecord{Limit: int(r.uvarint()), Last: fence.Token(r.uvarint())}
	n := r.uvarint()
	if n > uint64(len(r.b)) || s.Limit < 1 || s.Limit > MaxPermits {
		return semRecord{}, fmt.Errorf("lease: bad semaphore record (limit %d, %d permits)", s.Limit, n)
	}
	s.Permits = make([]Permit, n)
	for i := range s.Permits {
		p := &s.Permits[i]
		p.Expired = r.byte()&1 != 0
		p.Token = fence.Token(r.uvarint())
		p.TTL = time.Duration(r.varint())
		p.Deadline = time.Duration(r.varint())
		p.ForgetAt = time.Duration(r.varint())
		p.Holder = string(r.bytes())
	}
	if len(b) == recordHeader && len(r.b) > 0 && !r.bad && allZero(r.b) {
		r.b = nil // marshal's padding
	}
	if r.bad || len(r.b) != 0 || len(b) < recordHeader {
		return semRecord{}, fmt.Errorf("lease: bad semaphore record (%d bytes)", len(b))
	}
	return s, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// reader reads the pieces of a semaphore record; bad is set once they run out.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.bad = true
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.bad || n > uint64(len(r.b)) {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func loadSem(name string, raw []byte) (semRecord, error) {
	s, err := unmarshalSem(raw)
	if err != nil {
		return s, fmt.Errorf("lock %q: %w", name, err)
	}
	return s, nil
}

// live is the number of permits not expired (a permit past its deadline
// counts until its expiry is applied).
func (s *semRecord) live() int {
	n := 0
	for i := range s.Permits {
		if !s.Permits[i].Expired {
			n++
		}
	}
	return n
}

// next is when something is next due: the earliest live deadline or
// retained permit's ForgetAt.
func (s *semRecord) next() (time.Duration, bool) {
	var at time.Duration
	ok := false
	for _, p := range s.Permits {
		t := p.Deadline
		if p.Expired {
			t = p.ForgetAt
		}
		if !ok || t < at {
			at, ok = t, true
		}
	}
	return at, ok
}

func (s *semRecord) find(token fence.Token) int {
	for i := range s.Permits {
		if s.Permits[i].Token == token {
			return i
		}
	}
	return -1
}

// save stores s (or deletes the record once it has no permits) and puts
// its next due time in the index.
func (m *Manager) saveSem(st Store, name string, s *semRecord) error {
	if len(s.Permits) == 0 {
		m.unsetDue(name)
		return st.DeleteLock(name)
	}
	if err := st.PutLock(name, s.marshal()); err != nil {
		return err
	}
	if at, ok := s.next(); ok {
		m.setDue(name, at)
	}
	return nil
}

// limitMismatch is the refusal of an acquire whose limit is not the lock's.
func limitMismatch(name string, have, want int) error {
	return &fence.Error{Code: fence.CodeLimitMismatch,
		Message: fmt.Sprintf("lock %q has a limit of %d permits while any is held; this acquire asked for %d", name, have, want)}
}

// CheckLimit refuses a limit outside 1..MaxPermits and a lock-delay on a
// semaphore (limit > 1), as fence.CodeBadRequest. Limit 0 is taken as 1
// by callers that default it; CheckLimit sees the defaulted value.
func CheckLimit(limit int, lockDelay time.Duration) error {
	switch {
	case limit < 1 || limit > MaxPermits:
		return fence.Errorf(fence.CodeBadRequest, "limit %d is outside 1..%d", limit, MaxPermits)
	case limit > 1 && lockDelay > 0:
		return fence.Errorf(fence.CodeBadRequest, "lock-delay is not supported on a semaphore (limit %d > 1)", limit)
	}
	return nil
}

// acquireSem is Acquire for req.Limit > 1, or for any acquire of a name
// whose record (raw, nil if none) is a semaphore's.
func (m *Manager) acquireSem(st Store, now time.Duration, req Request, raw []byte) (Grant, error) {
	limit := max(req.Limit, 1)
	if err := CheckLimit(limit, req.LockDelay); err != nil {
		return Grant{}, err
	}
	var s semRecord
	switch {
	case isSem(raw):
		var err error
		if s, err = loadSem(req.Name, raw); err != nil {
			return Grant{}, err
		}
	case raw != nil:
		// A plain lock's record: a semaphore acquire may replace it only
		// when it is free (not held, not in lock-delay).
		r, err := unmarshal(raw)
		if err != nil {
			return Grant{}, fmt.Errorf("lock %q: %w", req.Name, err)
		}
		if r.held(now) || !r.Expired {
			return Grant{}, limitMismatch(req.Name, 1, limit)
		}
		if end := r.delayEnd(); end > now {
			return Grant{}, &fence.Error{Code: fence.CodeLockHeld, RetryAfter: end - now,
				Message: fmt.Sprintf("lock %q is in lock-delay for %v more after token %d expired", req.Name, (end - now).Round(time.Millisecond), r.Token)}
		}
		s.Last = r.Token
	}
	live := s.live()
	switch {
	case live > 0 && s.Limit != limit:
		return Grant{}, limitMismatch(req.Name, s.Limit, limit)
	case live >= limit:
		// Full: the permit that runs out first is the one to wait for.
		first := -1
		for i, p := range s.Permits {
			if !p.Expired && (first < 0 || p.Deadline < s.Permits[first].Deadline) {
				first = i
			}
		}
		p := s.Permits[first]
		return Grant{}, &fence.Error{Code: fence.CodeLockHeld, Holder: p.Holder, Token: p.Token, RetryAfter: max(p.Deadline-now, 0),
			Message: fmt.Sprintf("all %d permits of lock %q are held; the first runs out in %v", limit, req.Name, max(p.Deadline-now, 0).Round(time.Millisecond))}
	case limit == 1:
		// No live permit: a plain acquire turns the name back into a plain lock.
		m.unsetDue(req.Name)
		if err := st.DeleteLock(req.Name); err != nil {
			return Grant{}, err
		}
		return m.Acquire(st, now, req)
	}
	s.Limit = limit
	p := Permit{Token: st.NextToken(), Holder: req.Holder, TTL: req.TTL, Deadline: now + req.TTL}
	s.Last = p.Token
	s.Permits = append(s.Permits, p) // tokens rise: stays in token order
	if err := m.saveSem(st, req.Name, &s); err != nil {
		return Grant{}, err
	}
	m.addHeld(1)
	return Grant{Token: p.Token, TTL: p.TTL, Free: limit - live - 1}, nil
}

// checkSem is the holder check of a semaphore's permit.
func checkSem(s *semRecord, name string, token fence.Token, now time.Duration) (int, error) {
	i := s.find(token)
	switch {
	case i >= 0 && !s.Permits[i].Expired && now < s.Permits[i].Deadline:
		return i, nil
	case i >= 0:
		return -1, &fence.Error{Code: fence.CodeLeaseExpired, Token: token,
			Message: fmt.Sprintf("the permit of token %d on lock %q has expired", token, name)}
	default:
		return -1, &fence.Error{Code: fence.CodeNotHolder,
			Message: fmt.Sprintf("lock %q has no live permit of token %d", name, token)}
	}
}

func (m *Manager) checkSemRaw(name string, raw []byte, token fence.Token, now time.Duration) error {
	s, err := loadSem(name, raw)
	if err != nil {
		return err
	}
	_, err = checkSem(&s, name, token, now)
	return err
}

func (m *Manager) renewSem(st Store, now time.Duration, name string, raw []byte, token fence.Token) (time.Duration, error) {
	s, err := loadSem(name, raw)
	if err != nil {
		return 0, err
	}
	i, err := checkSem(&s, name, token, now)
	if err != nil {
		return 0, err
	}
	s.Permits[i].Deadline = now + s.Permits[i].TTL
	if err := m.saveSem(st, name, &s); err != nil {
		return 0, err
	}
	return s.Permits[i].TTL, nil
}

func (m *Manager) releaseSem(st Store, now time.Duration, name string, raw []byte, token fence.Token) error {
	s, err := loadSem(name, raw)
	if err != nil {
		return err
	}
	i, err := checkSem(&s, name, token, now)
	if err != nil {
		return err
	}
	s.Permits = slices.Delete(s.Permits, i, i+1)
	if err := m.saveSem(st, name, &s); err != nil {
		return err
	}
	m.addHeld(-1)
	return nil
}

// expireSem expires the permits past their deadline at now and forgets
// the expired ones whose retention has passed. freed: a permit became
// free.
func (m *Manager) expireSem(st Store, now time.Duration, name string, raw []byte) (freed, changed bool, err error) {
	s, err := loadSem(name, raw)
	if err != nil {
		return false, false, err
	}
	kept := s.Permits[:0]
	expired := 0
	for _, p := range s.Permits {
		switch {
		case !p.Expired && now >= p.Deadline:
			p.Expired, p.ForgetAt = true, now+Retention
			m.addHeld(-1)
			freed, changed = true, true
		case p.Expired && now >= p.ForgetAt:
			changed = true
			continue
		}
		if p.Expired {
			expired++
		}
		kept = append(kept, p)
	}
	s.Permits = kept
	// Keep at most Limit expired permits, the newest (highest tokens).
	for i := 0; expired > s.Limit && i < len(s.Permits); {
		if s.Permits[i].Expired {
			s.Permits = slices.Delete(s.Permits, i, i+1)
			expired--
			changed = true
			continue
		}
		i++
	}
	if !changed {
		if at, ok := s.next(); ok {
			m.setDue(name, at)
		}
		return false, false, nil
	}
	return freed, true, m.saveSem(st, name, &s)
}

// rearmSem gives every live permit its full TTL from now and every
// retained one its full Retention (G7).
func rearmSem(s *semRecord, now time.Duration) {
	for i := range s.Permits {
		p := &s.Permits[i]
		if p.Expired {
			p.ForgetAt = now + Retention
		} else {
			p.Deadline = now + p.TTL
		}
	}
}

// indexSem puts a semaphore's next due time in the index and counts its
// live permits.
func (m *Manager) indexSem(name string, s *semRecord) {
	m.addHeld(s.live())
	if at, ok := s.next(); ok {
		m.setDue(name, at)
	}
}

// infoSem describes a semaphore: Held if any permit is live, Holder, Token
// and TTL those of the highest live permit (else Token is the latest
// grant), Holders every live permit in token order.
func (m *Manager) infoSem(name string, s *semRecord, now time.Duration) Info {
	sem := &SemInfo{Limit: s.Limit}
	in := Info{Name: name, Waiters: m.waiters(name), Token: s.Last, Sem: sem}
	for _, p := range s.Permits {
		if p.Expired {
			continue
		}
		h := Holder{Holder: p.Holder, Token: p.Token, TTL: max(p.Deadline-now, 0)}
		sem.Holders = append(sem.Holders, h)
		in.Held, in.Holder, in.Token, in.TTL = true, h.Holder, h.Token, h.TTL
	}
	return in
}

// SemInfo is what Info adds for a semaphore.
type SemInfo struct {
	Limit   int
	Holders []Holder // the live permits, in token order
}

// Limit is the lock's number of permits: 1 for a plain lock.
func (in Info) Limit() int {
	if in.Sem == nil {
		return 1
	}
	return in.Sem.Limit
}

// Holders lists the lock's live permits: a plain lock's one holder if it
// is held, a semaphore's every live permit in token order.
func (in Info) Holders() []Holder {
	if in.Sem != nil {
		return in.Sem.Holders
	}
	if !in.Held {
		return nil
	}
	return []Holder{{Holder: in.Holder, Token: in.Token, TTL: in.TTL}}
}

// Full reports whether the lock described has no permit free: a plain
// lock that is held, or a semaphore with Limit permits live.
func (in Info) Full() bool {
	if in.Sem == nil {
		return in.Held
	}
	return len(in.Sem.Holders) >= in.Sem.Limit
}

// CodeLimitMismatch is fence.CodeLimitMismatch.
const CodeLimitMismatch = fence.CodeLimitMismatch
