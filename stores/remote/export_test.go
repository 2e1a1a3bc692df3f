package remote

import "time"

// SetDiscoveryRetry sets how long s remembers a failed discovery read
// (DiscoveryRetry by default), so that tests need not wait 5 s.
func SetDiscoveryRetry(s *Store, d time.Duration) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.c.discRetry = d
}
