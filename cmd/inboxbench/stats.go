package main

import (
	"slices"
)

// median of xs; 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread returns the smallest and largest of xs.
func spread(xs []float64) (lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	return slices.Min(xs), slices.Max(xs)
}

// rotate returns xs starting at index k mod len(xs): repetition k runs the
// variants in this order, so that no variant always runs first or last.
func rotate[T any](xs []T, k int) []T {
	if len(xs) == 0 {
		return nil
	}
	k %= len(xs)
	return append(slices.Clone(xs[k:]), xs[:k]...)
}
