package lease

import (
	"testing"
	"time"
)

// FuzzUnmarshal: a lease record read from the data file either decodes or
// is refused with an error, never a panic; what decodes encodes back to a
// record that decodes the same.
func FuzzUnmarshal(f *testing.F) {
	for _, r := range []Record{
		{},
		{Token: 33, TTL: 10 * time.Second, Deadline: time.Minute, Holder: "host:1:abc"},
		{Expired: true, Token: 1 << 62, LockDelay: time.Second, DelayUntil: 2 * time.Minute, ForgetAt: time.Hour},
	} {
		f.Add(r.marshal())
	}
	f.Add([]byte{})
	f.Add([]byte{recordVersion})
	f.Add([]byte{recordVersion + 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := unmarshal(b)
		if err != nil {
			return
		}
		again, err := unmarshal(r.marshal())
		if err != nil {
			t.Fatalf("unmarshal(marshal(%+v)): %v", r, err)
		}
		if again != r {
			t.Fatalf("round trip changed the record: %+v, then %+v", r, again)
		}
	})
}
