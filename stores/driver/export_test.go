package driver

// Queued is the number of calls of s waiting for a round trip.
func Queued(s *Store) int {
	if s.b == nil {
		return 0
	}
	return s.b.Queued()
}

// Bucket exposes bucket to the tests.
var Bucket = bucket
