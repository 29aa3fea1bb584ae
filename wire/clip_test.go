package wire

import (
	"bytes"
	"errors"
	"slices"
	"sort"
	"testing"

	"github.com/fencekv/fencekv"
)

// listOf is a lister over a sorted set of keys, as the engine lists them:
// keys under prefix from start, at most limit, more if one is left.
func listOf(keys []string, calls *int) lister[string] {
	sort.Strings(keys)
	return func(prefix, start []byte, limit int) ([]string, bool, error) {
		*calls++
		var out []string
		for _, k := range keys {
			if !bytes.HasPrefix([]byte(k), prefix) || k < string(start) {
				continue
			}
			if len(out) == limit {
				return out, true, nil
			}
			out = append(out, k)
		}
		return out, false, nil
	}
}

// TestClipped checks clipped against a filter of every key by hand, for
// every start and limit: the same keys, in pages that end where more says.
func TestClipped(t *testing.T) {
	keys := []string{"a", "a/1", "a/2", "ab", "b/1", "b/2", "b/3", "c", "d/1", "d/2", "e"}
	allowed := []string{"a/", "b/", "d/"} // sorted, none a prefix of another
	size := func(string) int { return 1 }
	may := func(k string) bool {
		for _, p := range allowed {
			if bytes.HasPrefix([]byte(k), []byte(p)) {
				return true
			}
		}
		return false
	}
	for _, prefix := range []string{"", "a", "b/", "b/2", "d"} {
		for limit := 1; limit <= 8; limit++ {
			var want []string
			for _, k := range keys {
				if may(k) && bytes.HasPrefix([]byte(k), []byte(prefix)) {
					want = append(want, k)
				}
			}
			var got []string
			var start []byte
			for pages := 0; ; pages++ {
				var calls int
				page, more, err := clipped(allowed, []byte(prefix), start, limit, listOf(keys, &calls), size)
				if err != nil {
					t.Fatalf("prefix %q limit %d: %v", prefix, limit, err)
				}
				if len(page) > limit {
					t.Fatalf("prefix %q limit %d: a page of %d", prefix, limit, len(page))
				}
				got = append(got, page...)
				if !more {
					break
				}
				if len(page) == 0 || pages > 20 {
					t.Fatalf("prefix %q limit %d: more with an empty page, or no end", prefix, limit)
				}
				start = append([]byte(page[len(page)-1]), 0)
			}
			if !slices.Equal(got, want) {
				t.Errorf("prefix %q limit %d: paged %q, want %q", prefix, limit, got, want)
			}
			// more is exact: a last page that is full says more only if a
			// key follows.
			var calls int
			page, more, _ := clipped(allowed, []byte(prefix), nil, len(want), listOf(keys, &calls), size)
			if len(want) > 0 && (more || !slices.Equal(page, want)) {
				t.Errorf("prefix %q, limit = all %d: %q more=%v", prefix, len(want), page, more)
			}
		}
	}
	var calls int
	_, _, err := clipped(allowed, []byte("c"), nil, 0, listOf(keys, &calls), size)
	if !errors.Is(err, fencekv.ErrPermissionDenied) {
		t.Errorf("a prefix no right meets: %v", err)
	}
}

// TestClippedByteBudget: a page made of several listings stops at the
// byte budget like one listing, with at least one item.
func TestClippedByteBudget(t *testing.T) {
	defer func(b int) { maxPageBytes = b }(maxPageBytes)
	maxPageBytes = 10
	keys := []string{"a/1", "a/2", "b/1", "b/2"}
	size := func(string) int { return 4 }
	var calls int
	page, more, err := clipped([]string{"a/", "b/"}, nil, nil, 10, listOf(keys, &calls), size)
	if err != nil || !slices.Equal(page, []string{"a/1", "a/2"}) || !more {
		t.Errorf("a 10-byte budget of 4-byte items: %q more=%v %v, want a/1 a/2 and more", page, more, err)
	}
	maxPageBytes = 1
	page, more, _ = clipped([]string{"a/", "b/"}, nil, nil, 10, listOf(keys, &calls), size)
	if !slices.Equal(page, []string{"a/1"}) || !more {
		t.Errorf("an item over the budget: %q more=%v, want it alone and more", page, more)
	}
}
