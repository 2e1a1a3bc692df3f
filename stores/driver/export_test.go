package driver

// Queued is the number of calls of s waiting for a round trip.
func Queued(s *Store) int {
	switch {
	case s.b != nil:
		return s.b.Queued()
	case s.pool != nil:
		return s.pool.Queued()
	}
	return 0
}

// Bucket exposes bucket to the tests.
var Bucket = bucket
