package redisstore

import "time"

// The fresh record and the Complete script, for the benchmark that sends
// the store's commands through go-redis directly (the overhead of the
// store's Go side is measured against it).
var (
	FreshRecord    = freshRecord
	CompleteScript = completeScript
)

// PendingMarks is the number of Completes waiting to be sent
// (Options.CompleteDelay).
func PendingMarks(s *Store) int {
	if s.marks == nil {
		return 0
	}
	s.marks.mu.Lock()
	defer s.marks.mu.Unlock()
	return len(s.marks.pending)
}

// SetCompleteDelay changes the CompleteDelay of a store made with one,
// beyond MaxCompleteDelay if need be, so that a test decides when marks go.
func SetCompleteDelay(s *Store, d time.Duration) { s.opts.CompleteDelay = d }

// OptionsOf is the Options s runs with, defaults applied.
func OptionsOf(s *Store) Options { return s.opts }
