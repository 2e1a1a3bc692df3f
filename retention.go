package inbox

import (
	"errors"
	"time"
)

// ErrStale: the message is older than the store's retention (less a
// margin), by its broker timestamp: its key may have expired, so the store
// can no longer tell whether it was processed (a Kafka consumer group
// restarting from the earliest offset after its committed offsets expired,
// an operator resetting offsets, an old backup replayed). The middleware
// returns it, when configured to refuse such messages, without running the
// handler. It is not transient: route it to a poison queue.
var ErrStale = errors.New("inbox: message older than the store's retention: its key can no longer be checked")

// RetentionReporter is implemented by stores that know their retention: how
// long a processed key stays processed. The middleware reads it to tell
// whether a message is too old to be checked ([ErrStale]), so that the
// retention is configured once, on the store. Every store of this project
// implements it; the remote store knows it once it has read the service's
// discovery document, when the service announces it.
type RetentionReporter interface {
	// Retention returns the store's retention, or zero when it is not
	// known (yet).
	Retention() time.Duration
}
