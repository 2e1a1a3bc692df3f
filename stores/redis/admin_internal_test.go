package redisstore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// smallest keeps the smallest strings within its bounds of count and bytes,
// each once, and says whether it left one out.
func TestSmallest_keeps_the_smallest_within_its_bounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ maxKeys, maxBytes, n int }{
		{10, 1 << 20, 5}, {10, 1 << 20, 1000}, {1000, 50, 1000}, {1, 1, 100}, {7, 40, 300},
	} {
		s := smallest{maxKeys: tc.maxKeys, maxBytes: tc.maxBytes, set: map[string]struct{}{}}
		var all []string
		for range tc.n {
			k := fmt.Sprintf("%x", rand.Uint64()>>rand.IntN(64))
			all = append(all, k)
			s.add(k)
			s.add(all[rand.IntN(len(all))]) // a key SCAN returns twice
		}
		slices.Sort(all)
		all = slices.Compact(all)
		var want []string
		bytes := 0
		for _, k := range all {
			if len(want) == tc.maxKeys || (len(want) > 0 && bytes+len(k) > tc.maxBytes) {
				break
			}
			want = append(want, k)
			bytes += len(k)
		}
		if got := s.sorted(); !slices.Equal(got, want) || s.left != (len(want) < len(all)) {
			t.Errorf("%+v: kept %q (left out some: %v), want %q (of %d)", tc, got, s.left, want, len(all))
		}
	}
	// The smallest string stays even when it alone is over the bytes, so
	// that List's page moves on (its Next is the largest kept).
	s := smallest{maxKeys: 3, maxBytes: 2, set: map[string]struct{}{}}
	for _, k := range []string{"cccc", "bbbb", "d", "aaaa"} {
		s.add(k)
	}
	if got := s.sorted(); !slices.Equal(got, []string{"aaaa"}) || !s.left {
		t.Errorf("over the bytes: kept %q (left out some: %v), want [aaaa] and some left out", got, s.left)
	}
}
