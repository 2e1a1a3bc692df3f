package driver

import (
	"math/bits"
	"sync/atomic"
)

// BatchSizeBounds are the upper bounds of the buckets of
// [BatchStats.Sizes]: bucket i counts the round trips that carried more
// than BatchSizeBounds[i-1] and at most BatchSizeBounds[i] calls; the last
// bucket counts the larger ones.
var BatchSizeBounds = [...]int{1, 2, 4, 8, 16, 32, 64, 128}

// BatchStats counts the round trips of [Driver.Apply] a [Store] made since
// it was created. Extend and Get are not batched and not counted.
type BatchStats struct {
	// RoundTrips counts Apply calls.
	RoundTrips uint64
	// Calls counts the calls they carried: Calls / RoundTrips is the mean
	// batch size.
	Calls uint64
	// Sizes[i] counts the round trips whose size falls in bucket i (see
	// [BatchSizeBounds]); Sizes[len(BatchSizeBounds)] those above the last
	// bound.
	Sizes [len(BatchSizeBounds) + 1]uint64
}

// Sub returns the counts of b since an earlier reading a.
func (b BatchStats) Sub(a BatchStats) BatchStats {
	d := BatchStats{RoundTrips: b.RoundTrips - a.RoundTrips, Calls: b.Calls - a.Calls}
	for i := range d.Sizes {
		d.Sizes[i] = b.Sizes[i] - a.Sizes[i]
	}
	return d
}

// Mean is the mean batch size, 0 without round trips.
func (b BatchStats) Mean() float64 {
	if b.RoundTrips == 0 {
		return 0
	}
	return float64(b.Calls) / float64(b.RoundTrips)
}

// A BatchCounter counts round trips and the calls they carry, as a [Store]
// counts its Apply calls: for code that batches calls of its own and
// reports them as [BatchStats]. Its zero value is ready to use; it is safe
// for concurrent use and must not be copied after first use.
type BatchCounter struct {
	roundTrips, calls atomic.Uint64
	sizes             [len(BatchSizeBounds) + 1]atomic.Uint64
}

// Add counts a round trip that carried calls calls.
func (c *BatchCounter) Add(calls int) {
	c.roundTrips.Add(1)
	c.calls.Add(uint64(calls))
	c.sizes[bucket(calls)].Add(1)
}

// Stats returns the counts so far.
func (c *BatchCounter) Stats() BatchStats {
	b := BatchStats{RoundTrips: c.roundTrips.Load(), Calls: c.calls.Load()}
	for i := range b.Sizes {
		b.Sizes[i] = c.sizes[i].Load()
	}
	return b
}

// bucket is the index in BatchStats.Sizes of a round trip of n calls. The
// bounds are the powers of two: bucket i holds (2^(i-1), 2^i].
func bucket(n int) int {
	if n <= 1 {
		return 0
	}
	return min(bits.Len(uint(n-1)), len(BatchSizeBounds))
}

// BatchStats returns the store's batch counts so far.
func (s *Store) BatchStats() BatchStats { return s.stats.Stats() }
