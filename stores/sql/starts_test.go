package sqlstore_test

import (
	"testing"

	"github.com/watermill-inbox/inbox/internal/startstest"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// goroutinesPerRoundTrip bounds what one round trip of the SQL store
// starts under the inbox middleware, all of it in database/sql and its
// drivers: database/sql starts a goroutine for each transaction
// (Tx.awaitDone) and each query that returns rows (Rows.awaitDone) under a
// context that can end, and a driver may watch a query's context with
// one more (pgx's ctxwatch). The inbox adds none per message.
const goroutinesPerRoundTrip = 4

// The inbox middleware over PostgreSQL and SQLite, 10,000 messages one
// after the other: the goroutines started, per store round trip (a claim,
// a mark, each an Apply of the store's), are what database/sql and the
// driver start per round trip, a constant; the Inbox and the store start
// none per message. docs/middleware.md gives the figures.
func TestMiddleware_goroutines_per_round_trip(t *testing.T) {
	// Not parallel: the counts are the whole process's.
	for _, b := range backends {
		if b.name != "postgres" && b.name != "sqlite" {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
			before := s.BatchStats()
			g := startstest.Goroutines(t, s, "starts", nil, startstest.Messages)
			trips := s.BatchStats().Sub(before).RoundTrips
			per := float64(g) / float64(max(trips, 1))
			t.Logf("%d messages: %d round trips started %d goroutines, %.2f a round trip, %.2f a message",
				startstest.Messages, trips, g, per, float64(g)/startstest.Messages)
			if trips < startstest.Messages || g > startstest.Bound+goroutinesPerRoundTrip*int64(trips) {
				t.Fatalf("%d round trips started %d goroutines, want at least %d round trips and at most %d goroutines a round trip",
					trips, g, startstest.Messages, goroutinesPerRoundTrip)
			}
		})
	}
}
