// Package ladder rounds a wait to one of a fixed set of delays: the delays a
// broker holds (RabbitMQ delay queues with a message TTL, Kafka retry
// topics) are fixed per queue or topic, so a copy of a message waits the
// shortest rung that is at least its wait. Packages inboxamqp and inboxkafka
// share it, so both round the same way.
package ladder

import (
	"fmt"
	"slices"
	"time"
)

// Default is the ladder used when none is configured. It covers
// inboxmw.DefaultBackoff (at most one minute): a wait from 250 ms to a
// minute takes less than 2.5 times the wait (the step from 2 s to 5 s is
// the widest), a shorter one 250 ms; a longer wait takes the top rung and,
// when the copy comes back before its key's backoff has ended, is handed
// off again for the remainder.
var Default = []time.Duration{
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
	10 * time.Second, 20 * time.Second, 30 * time.Second, time.Minute,
}

// Validate checks that rungs is non-empty, strictly increasing, and holds
// whole milliseconds of at least one millisecond (what a broker's TTL can
// express). errInvalid is wrapped by the error.
func Validate(rungs []time.Duration, errInvalid error) error {
	if len(rungs) == 0 {
		return fmt.Errorf("%w: the delay ladder is empty", errInvalid)
	}
	for i, d := range rungs {
		switch {
		case d < time.Millisecond || d%time.Millisecond != 0:
			return fmt.Errorf("%w: delay %s (rung %d) is not a whole number of milliseconds of at least 1 ms", errInvalid, d, i)
		case i > 0 && d <= rungs[i-1]:
			return fmt.Errorf("%w: delays must increase: %s (rung %d) after %s", errInvalid, d, i, rungs[i-1])
		}
	}
	return nil
}

// Round returns the index of the shortest rung of rungs (increasing) that is
// at least d, or the top rung when d is longer than all of them.
func Round(rungs []time.Duration, d time.Duration) int {
	i, _ := slices.BinarySearch(rungs, d)
	return min(i, len(rungs)-1)
}
